//! `seckillctl order pay|cancel|show`: the payment and cancel levers of
//! docs/architecture.md §8. Both go through the engine with the CLI's
//! token (docs/security.md): a cancel through the operator API (role
//! operator), a payment through the payment callback's own route (role
//! payments, or admin). With `--direct` the same conditional updates run
//! straight against PostgreSQL, audited as direct. The events and the
//! Redis release they queue are published by a running engine's outbox
//! publisher.

use crate::exit::{Exit, UsageError};
use crate::output::{OutputFormat, Tabular, new_table, render};
use anyhow::Result;
use seckill_engine::{
    CancelBody, CancelOutcome, Config, Names, OrderId, OrderRow, PayBody, PayView, db, order,
};
use serde::Serialize;

#[derive(Debug, clap::Subcommand)]
pub enum OrderCmd {
    /// Pay an unpaid order whose pay window is open; says who won if not
    Pay {
        #[arg(long)]
        order_id: OrderId,
        /// The payment provider's id [default: a generated one]
        #[arg(long)]
        payment_id: Option<String>,
        #[arg(long, short, value_enum, default_value_t)]
        output: OutputFormat,
    },
    /// Cancel an unpaid order now, giving its stock back (an operator's call)
    Cancel {
        #[arg(long)]
        order_id: OrderId,
        /// Why, recorded as the order's cancel_reason
        #[arg(long)]
        reason: String,
        #[arg(long, short, value_enum, default_value_t)]
        output: OutputFormat,
    },
    /// Show one order
    Show {
        #[arg(long)]
        order_id: OrderId,
        #[arg(long, short, value_enum, default_value_t)]
        output: OutputFormat,
    },
}

/// The answer of a pay, cancel or show.
#[derive(Debug, Serialize)]
pub struct OrderAnswer {
    /// PAID, ALREADY_PAID, CANCELED, WINDOW_CLOSED, NOOP_<reason>, FOUND or UNKNOWN_ORDER.
    pub outcome: String,
    pub order: Option<OrderRow>,
    #[serde(skip)]
    hint: Option<&'static str>,
}

impl Tabular for OrderAnswer {
    fn table(&self) -> comfy_table::Table {
        let mut t = new_table(["FIELD", "VALUE"]);
        t.add_row(["outcome".to_owned(), self.outcome.clone()]);
        if let Some(o) = &self.order {
            let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
            let ts = |v: Option<chrono::DateTime<chrono::Utc>>| {
                v.map_or_else(|| "-".into(), |t| t.to_rfc3339())
            };
            for (k, v) in [
                ("order_id", o.order_id.to_string()),
                ("reservation_id", o.reservation_id.to_string()),
                (
                    "activity / sku / user",
                    format!("{} / {} / {}", o.activity_id, o.sku_id, o.user_id),
                ),
                ("status", o.status.to_string()),
                ("expires_at", o.expires_at.to_rfc3339()),
                ("payment_id", opt(&o.payment_id)),
                ("paid_at", ts(o.paid_at)),
                ("canceled_at", ts(o.canceled_at)),
                ("cancel_reason", opt(&o.cancel_reason)),
                ("aggregate_version", o.aggregate_version.to_string()),
            ] {
                t.add_row([k.to_owned(), v]);
            }
        }
        t
    }

    fn footer(&self) -> Vec<String> {
        self.hint.map(str::to_owned).into_iter().collect()
    }
}

pub async fn run(cmd: OrderCmd, cfg: &Config) -> Result<Exit> {
    match &cmd {
        OrderCmd::Pay { .. } => crate::access::writable(cfg, "order pay")?,
        OrderCmd::Cancel { .. } => crate::access::writable(cfg, "order cancel")?,
        OrderCmd::Show { .. } => {}
    }
    if !cfg.auth.direct {
        let remote = match &cmd {
            OrderCmd::Cancel {
                order_id,
                reason,
                output,
            } => Some((cancel_remote(cfg, order_id, reason).await?, *output)),
            OrderCmd::Pay {
                order_id,
                payment_id,
                output,
            } => Some((
                pay_remote(cfg, order_id, payment_id.clone()).await?,
                *output,
            )),
            OrderCmd::Show { .. } => None,
        };
        if let Some(((answer, exit), output)) = remote {
            render(&mut std::io::stdout().lock(), output, &answer)?;
            return Ok(exit);
        }
    }
    let pool = db::connect(cfg).await?;
    let names = Names::new(cfg.topic_prefix.clone());
    let ((answer, exit), output) = match cmd {
        OrderCmd::Pay {
            order_id,
            payment_id,
            output,
        } => (pay(&pool, &names, order_id, payment_id).await?, output),
        OrderCmd::Cancel {
            order_id,
            reason,
            output,
        } => (cancel(&pool, &names, order_id, &reason).await?, output),
        OrderCmd::Show { order_id, output } => (show(&pool, order_id).await?, output),
    };
    render(&mut std::io::stdout().lock(), output, &answer)?;
    Ok(exit)
}

/// `order pay`: the conditional payment of docs/architecture.md §8.4.
async fn pay(
    pool: &db::PgPool,
    names: &Names,
    order_id: OrderId,
    payment_id: Option<String>,
) -> Result<(OrderAnswer, Exit)> {
    let payment_id = payment_id.unwrap_or_else(|| format!("pay_{}", ulid::Ulid::new()));
    if let Err(why) = order::check_payment_id(&payment_id) {
        return Err(UsageError(format!("--payment-id: {why}")).into());
    }
    let out = order::pay(
        pool,
        names,
        &order_id,
        &payment_id,
        &crate::access::direct(),
    )
    .await?;
    let Some((exit, hint)) = pay_verdict(out.label()) else {
        return Err(UsageError(format!(
            "no order {order_id}; check the id (`seckillctl order show`)"
        ))
        .into());
    };
    let answer = OrderAnswer {
        outcome: out.label().to_owned(),
        order: out.order().cloned(),
        hint: Some(hint),
    };
    Ok((answer, exit))
}

/// The exit code and hint of a payment's outcome, by its label (the
/// direct path's `PayOutcome::label` and the engine's answer alike);
/// `None` for an unknown order, a usage error (pure). Losing to the cancel
/// warns: the payment side must refuse or refund (docs/architecture.md §8.4).
fn pay_verdict(label: &str) -> Option<(Exit, &'static str)> {
    Some(match label {
        "PAID" => (Exit::Ok, "payment won; ORDER_PAID queued in the outbox"),
        "ALREADY_PAID" => (
            Exit::Ok,
            "already paid earlier; nothing changed (see payment_id)",
        ),
        "CANCELED" => (
            Exit::Warn,
            "the cancel won: the order is canceled and its stock went back; refund the payment",
        ),
        "WINDOW_CLOSED" => (
            Exit::Warn,
            "the pay window closed; the delayed cancel will cancel this order",
        ),
        _ => return None,
    })
}

/// `order pay` through the engine's payment route with the CLI's token
/// (role payments or admin: an operator may not mark money paid,
/// docs/security.md "Roles").
async fn pay_remote(
    cfg: &Config,
    order_id: &OrderId,
    payment_id: Option<String>,
) -> Result<(OrderAnswer, Exit)> {
    if let Some(why) = payment_id
        .as_deref()
        .and_then(|p| order::check_payment_id(p).err())
    {
        return Err(UsageError(format!("--payment-id: {why}")).into());
    }
    let reply = crate::remote::post(
        cfg,
        &format!("/v1/orders/{order_id}/pay"),
        &PayBody { payment_id },
    )
    .await?;
    if !matches!(reply.status, 200 | 409) {
        return Err(crate::remote::usage(&reply));
    }
    let view: PayView = reply.parse()?;
    let Some((exit, hint)) = pay_verdict(&view.outcome) else {
        return Err(crate::remote::usage(&reply));
    };
    Ok((
        OrderAnswer {
            outcome: view.outcome,
            order: view.order,
            hint: Some(hint),
        },
        exit,
    ))
}

/// `order cancel`: an operator cancel, now, on the delayed cancel's path
/// (docs/architecture.md §8.3).
async fn cancel(
    pool: &db::PgPool,
    names: &Names,
    order_id: OrderId,
    reason: &str,
) -> Result<(OrderAnswer, Exit)> {
    let reason = reason.trim();
    if reason.is_empty() {
        return Err(UsageError("--reason must not be empty".into()).into());
    }
    let reason = format!("OPERATOR: {reason}");
    match order::cancel_by(pool, names, &order_id, &reason, &crate::access::direct()).await? {
        CancelOutcome::Canceled { order } => Ok((
            OrderAnswer {
                outcome: "CANCELED".into(),
                order: Some(*order),
                hint: Some(
                    "canceled; stock returned in PostgreSQL, Redis release queued in the outbox",
                ),
            },
            Exit::Ok,
        )),
        CancelOutcome::NoOp { order: None, .. } => {
            Err(UsageError(format!("no order {order_id}; check the id")).into())
        }
        CancelOutcome::NoOp {
            reason,
            order: Some(order),
        } => Ok((
            OrderAnswer {
                outcome: format!("NOOP_{}", reason.as_str()),
                order: Some(*order),
                hint: Some("nothing changed: only an unpaid order can be canceled"),
            },
            Exit::Warn,
        )),
    }
}

/// `order cancel` through the engine's operator API (role operator): the
/// same cancel, audited under the CLI's token.
async fn cancel_remote(
    cfg: &Config,
    order_id: &OrderId,
    reason: &str,
) -> Result<(OrderAnswer, Exit)> {
    if reason.trim().is_empty() {
        return Err(UsageError("--reason must not be empty".into()).into());
    }
    let reply = crate::remote::post(
        cfg,
        &format!("/v1/ops/orders/{order_id}/cancel"),
        &CancelBody {
            reason: reason.trim().to_owned(),
        },
    )
    .await?;
    let (exit, hint) = match reply.status {
        200 => (
            Exit::Ok,
            "canceled; stock returned in PostgreSQL, Redis release queued in the outbox",
        ),
        409 => (
            Exit::Warn,
            "nothing changed: only an unpaid order can be canceled",
        ),
        _ => return Err(crate::remote::usage(&reply)),
    };
    let view: PayView = reply.parse()?;
    Ok((
        OrderAnswer {
            outcome: view.outcome,
            order: view.order,
            hint: Some(hint),
        },
        exit,
    ))
}

/// `order show`.
async fn show(pool: &db::PgPool, order_id: OrderId) -> Result<(OrderAnswer, Exit)> {
    let Some(o) = order::get(pool, &order_id).await? else {
        return Err(UsageError(format!("no order {order_id}; check the id")).into());
    };
    let answer = OrderAnswer {
        outcome: "FOUND".into(),
        order: Some(o),
        hint: None,
    };
    Ok((answer, Exit::Ok))
}
