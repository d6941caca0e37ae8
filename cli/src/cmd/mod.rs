pub mod activity;
pub mod bench;
pub mod config;
pub mod db;
pub mod engine;
pub mod health;
pub mod mq;
pub mod reconcile;
