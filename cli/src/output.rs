//! One renderer for every read command: a table for people, `--output json`
//! for scripts. Handlers return output structs; only this module prints
//! (STYLE.md, CLI).

use anyhow::Result;
use comfy_table::{ContentArrangement, Table, presets::UTF8_FULL_CONDENSED};
use serde::Serialize;
use std::io::Write;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    #[default]
    Table,
    Json,
}

/// An output struct that can be shown as a table.
pub trait Tabular: Serialize {
    fn table(&self) -> Table;

    /// Lines printed under the table (hints, verdicts); not part of the JSON.
    fn footer(&self) -> Vec<String> {
        Vec::new()
    }
}

pub fn new_table<I, S>(header: I) -> Table
where
    I: IntoIterator<Item = S>,
    S: Into<comfy_table::Cell>,
{
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(header);
    t
}

pub fn render<T: Tabular>(out: &mut impl Write, format: OutputFormat, value: &T) -> Result<()> {
    match format {
        OutputFormat::Table => {
            writeln!(out, "{}", value.table())?;
            for line in value.footer() {
                writeln!(out, "{line}")?;
            }
        }
        OutputFormat::Json => {
            serde_json::to_writer_pretty(&mut *out, value)?;
            writeln!(out)?;
        }
    }
    Ok(())
}
