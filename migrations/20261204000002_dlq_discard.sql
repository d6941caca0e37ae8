-- A dead message ended on purpose, without its effect (`dlq discard`,
-- docs/architecture.md §9.2): audited in replay_audit as replays are.
ALTER TYPE replay_decision ADD VALUE 'DISCARDED';
