//! Panic messages without card numbers. A panic's message may quote the data that
//! caused it (a key, a field of a record); Rust's default hook prints it to stderr
//! as it is, and the worker logs the message of a panic it caught. Both go through
//! here: the message masked like any other text that leaves the worker.

use std::io::Write;

use super::masked_text;

/// The message a panic carried, masked; for a panic caught with `catch_unwind` or
/// read from a `JoinError`.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    let text = if let Some(text) = payload.downcast_ref::<&str>() {
        text
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.as_str()
    } else {
        "a panic without a message"
    };
    masked_text(text).into_owned()
}

/// Replaces the default panic hook with one that prints what it printed — the
/// thread, the place, the message and, when `RUST_BACKTRACE` asks for it, the
/// backtrace — with the message masked. Installed first thing by the binary.
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let thread = std::thread::current();
        let place = info
            .location()
            .map(|at| format!("{}:{}:{}", at.file(), at.line(), at.column()));
        let backtrace = std::backtrace::Backtrace::capture();
        let mut stderr = std::io::stderr().lock();
        let _ = write_panic(
            &mut stderr,
            thread.name().unwrap_or("<unnamed>"),
            place.as_deref(),
            &panic_message(info.payload()),
            &backtrace,
        );
    }));
}

/// The panic report, as the default hook words it.
fn write_panic(
    out: &mut impl Write,
    thread: &str,
    place: Option<&str>,
    message: &str,
    backtrace: &std::backtrace::Backtrace,
) -> std::io::Result<()> {
    writeln!(
        out,
        "\nthread '{thread}' panicked at {}:\n{message}",
        place.unwrap_or("an unknown place")
    )?;
    match backtrace.status() {
        std::backtrace::BacktraceStatus::Captured => writeln!(out, "stack backtrace:\n{backtrace}"),
        _ => writeln!(
            out,
            "note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panic_messages_are_read_from_both_payload_kinds_and_masked() {
        let caught = std::panic::catch_unwind(|| panic!("boom {}", 1)).unwrap_err();
        assert_eq!(panic_message(caught.as_ref()), "boom 1");
        let caught = std::panic::catch_unwind(|| panic!("static")).unwrap_err();
        assert_eq!(panic_message(caught.as_ref()), "static");
        let key = "41111111-11111111";
        let caught = std::panic::catch_unwind(|| panic!("bad key {key}")).unwrap_err();
        assert_eq!(panic_message(caught.as_ref()), "bad key ********-****1111");
        let caught = std::panic::catch_unwind(|| std::panic::panic_any(7u8)).unwrap_err();
        assert_eq!(panic_message(caught.as_ref()), "a panic without a message");
    }

    #[test]
    fn the_report_names_thread_and_place_and_holds_the_masked_message() {
        let mut out = Vec::new();
        write_panic(
            &mut out,
            "partition-3",
            Some("src/x.rs:1:2"),
            &masked_text("key 4111.1111.1111.1111"),
            &std::backtrace::Backtrace::disabled(),
        )
        .expect("written");
        let report = String::from_utf8(out).expect("UTF-8");
        assert!(
            report.contains(
                "thread 'partition-3' panicked at src/x.rs:1:2:\nkey ****.****.****.1111\n"
            ),
            "{report}"
        );
        assert!(!report.contains("4111.1111"), "{report}");
    }
}
