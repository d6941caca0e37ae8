//! The schema against a real PostgreSQL: migrations, the schema guard and
//! the enum mapping.

use anyhow::Result;
use seckill_engine::{
    DbError, MigrationState, OrderId, OrderStatus, RequestId, ReservationId, db, status,
};
use seckill_tests::{Setup, run};
use sqlx::migrate::Migrator;
use std::path::PathBuf;

#[test]
fn enums_match_the_schema() {
    run(Setup::Full, |env| async move {
        for (pg_type, labels) in status::all_pg_enums() {
            let in_db: Vec<String> = sqlx::query_scalar(
                "SELECT e.enumlabel::text FROM pg_enum e JOIN pg_type t ON t.oid = e.enumtypid
                 WHERE t.typname = $1 ORDER BY e.enumsortorder",
            )
            .bind(pg_type)
            .fetch_all(&env.pool)
            .await?;
            assert_eq!(
                in_db, labels,
                "enum {pg_type} differs between Rust and the schema"
            );
        }
        Ok(())
    });
}

#[test]
fn statuses_round_trip_through_sqlx() {
    run(Setup::Full, |env| async move {
        sqlx::query("INSERT INTO activities (activity_id, valid_for_ms, pay_within_ms) VALUES (1, 300000, 900000)")
            .execute(&env.pool)
            .await?;
        sqlx::query("INSERT INTO inventory (activity_id, sku_id, total_stock, available_stock) VALUES (1, 2, 10, 10)")
            .execute(&env.pool)
            .await?;
        let order = OrderId::generate();
        sqlx::query(
            "INSERT INTO orders (order_id, reservation_id, request_id, activity_id, sku_id, user_id, quantity,
                                 status, expires_at, paid_at)
             VALUES ($1, $2, $3, 1, 2, 3, 1, $4, now(), now())",
        )
        .bind(&order)
        .bind(ReservationId::generate())
        .bind(RequestId::generate())
        .bind(OrderStatus::Paid)
        .execute(&env.pool)
        .await?;
        let back: OrderStatus = sqlx::query_scalar("SELECT status FROM orders WHERE order_id = $1")
            .bind(&order)
            .fetch_one(&env.pool)
            .await?;
        assert_eq!(back, OrderStatus::Paid);
        // The one-valid-order-per-user index is enforced by the schema itself.
        let dup = sqlx::query(
            "INSERT INTO orders (order_id, reservation_id, request_id, activity_id, sku_id, user_id, quantity, expires_at)
             VALUES ($1, $2, $3, 1, 2, 3, 1, now())",
        )
        .bind(OrderId::generate())
        .bind(ReservationId::generate())
        .bind(RequestId::generate())
        .execute(&env.pool)
        .await;
        assert!(
            dup.is_err(),
            "a second valid order for the same user must be refused"
        );
        Ok(())
    });
}

fn first_migration_only() -> Result<PathBuf> {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../migrations");
    let mut files: Vec<_> = std::fs::read_dir(&src)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "sql"))
        .collect();
    files.sort();
    let dir = std::env::temp_dir().join(format!("seckill-old-schema-{}", ulid::Ulid::new()));
    std::fs::create_dir_all(&dir)?;
    let first = &files[0];
    std::fs::copy(first, dir.join(first.file_name().unwrap()))?;
    Ok(dir)
}

#[test]
fn an_older_schema_is_refused_with_the_fix_named() {
    run(Setup::EmptyDatabase, |env| async move {
        // Nothing applied.
        let err = db::connect(&env.cfg).await.unwrap_err();
        assert!(matches!(err, DbError::SchemaMissing), "{err}");
        assert!(err.to_string().contains("seckillctl db migrate"), "{err}");

        // An older schema: only the first migration, applied by the real migrator.
        let dir = first_migration_only()?;
        Migrator::new(dir.as_path()).await?.run(&env.pool).await?;
        let err = db::connect(&env.cfg).await.unwrap_err();
        assert!(matches!(err, DbError::SchemaBehind { .. }), "{err}");
        assert!(err.to_string().contains("seckillctl db migrate"), "{err}");
        let rows = db::status(&env.pool).await?;
        assert_eq!(rows[0].state, MigrationState::Applied);
        assert!(rows[1..].iter().all(|r| r.state == MigrationState::Pending));

        // `db migrate` brings it up to date, and a second run applies nothing.
        let applied = db::migrate(&env.pool).await?;
        assert_eq!(applied.len(), rows.len() - 1);
        assert!(db::migrate(&env.pool).await?.is_empty());
        db::connect(&env.cfg).await?;
        std::fs::remove_dir_all(dir)?;
        Ok(())
    });
}

#[test]
fn a_missing_database_names_the_fix() {
    run(Setup::EmptyDatabase, |env| async move {
        let mut cfg = env.cfg.clone();
        cfg.database_url = secrecy::SecretString::from(format!(
            "postgres://postgres@127.0.0.1:5432/no_such_db_{}",
            env.token
        ));
        let err = db::connect(&cfg).await.unwrap_err();
        assert!(matches!(err, DbError::MissingDatabase { .. }), "{err}");
        cfg.database_url = secrecy::SecretString::from("postgres://postgres@127.0.0.1:1/x");
        let err = db::connect(&cfg).await.unwrap_err();
        assert!(matches!(err, DbError::Unreachable { .. }), "{err}");
        assert!(err.to_string().contains("stack.sh up"), "{err}");
        Ok(())
    });
}
