//! Order-create consumer (DESIGN.md §7). Being written.
