//! `seckillctl drill`: the incidents the pipeline exists for, replayed
//! against real servers (docs/architecture.md §13.5).
//!
//! Layout, from the bottom up:
//! - [`catalog`]: the drills, what each injects and promises (pure data);
//! - [`verdict`]: figures and targets to a verdict (pure);
//! - [`procs`]: child processes held by their pid, the only thing a drill signals;
//! - [`proxy`]: the TCP proxy whose switch cuts the broker link;
//! - [`servers`]: the private Redis, NameServer and Broker of a drill run;
//! - [`pg`]: the private PostgreSQL cluster of the failover drill;
//! - [`stage`]: one drill's database, prefixes, engines and crowd;
//! - [`faults`]: each fault, injected and healed;
//! - [`run`]: one drill from sale to verdict;
//! - [`lifecycle`]: the pay-and-cancel half of the cancel drill;
//! - [`chaos`]: seeded schedules of faults over many sales.

pub mod catalog;
pub mod chaos;
pub mod faults;
pub mod lifecycle;
pub mod pg;
pub mod procs;
pub mod proxy;
pub mod run;
pub mod servers;
pub mod stage;
pub mod verdict;

pub use catalog::{DrillName, Spec};
pub use run::{DrillReport, run_one};
pub use servers::{Binaries, Ports, World};
