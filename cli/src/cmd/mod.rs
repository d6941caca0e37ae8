pub mod config;
pub mod db;
pub mod health;
pub mod mq;
