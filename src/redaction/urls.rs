//! A URL's password never reaches a log line, an error message or a `Debug` output.

/// `scheme://user:secret@host/db` → `scheme://user:***@host/db`; a URL that does
/// not parse is shown as `<unparseable url>` (it might hold a secret anywhere).
pub fn redact_url(raw: &str) -> String {
    match url::Url::parse(raw) {
        Ok(mut parsed) if parsed.password().is_some() => {
            // set_password only fails for URLs that cannot carry one.
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        Ok(parsed) => parsed.to_string(),
        Err(_) => "<unparseable url>".to_owned(),
    }
}
