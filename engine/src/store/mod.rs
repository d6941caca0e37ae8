//! Connections to the two stores: the PostgreSQL pool (with migrations and
//! the schema guard) and Redis.

pub mod db;
pub mod redis;
