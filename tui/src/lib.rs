//! `seckill-tui`: the live on-call screen behind `seckillctl tui` (issue: live TUI). Empty until then.
