//! The manual pages and the shell completion scripts, from the command line's own
//! definition.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;

use super::{exit::exit_status_roff, Cli};

/// Writes the roff manual of `command` (and, into `out_dir`, of each subcommand).
pub(super) fn write_manual(out_dir: Option<PathBuf>) -> anyhow::Result<()> {
    let command = <Cli as clap::CommandFactory>::command();
    match out_dir {
        None => {
            // The exit-status table as a real EXIT STATUS section (with .TP
            // entries), not as the reflowed text of `--help`.
            let mut page = Vec::new();
            clap_mangen::Man::new(command.after_help(None::<&str>)).render(&mut page)?;
            let page = String::from_utf8(page).context("the manual is not UTF-8")?;
            let at = page.find(".SH VERSION").unwrap_or(page.len());
            let mut out = std::io::stdout().lock();
            out.write_all(&page.as_bytes()[..at])?;
            out.write_all(exit_status_roff().as_bytes())?;
            out.write_all(&page.as_bytes()[at..])?;
        }
        Some(dir) => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            clap_mangen::generate_to(command, &dir)
                .with_context(|| format!("writing manual pages to {}", dir.display()))?;
            println!("manual pages written to {}", dir.display());
        }
    }
    Ok(())
}

/// Prints the completion script of `shell`.
pub(super) fn write_completions(shell: clap_complete::Shell) -> anyhow::Result<()> {
    // Rendered into memory first: clap_complete panics on a failed write
    // (a closed pipe), a write here is an ordinary error.
    let mut script = Vec::new();
    let mut command = <Cli as clap::CommandFactory>::command();
    clap_complete::generate(shell, &mut command, "payment-worker", &mut script);
    std::io::stdout().lock().write_all(&script)?;
    Ok(())
}
