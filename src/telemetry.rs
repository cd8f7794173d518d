//! Logging setup. Logs go to stderr (stdout is for command output), as JSON lines
//! when `LOG_FORMAT=json`; the level comes from `RUST_LOG` (default `info`).

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

/// Held by `main`; `shutdown` flushes whatever is buffered.
pub struct Telemetry;

/// `default_filter` applies when `RUST_LOG` is unset.
pub fn init(default_filter: &str) -> Telemetry {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let json = std::env::var("LOG_FORMAT").is_ok_and(|f| f.eq_ignore_ascii_case("json"));
    let registry = tracing_subscriber::registry().with(filter);
    let result = if json {
        registry
            .with(tracing_subscriber::fmt::layer().json().with_writer(std::io::stderr))
            .try_init()
    } else {
        registry
            .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
            .try_init()
    };
    // Already initialised (tests): keep the first subscriber.
    let _ = result;
    Telemetry
}

impl Telemetry {
    pub fn shutdown(self) {}
}
