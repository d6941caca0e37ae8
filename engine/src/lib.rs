//! `seckill-engine`: the headless flash-sale pipeline (DESIGN.md).
//!
//! Redis reserves stock, RocketMQ absorbs the burst, PostgreSQL creates the
//! orders. One module per concern, each with a `//!` doc naming its inputs
//! and outputs:
//!
//! - [`config`]: the one config struct, handed in by the binary.
//! - [`ids`], [`status`]: identifier newtypes and every status enum.
//! - [`db`]: the pool, migrations and the schema guard.
//! - [`redis_conn`]: the Redis connection.
//! - [`mq`]: the message-queue boundary and its rocketmq-rust implementation.
//! - [`health`]: real probes of every component.
//! - [`runtime`]: the process's one runtime, shared with the RocketMQ client.
//!
//! This crate never depends on a UI crate (clap, ratatui, crossterm,
//! comfy-table): `cargo tree -p seckill-engine` proves it.

pub mod activity;
pub mod admission;
pub mod alerts;
pub mod backlog;
pub mod concurrency;
pub mod config;
pub mod consume;
pub mod daemon;
pub mod db;
pub mod dlq;
pub mod facts;
pub mod governor;
pub mod health;
pub mod http;
pub mod ids;
pub mod lifecycle;
pub mod message;
pub mod metrics;
pub mod mq;
pub mod observe;
pub mod order;
pub mod outbox;
pub mod publish;
pub mod reconcile;
pub mod redis_conn;
pub mod reservation;
pub mod reservation_status;
pub mod runtime;
pub mod scale;
pub mod scan;
pub mod stats;
pub mod status;
