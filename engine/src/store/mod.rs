//! Connections to the two stores: the PostgreSQL pool (with migrations and
//! the schema guard) and Redis; and the two PostgreSQL tables every layer
//! above may write on its own transaction: the bearer tokens, the
//! operator audit log, the engine registry and the singleton leases.

pub mod audit;
pub mod db;
pub mod leases;
pub mod redis;
pub mod registry;
pub mod tokens;
