//! The loop (tokio-console's shape): `select! { biased; messages, SIGTERM,
//! refresh tick }`, `update` returns an [`Effect`], and the loop runs it as
//! a task that answers with a [`Msg`]. The terminal is restored by a drop
//! guard, by a panic hook, and on SIGTERM.

use crate::state::{Component, Data, EffectError, EffectKind, State};
use crate::update::{Effect, Key, Msg, update};
use anyhow::{Context, Result};
use crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use crossterm::terminal::{EnterAlternateScreen, LeaveAlternateScreen};
use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use seckill_engine::{
    ClientRuntime, Config, MessageId, Names, Observation, Observer, ReplayBody, ReservationStore,
    RocketAdmin, Source, Ticket, TicketBody, TicketId, TraceAnchor, TraceSources, Watch, db,
    redis_conn, replay, tickets, trace_story,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;

#[derive(Debug, Clone)]
pub struct Options {
    pub refresh: Duration,
    pub readonly: bool,
}

/// Restores the terminal when dropped, whatever the exit path.
struct TerminalGuard;

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore();
    }
}

fn restore() {
    let _ = crossterm::terminal::disable_raw_mode();
    let _ = crossterm::execute!(
        std::io::stdout(),
        LeaveAlternateScreen,
        crossterm::cursor::Show
    );
}

fn decode(e: Event) -> Option<Msg> {
    let Event::Key(k) = e else { return None };
    if k.kind != KeyEventKind::Press {
        return None;
    }
    if k.modifiers.contains(KeyModifiers::CONTROL) && k.code == KeyCode::Char('c') {
        return Some(Msg::Quit);
    }
    let key = match k.code {
        KeyCode::Char(c) => Key::Char(c),
        KeyCode::Up => Key::Up,
        KeyCode::Down => Key::Down,
        KeyCode::Tab => Key::Tab,
        KeyCode::BackTab => Key::BackTab,
        KeyCode::Enter => Key::Enter,
        KeyCode::Esc => Key::Esc,
        KeyCode::Backspace => Key::Backspace,
        _ => return None,
    };
    Some(Msg::Key(key))
}

/// One refresh: the observation and the open tickets.
fn data(o: Observation, tickets: Vec<tickets::Ticket>) -> Data {
    let cur = &o.sample;
    let component = |source: Source| Component {
        name: source.as_str().to_owned(),
        up: cur.error(source).is_none(),
        error: cur.error(source).map(str::to_owned),
    };
    Data {
        at_ms: cur.at_ms,
        components: vec![
            component(Source::Postgresql),
            component(Source::Redis),
            component(Source::Rocketmq),
            component(Source::Engine),
        ],
        backlog: o.backlog,
        pending: o.pending,
        pg: o.pg,
        engines: o.engines,
        alerts: o.alerts,
        tickets,
        tickets_error: None,
    }
}

/// Samples every `every` until `stop`, sending a [`Msg`] per refresh.
fn spawn_refresher(cfg: Config, rt: Arc<ClientRuntime>, every: Duration, tx: mpsc::Sender<Msg>) {
    tokio::spawn(async move {
        // Rates compare samples RATE_SPAN apart, whatever the refresh.
        let mut watch = Watch::new(Observer::new(&cfg, rt));
        loop {
            let o = watch.next().await;
            let limit = cfg.admin_timeout();
            // The observer's own pool: one connection pool per screen.
            let (open, tickets_error) = match watch.observer().pool() {
                Some(p) => {
                    match tokio::time::timeout(limit, tickets::list_tickets(p, None)).await {
                        Ok(Ok(t)) => (
                            t.into_iter().filter(|t| t.closed_at.is_none()).collect(),
                            None,
                        ),
                        Ok(Err(e)) => (Vec::new(), Some(e.to_string())),
                        Err(_) => (Vec::new(), Some(format!("no answer within {limit:?}"))),
                    }
                }
                None => (Vec::new(), Some("PostgreSQL is not connected".to_owned())),
            };
            let mut d = data(o, open);
            d.tickets_error = tickets_error;
            if tx.send(Msg::Refreshed(Box::new(d))).await.is_err() {
                break;
            }
            tokio::time::sleep(every).await;
        }
        watch.shutdown().await;
    });
}

/// Runs one effect as a task; its answer comes back as a message.
fn execute(effect: Effect, cfg: &Config, rt: Arc<ClientRuntime>, tx: mpsc::Sender<Msg>) {
    let cfg = cfg.clone();
    tokio::spawn(async move {
        let Some(kind) = effect.kind() else { return };
        let pool = match db::connect_unchecked(&cfg).await {
            Ok(p) => p,
            Err(e) => {
                let _ = tx.send(failed(effect, EffectError::new(kind, e))).await;
                return;
            }
        };
        let msg = answer(effect, kind, &cfg, rt, &pool).await;
        pool.close().await;
        let _ = tx.send(msg).await;
    });
}

/// The answer of an effect that could not run at all.
fn failed(effect: Effect, e: EffectError) -> Msg {
    match effect {
        Effect::LoadTicket(ticket_id) => Msg::TicketLoaded {
            ticket_id,
            result: Err(e),
        },
        Effect::Precheck { message_id, .. } => Msg::Verdicts {
            message_id,
            result: Err(e),
        },
        Effect::DryRun { .. } => Msg::DryRun(Err(e)),
        Effect::Replay { .. } => Msg::Replayed(Err(e)),
        Effect::Trace(_) => Msg::Traced(Err(e)),
        Effect::Quit | Effect::Ack(_) | Effect::Assign { .. } => Msg::TicketChanged(Err(e)),
    }
}

/// Runs the effect through the engine's own functions (the CLI's) and
/// turns its result into the message `update` expects.
async fn answer(
    effect: Effect,
    kind: EffectKind,
    cfg: &Config,
    rt: Arc<ClientRuntime>,
    pool: &db::PgPool,
) -> Msg {
    let names = Names::new(cfg.topic_prefix.clone());
    let err = |e: &dyn std::fmt::Display| EffectError::new(kind, e);
    match effect {
        Effect::Quit => Msg::Quit,
        Effect::LoadTicket(ticket_id) => {
            let result = match tickets::get_ticket(pool, &ticket_id).await {
                Ok(t) => tickets::list_entries(pool, None, Some(&ticket_id), None)
                    .await
                    .map(|e| (t, e))
                    .map_err(|e| err(&e)),
                Err(e) => Err(err(&e)),
            };
            Msg::TicketLoaded { ticket_id, result }
        }
        Effect::Precheck { group, message_id } => Msg::Verdicts {
            result: replay::precheck(
                pool,
                &names,
                &group,
                &message_id,
                cfg.dlq.broker_retention(),
            )
            .await
            .map_err(|e| err(&e)),
            message_id,
        },
        // Replays, dry runs included, go through the engine's operator
        // API with the screen's token, as the CLI's do (docs/security.md):
        // the engine sends on its own producer and audits under the token.
        Effect::DryRun { group, message_id } => {
            let body = request(&group, message_id, "TUI dry run", true);
            Msg::DryRun(run_replay(cfg, &body, EffectKind::DryRun).await)
        }
        Effect::Replay {
            group,
            message_id,
            reason,
        } => {
            let body = request(&group, message_id, &reason, false);
            Msg::Replayed(run_replay(cfg, &body, EffectKind::Replay).await)
        }
        // Ticket moves go through the engine's operator API with the
        // screen's token (docs/security.md), as the CLI's do.
        Effect::Ack(ticket_id) => Msg::TicketChanged(
            move_ticket(cfg, &ticket_id, &TicketBody::Ack)
                .await
                .map_err(|e| err(&e)),
        ),
        Effect::Assign { ticket_id, owner } => Msg::TicketChanged(
            move_ticket(cfg, &ticket_id, &TicketBody::Assign { owner })
                .await
                .map_err(|e| err(&e)),
        ),
        // The same reads as `seckillctl trace`: PostgreSQL, Redis, the
        // broker's key index.
        Effect::Trace(message_id) => {
            let store = match redis_conn::connect(cfg).await {
                Ok(conn) => ReservationStore::new(conn, cfg.redis_prefix.clone()),
                Err(e) => return Msg::Traced(Err(err(&e))),
            };
            let admin = RocketAdmin::start(rt, &cfg.namesrv_addr, cfg.admin_timeout())
                .await
                .ok();
            let sources = TraceSources {
                pool,
                store: &store,
                broker: admin.as_ref().map(|a| (a, &names)),
            };
            let anchor = TraceAnchor::Message(message_id.clone());
            let result = trace_story(&sources, &anchor, message_id.as_str())
                .await
                .map_err(|e| err(&e));
            if let Some(a) = admin {
                a.shutdown().await;
            }
            Msg::Traced(result)
        }
    }
}

/// One ticket move through `POST /v1/ops/tickets/{id}`: the ticket as it
/// now stands, or the engine's reason for refusing (a missing or weak
/// token, a move the lifecycle forbids, no engine).
async fn move_ticket(cfg: &Config, id: &TicketId, body: &TicketBody) -> Result<Ticket, String> {
    let reply = seckill_engine::post_op(cfg, &format!("/v1/ops/tickets/{id}"), body)
        .await
        .map_err(|e| e.to_string())?;
    match reply.status {
        200 => reply.parse().map_err(|e| e.to_string()),
        status => Err(format!("{status}: {}", reply.reason())),
    }
}

/// How long the screen waits for a replay's verdict.
const VERIFY_WITHIN: Duration = Duration::from_secs(30);

fn request(group: &str, message_id: MessageId, reason: &str, dry_run: bool) -> ReplayBody {
    ReplayBody {
        message_id,
        group: Some(group.to_owned()),
        reason: reason.to_owned(),
        dry_run,
        force: Vec::new(),
        verify_within_ms: VERIFY_WITHIN.as_millis() as u64,
        // The operator picked this message on screen: a replay of it that
        // went out unverified may be sent again.
        include_replayed: true,
    }
}

/// One replay through `POST /v1/ops/dlq/replay`: the report, or the
/// engine's reason for refusing (a missing or weak token, an unknown
/// message, no engine).
async fn run_replay(
    cfg: &Config,
    body: &ReplayBody,
    kind: EffectKind,
) -> Result<replay::ReplayReport, EffectError> {
    let within = VERIFY_WITHIN + Duration::from_secs(15);
    let reply = seckill_engine::post_op_within(cfg, "/v1/ops/dlq/replay", body, within)
        .await
        .map_err(|e| EffectError::new(kind, e))?;
    match reply.status {
        200 => reply.parse().map_err(|e| EffectError::new(kind, e)),
        status => Err(EffectError::new(
            kind,
            format!("{status}: {}", reply.reason()),
        )),
    }
}

/// Runs the screen until `q`, Ctrl-C or SIGTERM.
pub async fn run(cfg: Config, rt: Arc<ClientRuntime>, opts: Options) -> Result<()> {
    crossterm::terminal::enable_raw_mode()
        .context("the TUI needs a terminal (is stdout a TTY?)")?;
    let _guard = TerminalGuard;
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        restore();
        hook(info);
    }));
    crossterm::execute!(std::io::stdout(), EnterAlternateScreen)?;
    let mut terminal = Terminal::new(CrosstermBackend::new(std::io::stdout()))?;

    let (tx, mut rx) = mpsc::channel::<Msg>(256);
    // Terminal input on its own thread: crossterm's reads block.
    let stop = Arc::new(AtomicBool::new(false));
    {
        let (tx, stop) = (tx.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Ok(true) = event::poll(Duration::from_millis(200))
                    && let Ok(e) = event::read()
                    && let Some(m) = decode(e)
                    && tx.blocking_send(m).is_err()
                {
                    break;
                }
            }
        });
    }
    spawn_refresher(cfg.clone(), rt.clone(), opts.refresh, tx.clone());
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut state = State::new(opts.refresh, opts.readonly);
    let mut clock = tokio::time::interval(opts.refresh);
    loop {
        terminal.draw(|f| crate::ui::render(&state, f))?;
        let msg = tokio::select! {
            biased;
            m = rx.recv() => m.unwrap_or(Msg::Quit),
            _ = sigterm.recv() => Msg::Quit,
            _ = clock.tick() => Msg::Tick(chrono::Utc::now().timestamp_millis()),
        };
        match update(&mut state, msg) {
            Some(Effect::Quit) => break,
            Some(effect) => execute(effect, &cfg, rt.clone(), tx.clone()),
            None => {}
        }
    }
    stop.store(true, Ordering::Relaxed);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossterm::event::{KeyEvent, KeyEventState};

    fn ev(code: KeyCode, modifiers: KeyModifiers, kind: KeyEventKind) -> Event {
        Event::Key(KeyEvent {
            code,
            modifiers,
            kind,
            state: KeyEventState::NONE,
        })
    }

    #[test]
    fn ctrl_c_quits_and_only_presses_count() {
        let press = KeyEventKind::Press;
        assert!(matches!(
            decode(ev(KeyCode::Char('c'), KeyModifiers::CONTROL, press)),
            Some(Msg::Quit)
        ));
        assert!(matches!(
            decode(ev(KeyCode::Char('c'), KeyModifiers::NONE, press)),
            Some(Msg::Key(Key::Char('c')))
        ));
        assert!(matches!(
            decode(ev(KeyCode::BackTab, KeyModifiers::SHIFT, press)),
            Some(Msg::Key(Key::BackTab))
        ));
        assert!(
            decode(ev(
                KeyCode::Char('q'),
                KeyModifiers::NONE,
                KeyEventKind::Release
            ))
            .is_none()
        );
        assert!(decode(ev(KeyCode::F(5), KeyModifiers::NONE, press)).is_none());
        assert!(decode(Event::FocusGained).is_none());
    }
}
