//! A URL's password never reaches a log line, an error message or a `Debug` output.

/// `scheme://user:secret@host/db?password=secret` → `scheme://user:***@host/db?password=***`:
/// the password of the authority and every query parameter that carries a secret
/// (Postgres drivers take `password`/`sslpassword` there too). A URL that does not
/// parse is shown as `<unparseable url>` (it might hold a secret anywhere).
pub fn redact_url(raw: &str) -> String {
    let Ok(mut parsed) = url::Url::parse(raw) else {
        return "<unparseable url>".to_owned();
    };
    if parsed.password().is_some() {
        // set_password only fails for URLs that cannot carry one.
        let _ = parsed.set_password(Some("***"));
    }
    if parsed
        .query_pairs()
        .any(|(name, _)| is_secret_parameter(&name))
    {
        let pairs: Vec<(String, String)> = parsed
            .query_pairs()
            .map(|(name, value)| {
                let value = if is_secret_parameter(&name) {
                    "***".to_owned()
                } else {
                    value.into_owned()
                };
                (name.into_owned(), value)
            })
            .collect();
        parsed.query_pairs_mut().clear().extend_pairs(pairs);
    }
    parsed.to_string()
}

fn is_secret_parameter(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["pass", "secret", "token"]
        .iter()
        .any(|word| name.contains(word))
}
