//! Redis reservation model (DESIGN.md §4). Being written.
