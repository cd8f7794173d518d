//! Durations on the command line (`30s`, `1500ms`, `5m`, `24h`) and their ceiling.

use std::time::Duration;

/// Parse `30s`, `1500ms`, `5m`, `24h` (clap value parser).
pub fn parse_duration(value: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(value)
        .map_err(|e| format!("{value:?} is not a duration: {e}"))?;
    // Every duration here is a timeout, a lease, an interval or a lifetime; none
    // means anything past a year, and a bound keeps the arithmetic on them (twice a
    // timeout, a deadline from now) from overflowing.
    if duration > MAX_DURATION {
        return Err(format!("{value:?} is longer than a year"));
    }
    Ok(duration)
}

/// The longest duration a setting takes.
pub const MAX_DURATION: Duration = Duration::from_secs(366 * 24 * 3600);
