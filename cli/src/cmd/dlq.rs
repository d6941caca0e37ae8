//! `seckillctl dlq list|show|ticket`: the dead messages the governor
//! mirrored and the tickets that own them (docs/architecture.md §9).

use crate::exit::{Exit, UsageError};
use crate::output::{OutputFormat, Tabular, new_table, render};
use anyhow::Result;
use chrono::Utc;
use seckill_engine::{
    ApplyError, BulkReport, BulkRequest, CheckLevel, ClientRuntime, Config, DiscardBody,
    DiscardError, DiscardReport, DiscardRequest, DlqEntry, DlqEntryKey, DlqEntryStatus,
    EntryDetail, MAX_VERIFY_MS, MessageId, Names, RehearseBody, ReplayBody, ReplayCheck as Check,
    ReplayDecision, ReplayError, ReplayOutcome, ReplayReport, ReplayRequest, RocketProducer,
    Sender, Ticket, TicketAction, TicketBody, TicketId, TicketReplayBody, TicketStatus, db, replay,
    tickets,
};
use serde::Serialize;
use std::sync::Arc;

#[derive(Debug, clap::Subcommand)]
pub enum DlqCmd {
    /// Dead messages, newest first
    List {
        #[arg(long)]
        group: Option<String>,
        #[arg(long)]
        ticket: Option<TicketId>,
        /// DEAD, REPLAYING, REPLAYED, VERIFIED or DISCARDED
        #[arg(long)]
        status: Option<DlqEntryStatus>,
        #[arg(long, short, value_enum, default_value_t)]
        output: OutputFormat,
    },
    /// One dead message: body, properties, error history, inbox, order and reservation state
    Show {
        // Any key: also that of a dead message mirrored without a
        // message_id (broker:<id>, docs/architecture.md §9.1).
        #[arg(long)]
        message_id: DlqEntryKey,
        #[arg(long, short, value_enum, default_value_t)]
        output: OutputFormat,
    },
    /// Tickets: one per (consumer group, error class) while not closed
    #[command(subcommand)]
    Ticket(TicketCmd),
    /// Re-send a dead message with its ORIGINAL message_id, after pre-checks
    Replay(ReplayArgs),
    /// End dead messages on purpose, without their effect: fenced by the
    /// inbox (a later copy is a no-op); an order message's reservation is
    /// released and compensated once (the buyer is told no); audited
    Discard(DiscardArgs),
}

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["message_id", "ticket"])))]
pub struct DiscardArgs {
    #[arg(long)]
    message_id: Option<MessageId>,
    /// Every entry of the ticket that is neither verified nor discarded
    #[arg(long, conflicts_with = "group")]
    ticket: Option<TicketId>,
    /// Only when the message is dead in more than one group
    #[arg(long)]
    group: Option<String>,
    /// Why it is ended (recorded in replay_audit)
    #[arg(long)]
    reason: String,
    #[arg(long, short, value_enum, default_value_t)]
    output: OutputFormat,
}

/// What `dlq discard` did to each entry.
#[derive(Debug, Serialize)]
struct Discarded {
    discarded: Vec<DiscardReport>,
    /// (message id, why it was not discarded)
    refused: Vec<(String, String)>,
}

impl Tabular for Discarded {
    fn table(&self) -> comfy_table::Table {
        let mut t = new_table(["MESSAGE ID", "GROUP", "AUDIT", "DETAIL"]);
        for d in &self.discarded {
            t.add_row([
                d.message_id.to_string(),
                d.consumer_group.clone(),
                d.audit_id.to_string(),
                d.detail.clone(),
            ]);
        }
        for (id, why) in &self.refused {
            t.add_row([
                id.clone(),
                "-".into(),
                "-".into(),
                format!("REFUSED: {why}"),
            ]);
        }
        t
    }

    fn footer(&self) -> Vec<String> {
        vec![format!(
            "{} discarded, {} refused",
            self.discarded.len(),
            self.refused.len()
        )]
    }
}

/// A ticket move as the operator API's body.
fn body_of(a: &TicketAction) -> TicketBody {
    match a {
        TicketAction::Ack => TicketBody::Ack,
        TicketAction::Assign { owner } => TicketBody::Assign {
            owner: owner.clone(),
        },
        TicketAction::Resolve => TicketBody::Resolve,
        TicketAction::Close { resolution, force } => TicketBody::Close {
            resolution: resolution.clone(),
            force: *force,
        },
    }
}

/// Discards one entry through the engine's operator API: the report, or
/// the refusal (a 4xx: unknown, ambiguous, refused by the entry's state).
async fn discard_remote(
    cfg: &Config,
    req: &DiscardRequest,
) -> Result<std::result::Result<DiscardReport, (u16, String)>> {
    let reply = crate::remote::post(
        cfg,
        "/v1/ops/dlq/discard",
        &DiscardBody {
            message_id: req.message_id.clone(),
            group: req.group.clone(),
            reason: req.reason.clone(),
        },
    )
    .await?;
    Ok(match reply.status {
        200 => Ok(reply.parse()?),
        status => Err((status, reply.reason())),
    })
}

async fn discard_cmd(args: DiscardArgs, cfg: &Config, pool: &db::PgPool) -> Result<Exit> {
    let names = Names::new(cfg.topic_prefix.clone());
    let targets: Vec<(MessageId, Option<String>)> = match (&args.message_id, &args.ticket) {
        (Some(id), _) => vec![(id.clone(), args.group.clone())],
        (None, Some(ticket)) => {
            if tickets::get_ticket(pool, ticket).await?.is_none() {
                return Err(UsageError(format!(
                    "no ticket {ticket}; list them with `seckillctl dlq ticket list`"
                ))
                .into());
            }
            tickets::list_entries(pool, None, Some(ticket), None)
                .await?
                .into_iter()
                .filter(|e| {
                    !matches!(
                        e.status,
                        DlqEntryStatus::Verified | DlqEntryStatus::Discarded
                    )
                })
                .filter_map(|e| match e.message_id {
                    DlqEntryKey::Message(id) => Some((id, Some(e.consumer_group))),
                    _ => None,
                })
                .collect()
        }
        (None, None) => unreachable!("clap requires --message-id or --ticket"),
    };
    let mut out = Discarded {
        discarded: Vec::new(),
        refused: Vec::new(),
    };
    for (id, group) in targets {
        let req = DiscardRequest {
            message_id: id.clone(),
            group,
            reason: args.reason.clone(),
            // The engine names the token's owner; this actor is the
            // break glass's (docs/security.md).
            actor: crate::access::direct(),
        };
        if !cfg.auth.direct {
            match discard_remote(cfg, &req).await? {
                Ok(r) => out.discarded.push(r),
                // As the direct path: the entry's own refusal is listed; an
                // unknown or ambiguous id asked for by itself is bad input.
                Err((409, why)) => out.refused.push((id.to_string(), why)),
                Err((_, why)) if args.ticket.is_none() => {
                    return Err(UsageError(why).into());
                }
                Err((_, why)) => out.refused.push((id.to_string(), why)),
            }
            continue;
        }
        match seckill_engine::discard(pool, &names, &req).await {
            Ok(r) => out.discarded.push(r),
            Err(DiscardError::Db(e)) => return Err(e.into()),
            Err(
                e @ (DiscardError::NoReason
                | DiscardError::Unknown(_)
                | DiscardError::Ambiguous { .. }),
            ) if args.ticket.is_none() => {
                return Err(UsageError(e.to_string()).into());
            }
            Err(e) => out.refused.push((id.to_string(), e.to_string())),
        }
    }
    render(&mut std::io::stdout().lock(), args.output, &out)?;
    Ok(if out.refused.is_empty() {
        Exit::Ok
    } else {
        Exit::Warn
    })
}

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["message_id", "ticket"])))]
pub struct ReplayArgs {
    /// One dead message
    // Text, parsed in `replay_one` after clap's own checks (so a bad
    // --force is reported first), and refused unless it is a message_id.
    #[arg(long)]
    message_id: Option<String>,
    /// Every DEAD entry of a ticket, as of now: canaries first, then the rest at --rate
    #[arg(long, conflicts_with = "group")]
    ticket: Option<TicketId>,
    /// With --ticket: sends per second at most, e.g. 20/s
    #[arg(long, value_parser = crate::parse::rate, default_value = "10/s")]
    rate: f64,
    /// With --ticket: entries replayed and verified one by one before the rest
    #[arg(long, default_value_t = 1)]
    canary: usize,
    /// Why this replay is safe now (recorded in replay_audit; not needed to --rehearse)
    #[arg(long, required_unless_present = "rehearse")]
    reason: Option<String>,
    /// Run the order consumer's transaction for the message inside
    /// PostgreSQL, show every effect it would have, then roll it back:
    /// nothing is sent and nothing is kept
    #[arg(long, conflicts_with_all = ["ticket", "dry_run", "force"])]
    rehearse: bool,
    /// Only when the message is dead in more than one group
    #[arg(long)]
    group: Option<String>,
    /// Run the pre-checks and record them; send nothing
    #[arg(long)]
    dry_run: bool,
    /// Turn a blocking check into a warning: inbox, order, compensation or ledger (repeatable)
    #[arg(long)]
    force: Vec<Check>,
    /// How long to wait for the consumer's verdict
    #[arg(long, value_parser = crate::parse::duration, default_value = "60s")]
    verify_within: std::time::Duration,
    /// Send again entries whose earlier replay went out and was not verified
    #[arg(long)]
    include_replayed: bool,
    #[arg(long, short, value_enum, default_value_t)]
    output: OutputFormat,
}

impl Tabular for ReplayReport {
    fn table(&self) -> comfy_table::Table {
        let mut t = new_table(["CHECK", "VERDICT", "EVIDENCE"]);
        for v in &self.checks {
            t.add_row([
                v.check.to_string(),
                format!("{:?}", v.level).to_uppercase(),
                v.evidence.clone(),
            ]);
        }
        t
    }

    fn footer(&self) -> Vec<String> {
        vec![format!(
            "{} {} ({}, replay #{}): decision {}, outcome {}{}",
            self.replay_id_str(),
            self.message_id,
            self.consumer_group,
            self.replay_count,
            self.decision,
            self.outcome,
            if self.detail.is_empty() {
                String::new()
            } else {
                format!("; {}", self.detail)
            }
        )]
    }
}

#[derive(Debug, clap::Subcommand)]
pub enum TicketCmd {
    List {
        /// OPEN, ACKED, FIXED, REPLAYING, VERIFIED or CLOSED
        #[arg(long)]
        status: Option<TicketStatus>,
        #[arg(long, short, value_enum, default_value_t)]
        output: OutputFormat,
    },
    Show {
        #[arg(long)]
        ticket: TicketId,
        #[arg(long, short, value_enum, default_value_t)]
        output: OutputFormat,
    },
    /// OPEN → ACKED
    Ack {
        #[arg(long)]
        ticket: TicketId,
        #[arg(long, short, value_enum, default_value_t)]
        output: OutputFormat,
    },
    /// Set the owner (acknowledges an OPEN ticket)
    Assign {
        #[arg(long)]
        ticket: TicketId,
        #[arg(long)]
        owner: String,
        #[arg(long, short, value_enum, default_value_t)]
        output: OutputFormat,
    },
    /// The fault is fixed: → FIXED, ready to replay
    Resolve {
        #[arg(long)]
        ticket: TicketId,
        #[arg(long, short, value_enum, default_value_t)]
        output: OutputFormat,
    },
    /// → CLOSED, saying what was done
    Close {
        #[arg(long)]
        ticket: TicketId,
        #[arg(long)]
        resolution: String,
        /// Close it although some entries are neither verified nor discarded
        #[arg(long)]
        force: bool,
        #[arg(long, short, value_enum, default_value_t)]
        output: OutputFormat,
    },
}

fn ticket_or_dash(t: Option<&TicketId>) -> String {
    t.map_or_else(|| "-".into(), TicketId::to_string)
}

fn age(t: chrono::DateTime<Utc>) -> String {
    let s = (Utc::now() - t).num_seconds().max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        _ => format!("{}h{}m", s / 3600, s % 3600 / 60),
    }
}

#[derive(Serialize)]
#[serde(transparent)]
struct Entries(Vec<DlqEntry>);

impl Tabular for Entries {
    fn table(&self) -> comfy_table::Table {
        let mut t = new_table([
            "GROUP",
            "MESSAGE ID",
            "TICKET",
            "CLASS",
            "ATTEMPTS",
            "STATUS",
            "DEAD FOR",
        ]);
        for e in &self.0 {
            t.add_row([
                e.consumer_group.clone(),
                e.message_id.to_string(),
                ticket_or_dash(e.ticket_id.as_ref()),
                e.error_class.to_string(),
                e.delivery_attempts.to_string(),
                e.status.to_string(),
                age(e.dead_at),
            ]);
        }
        t
    }

    fn footer(&self) -> Vec<String> {
        vec![format!("{} dead message(s)", self.0.len())]
    }
}

#[derive(Serialize)]
#[serde(transparent)]
struct Details(Vec<EntryDetail>);

impl Tabular for Details {
    fn table(&self) -> comfy_table::Table {
        let mut t = new_table(["FIELD", "VALUE"]);
        for d in &self.0 {
            let e = &d.entry;
            let rows = [
                ("group", e.consumer_group.clone()),
                ("message_id", e.message_id.to_string()),
                ("original topic", e.original_topic.clone()),
                ("ticket", ticket_or_dash(e.ticket_id.as_ref())),
                (
                    "status",
                    format!("{} (replays {})", e.status, e.replay_count),
                ),
                ("error class", e.error_class.to_string()),
                ("delivery attempts", e.delivery_attempts.to_string()),
                (
                    "dead at",
                    format!("{} ({} ago)", e.dead_at.to_rfc3339(), age(e.dead_at)),
                ),
                (
                    "inbox",
                    d.inbox
                        .as_ref()
                        .map_or("none (never applied)".into(), |(s, c)| {
                            format!("{s} {}", c.as_deref().unwrap_or(""))
                        }),
                ),
                (
                    "order",
                    d.order_status
                        .map_or_else(|| "none".into(), |s| s.to_string()),
                ),
                (
                    "reservation",
                    d.reservation_outcome
                        .map_or_else(|| "not decided".into(), |o| o.to_string()),
                ),
                ("properties", e.properties.to_string()),
                ("body", d.body.clone()),
            ];
            for (k, v) in rows {
                t.add_row([k.to_owned(), v]);
            }
            for f in &d.failures {
                t.add_row([
                    format!("failure (attempt {})", f.delivery_attempt),
                    format!(
                        "{} {}: {}",
                        f.failed_at.to_rfc3339(),
                        f.error_class,
                        f.detail
                    ),
                ]);
            }
        }
        t
    }
}

#[derive(Serialize)]
#[serde(transparent)]
struct Tickets(Vec<Ticket>);

impl Tabular for Tickets {
    fn table(&self) -> comfy_table::Table {
        let mut t = new_table([
            "TICKET", "GROUP", "CLASS", "STATUS", "OWNER", "MESSAGES", "DEAD", "AGE",
        ]);
        for k in &self.0 {
            t.add_row([
                k.ticket_id.to_string(),
                k.consumer_group.clone(),
                k.error_class.to_string(),
                k.status.to_string(),
                k.owner.clone().unwrap_or_else(|| "-".into()),
                k.messages.to_string(),
                k.dead.to_string(),
                age(k.opened_at),
            ]);
        }
        t
    }

    fn footer(&self) -> Vec<String> {
        let open = self
            .0
            .iter()
            .filter(|t| t.status != TicketStatus::Closed)
            .count();
        vec![format!("{open} ticket(s) not closed")]
    }
}

#[derive(Serialize)]
struct TicketDetail {
    ticket: Ticket,
    messages: Vec<DlqEntry>,
}

impl Tabular for TicketDetail {
    fn table(&self) -> comfy_table::Table {
        Entries(self.messages.clone()).table()
    }

    fn footer(&self) -> Vec<String> {
        let k = &self.ticket;
        vec![format!(
            "ticket {} ({} / {}): {}, owner {}, {} message(s), {} still dead{}",
            k.ticket_id,
            k.consumer_group,
            k.error_class,
            k.status,
            k.owner.as_deref().unwrap_or("-"),
            k.messages,
            k.dead,
            k.resolution
                .as_deref()
                .map(|r| format!("; resolution: {r}"))
                .unwrap_or_default()
        )]
    }
}

pub async fn run(cmd: DlqCmd, cfg: &Config, rt: Arc<ClientRuntime>) -> Result<Exit> {
    // A read-only CLI refuses before connecting; a dry run changes nothing.
    match &cmd {
        DlqCmd::Replay(a) if !a.dry_run => crate::access::writable(cfg, "dlq replay")?,
        DlqCmd::Discard(_) => crate::access::writable(cfg, "dlq discard")?,
        _ => {}
    }
    let pool = db::connect(cfg).await?;
    if let DlqCmd::Replay(args) = cmd {
        return replay_one(args, cfg, &pool, rt).await;
    }
    if let DlqCmd::Discard(args) = cmd {
        return discard_cmd(args, cfg, &pool).await;
    }
    let out = &mut std::io::stdout().lock();
    match cmd {
        DlqCmd::List {
            group,
            ticket,
            status,
            output,
        } => {
            let entries =
                tickets::list_entries(&pool, group.as_deref(), ticket.as_ref(), status).await?;
            render(out, output, &Entries(entries))
        }
        DlqCmd::Show { message_id, output } => {
            let found = tickets::show_entries(&pool, &message_id).await?;
            if found.is_empty() {
                return Err(UsageError(format!(
                    "no dead message {message_id}; list them with `seckillctl dlq list`"
                ))
                .into());
            }
            render(out, output, &Details(found))
        }
        DlqCmd::Ticket(TicketCmd::List { status, output }) => render(
            out,
            output,
            &Tickets(tickets::list_tickets(&pool, status).await?),
        ),
        DlqCmd::Ticket(TicketCmd::Show { ticket, output }) => {
            let Some(t) = tickets::get_ticket(&pool, &ticket).await? else {
                return Err(UsageError(format!(
                    "no ticket {ticket}; list them with `seckillctl dlq ticket list`"
                ))
                .into());
            };
            let messages = tickets::list_entries(&pool, None, Some(&ticket), None).await?;
            render(
                out,
                output,
                &TicketDetail {
                    ticket: t,
                    messages,
                },
            )
        }
        DlqCmd::Ticket(cmd) => {
            let (ticket, action, output) = match cmd {
                TicketCmd::Ack { ticket, output } => (ticket, TicketAction::Ack, output),
                TicketCmd::Assign {
                    ticket,
                    owner,
                    output,
                } => (ticket, TicketAction::Assign { owner }, output),
                TicketCmd::Resolve { ticket, output } => (ticket, TicketAction::Resolve, output),
                TicketCmd::Close {
                    ticket,
                    resolution,
                    force,
                    output,
                } => (ticket, TicketAction::Close { resolution, force }, output),
                TicketCmd::List { .. } | TicketCmd::Show { .. } => unreachable!("handled above"),
            };
            crate::access::writable(cfg, action.command())?;
            if !cfg.auth.direct {
                let reply = crate::remote::post(
                    cfg,
                    &format!("/v1/ops/tickets/{ticket}"),
                    &body_of(&action),
                )
                .await?;
                if reply.status != 200 {
                    return Err(crate::remote::usage(&reply));
                }
                return render(out, output, &Tickets(vec![reply.parse::<Ticket>()?]))
                    .map(|()| Exit::Ok);
            }
            let t = match tickets::apply(&pool, &ticket, &action, &crate::access::direct()).await {
                Ok(t) => t,
                Err(ApplyError::Ticket(e)) => return Err(UsageError(e.to_string()).into()),
                Err(ApplyError::Db(e)) => return Err(e.into()),
            };
            render(out, output, &Tickets(vec![t]))
        }
        DlqCmd::Replay(_) | DlqCmd::Discard(_) => unreachable!("handled above"),
    }
    .map(|()| Exit::Ok)
}

/// A database failure stays a failure; everything else is the operator's
/// input (an unknown id or ticket, an empty reason): exit 64.
fn replay_error(e: ReplayError) -> anyhow::Error {
    match e {
        ReplayError::Db(_) => e.into(),
        other => UsageError(other.to_string()).into(),
    }
}

impl Tabular for BulkReport {
    fn table(&self) -> comfy_table::Table {
        let mut t = new_table(["MESSAGE ID", "DECISION", "OUTCOME", "REPLAY", "DETAIL"]);
        for r in &self.entries {
            t.add_row([
                r.message_id.to_string(),
                r.decision.to_string(),
                r.outcome.to_string(),
                r.replay_id_str().to_owned(),
                r.detail.clone(),
            ]);
        }
        t
    }

    fn footer(&self) -> Vec<String> {
        let verified = self
            .entries
            .iter()
            .filter(|r| r.outcome == ReplayOutcome::Verified)
            .count();
        let mut lines = vec![format!(
            "ticket {}: {} entr(ies) to replay in the snapshot, {verified} verified; {} not sent (below)",
            self.ticket_id,
            self.snapshot,
            self.skipped.len()
        )];
        for k in &self.skipped {
            lines.push(format!(
                "{} {} ({}, {}): {}",
                if k.done { "done   " } else { "UNDONE " },
                k.message_id,
                k.consumer_group,
                k.status,
                k.reason
            ));
        }
        if let Some(h) = &self.halted {
            lines.push(format!("HALTED: {h}"));
        }
        if !self.unreplayable.is_empty() {
            let keys: Vec<String> = self.unreplayable.iter().map(|k| k.to_string()).collect();
            lines.push(format!(
                "NOT REPLAYABLE: {} DEAD entr(ies) mirrored without a message_id ({}); inspect them with `seckillctl dlq show --message-id KEY`",
                keys.len(),
                keys.join(", ")
            ));
        }
        lines
    }
}

impl Tabular for replay::Rehearsal {
    fn table(&self) -> comfy_table::Table {
        let mut t = new_table(["EFFECT", "WOULD BE"]);
        if let Some(o) = &self.order {
            t.add_row([
                "order".to_owned(),
                format!("{} {} (pay by {})", o.order_id, o.status, o.expires_at),
            ]);
        }
        if let Some(r) = self.reservation_outcome {
            t.add_row(["reservation".to_owned(), r.to_string()]);
        }
        if let Some((sku, before, after)) = self.stock {
            t.add_row([
                format!("stock sku {sku}"),
                format!("{before} -> {after} ({:+})", after - before),
            ]);
        }
        for l in &self.ledger {
            t.add_row(["ledger".to_owned(), format!("{} {:+}", l.reason, l.delta)]);
        }
        for (source, status) in &self.compensations {
            t.add_row(["compensation".to_owned(), format!("{source} {status}")]);
        }
        for o in &self.outbox {
            t.add_row([
                format!("outbox {}", o.tag),
                format!(
                    "{} key {}{}",
                    o.topic,
                    o.message_key,
                    o.deliver_at
                        .map(|at| format!(" at {at}"))
                        .unwrap_or_default()
                ),
            ]);
        }
        t
    }

    fn footer(&self) -> Vec<String> {
        let verdict = match &self.verdict {
            replay::RehearsedVerdict::Created(id) => format!("would create order {id}"),
            replay::RehearsedVerdict::Rejected(r) => {
                format!("would reject the reservation ({r}) and compensate it once")
            }
            replay::RehearsedVerdict::AlreadyApplied(why) => format!("would change nothing: {why}"),
            replay::RehearsedVerdict::Fails(e) => format!("would FAIL now: {e}"),
        };
        vec![
            format!("{} ({}): {verdict}", self.message_id, self.consumer_group),
            "rehearsal: the transaction was rolled back; nothing was sent and nothing was kept"
                .into(),
        ]
    }
}

/// Every entry of the run ended where it should (pure).
fn bulk_clean(report: &BulkReport) -> bool {
    // An entry without a message_id stays DEAD: the run did not finish the ticket.
    report.halted.is_none()
        && report.unreplayable.is_empty()
        && report.skipped.iter().all(|k| k.done)
        && report.entries.iter().all(|r| {
            r.outcome == ReplayOutcome::Verified
                || r.decision == ReplayDecision::DryRun
                || (r.decision == ReplayDecision::Blocked
                    && r.checks.iter().any(|v| v.level == CheckLevel::Block))
        })
}

async fn replay_one(
    args: ReplayArgs,
    cfg: &Config,
    pool: &db::PgPool,
    rt: Arc<ClientRuntime>,
) -> Result<Exit> {
    let names = Names::new(cfg.topic_prefix.clone());
    // Only a message_id can be replayed (docs/architecture.md §9.4): a key
    // that is not one is the operator's to fix (exit 64), found before the
    // broker is touched. clap makes --ticket and --message-id exclusive.
    let message_id = match (&args.ticket, &args.message_id) {
        (None, raw) => Some(
            DlqEntryKey::from(raw.clone().unwrap_or_default())
                .replayable()
                .map_err(|e| UsageError(e.to_string()))?
                .clone(),
        ),
        (Some(_), _) => None,
    };
    let output = args.output;
    if args.rehearse {
        let id = message_id.expect("clap: --rehearse conflicts with --ticket");
        let r = if cfg.auth.direct {
            replay::rehearse(pool, &names, &id, args.group.as_deref())
                .await
                .map_err(|e| match e {
                    replay::RehearseError::Db(e) => anyhow::Error::from(e),
                    other => UsageError(other.to_string()).into(),
                })?
        } else {
            let body = RehearseBody {
                message_id: id,
                group: args.group.clone(),
            };
            crate::remote::answer(crate::remote::post(cfg, "/v1/ops/dlq/rehearse", &body).await?)?
        };
        render(&mut std::io::stdout().lock(), output, &r)?;
        // A rehearsal that shows the replay would fail is the answer asked
        // for, not an error of the command; it warns.
        return Ok(match r.verdict {
            replay::RehearsedVerdict::Fails(_) => Exit::Warn,
            _ => Exit::Ok,
        });
    }
    if !cfg.auth.direct {
        return replay_remote(args, message_id, cfg, pool).await;
    }
    let producer = RocketProducer::start(
        rt,
        &cfg.namesrv_addr,
        &names.producer_group_of(Sender::CliReplay),
        std::time::Duration::from_millis(cfg.mq.send_timeout_ms),
        cfg.mq.send_retries,
    )
    .await?;
    let exit = match (message_id, args.ticket) {
        (Some(message_id), _) => {
            let req = ReplayRequest {
                message_id,
                group: args.group,
                reason: args.reason.unwrap_or_default(),
                actor: crate::access::direct(),
                dry_run: args.dry_run,
                force: args.force,
                verify_within: args.verify_within,
                include_replayed: args.include_replayed,
                retention: cfg.dlq.broker_retention(),
            };
            let result = replay::replay(pool, &names, &producer, &req).await;
            producer.shutdown().await;
            single_exit(&result.map_err(replay_error)?, output)?
        }
        (None, ticket) => {
            let req = BulkRequest {
                ticket: ticket.expect("clap requires --ticket or --message-id"),
                reason: args.reason.unwrap_or_default(),
                actor: crate::access::direct(),
                dry_run: args.dry_run,
                force: args.force,
                rate_per_s: args.rate,
                canary: args.canary,
                verify_within: args.verify_within,
                include_replayed: args.include_replayed,
                retention: cfg.dlq.broker_retention(),
            };
            let result = replay::replay_ticket(pool, &names, &producer, &req).await;
            producer.shutdown().await;
            bulk_exit(&result.map_err(replay_error)?, output)?
        }
    };
    Ok(exit)
}

/// The replay through the engine's operator API (role operator), sent on
/// the engine's producer and audited under the CLI's token. The request is
/// held while the engine verifies, so it may take as long as the direct
/// path would.
async fn replay_remote(
    args: ReplayArgs,
    message_id: Option<MessageId>,
    cfg: &Config,
    pool: &db::PgPool,
) -> Result<Exit> {
    let verify_ms = u64::try_from(args.verify_within.as_millis()).unwrap_or(u64::MAX);
    if verify_ms > MAX_VERIFY_MS {
        return Err(UsageError(format!(
            "--verify-within {:?} is over the operator API's cap of {} s; use --direct for longer",
            args.verify_within,
            MAX_VERIFY_MS / 1000
        ))
        .into());
    }
    let slack = std::time::Duration::from_secs(30);
    let reason = args.reason.unwrap_or_default();
    if let Some(message_id) = message_id {
        let body = ReplayBody {
            message_id,
            group: args.group,
            reason,
            dry_run: args.dry_run,
            force: args.force,
            verify_within_ms: verify_ms,
            include_replayed: args.include_replayed,
        };
        let within = args.verify_within + slack;
        let reply = crate::remote::post_within(cfg, "/v1/ops/dlq/replay", &body, within).await?;
        return single_exit(&crate::remote::answer(reply)?, args.output);
    }
    let ticket = args.ticket.expect("clap requires --ticket or --message-id");
    // The run's length: every DEAD entry at the rate, each canary's verify,
    // and the verify of the rest after the last send (§9.3).
    let dead = tickets::list_entries(pool, None, Some(&ticket), Some(DlqEntryStatus::Dead))
        .await?
        .len();
    // Saturating, and at most a day: a hostile --canary must not overflow.
    let sending = std::time::Duration::try_from_secs_f64(dead as f64 / args.rate)
        .unwrap_or(std::time::Duration::MAX);
    let canaries = u32::try_from(args.canary.saturating_add(1)).unwrap_or(u32::MAX);
    let within = sending
        .saturating_add(args.verify_within.saturating_mul(canaries))
        .saturating_add(slack)
        .min(std::time::Duration::from_secs(86_400));
    let body = TicketReplayBody {
        reason,
        dry_run: args.dry_run,
        force: args.force,
        rate_per_s: args.rate,
        canary: args.canary,
        verify_within_ms: verify_ms,
        include_replayed: args.include_replayed,
    };
    eprintln!(
        "replaying ticket {ticket} through the engine: {dead} DEAD entr(ies) at {}/s; this waits up to {within:?}",
        args.rate
    );
    let path = format!("/v1/ops/tickets/{ticket}/replay");
    let reply = crate::remote::post_within(cfg, &path, &body, within).await?;
    bulk_exit(&crate::remote::answer(reply)?, args.output)
}

/// Shows one replay; blocked warns, sent and verified (or a dry run) is ok.
fn single_exit(report: &ReplayReport, output: OutputFormat) -> Result<Exit> {
    render(&mut std::io::stdout().lock(), output, report)?;
    Ok(match (report.decision, report.outcome) {
        (ReplayDecision::Blocked, _) => Exit::Warn,
        (ReplayDecision::DryRun, _) | (_, ReplayOutcome::Verified) => Exit::Ok,
        _ => Exit::Failure,
    })
}

/// Shows a ticket's replay: 0 when every entry ended verified, deliberately
/// blocked by a pre-check, or was already done (verified or discarded); 1
/// when any is left undone, listed (issue 17: nothing is skipped silently).
fn bulk_exit(report: &BulkReport, output: OutputFormat) -> Result<Exit> {
    render(&mut std::io::stdout().lock(), output, report)?;
    Ok(if bulk_clean(report) {
        Exit::Ok
    } else {
        Exit::Warn
    })
}
