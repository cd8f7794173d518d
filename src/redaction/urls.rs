//! A URL's password never reaches a log line, an error message or a `Debug` output.

/// `scheme://user:secret@host/db?password=secret` → `scheme://user:***@host/db?password=***`:
/// the password of the authority and every query parameter that carries a secret
/// (Postgres drivers take `password`/`sslpassword` there too). A URL that does not
/// parse is shown as `<unparseable url>` (it might hold a secret anywhere).
pub fn redact_url(raw: &str) -> String {
    if is_node_list(raw) {
        // A list of node URLs (`REDIS_URL` of a cluster's seeds: `redis://:pw@r1/,
        // redis://:pw@r2/`, or with the later ones written without their scheme,
        // `redis://:pw@r1/,:pw@r2/`) parses as one URL whose path holds the rest,
        // passwords and all: each is shown redacted on its own. A piece that does
        // not parse may be part of a password cut at a comma: then nothing is shown.
        let nodes: Vec<String> = raw.split(',').map(redact_url).collect();
        if nodes.iter().any(|node| node == UNPARSEABLE) {
            return UNPARSEABLE.to_owned();
        }
        return nodes.join(",");
    }
    match as_url(raw) {
        std::borrow::Cow::Borrowed(url) => redact_one(url),
        std::borrow::Cow::Owned(url) => {
            let shown = redact_one(&url);
            match shown.strip_prefix(SCHEME_LESS) {
                Some(authority) => authority.to_owned(),
                None => shown,
            }
        }
    }
}

/// The scheme put in front of a value written without one.
const SCHEME_LESS: &str = "x://";

/// `raw` as a URL: without a scheme (`:pw@host:6379`, `user:pw@host`) the text
/// before the first colon would be read as one and the password as a path, so it
/// is read behind [`SCHEME_LESS`], as an authority.
fn as_url(raw: &str) -> std::borrow::Cow<'_, str> {
    if raw.contains("://") {
        std::borrow::Cow::Borrowed(raw)
    } else {
        std::borrow::Cow::Owned(format!("{SCHEME_LESS}{raw}"))
    }
}

/// What a URL that does not parse is shown as.
const UNPARSEABLE: &str = "<unparseable url>";

/// Whether `raw` is several URLs joined by commas: read as one, a part after its
/// authority (path, query, fragment) holds another's credentials or scheme, or it
/// does not parse at all. A comma inside a password (`postgres://u:p,w@db/x`) is no
/// list: the URL parses and its authority holds the comma.
fn is_node_list(raw: &str) -> bool {
    if !raw.contains(',') {
        return false;
    }
    match url::Url::parse(&as_url(raw)) {
        Ok(url) => [
            url.path(),
            url.query().unwrap_or(""),
            url.fragment().unwrap_or(""),
        ]
        .iter()
        .any(|part| part.contains('@') || part.contains("://")),
        Err(_) => true,
    }
}

/// One URL, redacted.
fn redact_one(raw: &str) -> String {
    let Ok(mut parsed) = url::Url::parse(raw) else {
        return UNPARSEABLE.to_owned();
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

/// A query parameter whose value is a credential: a password, a secret, a token, a
/// key (`api_key`, `apikey`, `key`; Postgres' `sslkey` names a file, masked all the
/// same), a signature (`sig`, `X-Amz-Signature`), or anything named after
/// authentication or credentials.
fn is_secret_parameter(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    [
        "pass",
        "secret",
        "token",
        "key",
        "sig",
        "auth",
        "credential",
    ]
    .iter()
    .any(|word| name.contains(word))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_in_the_query_are_masked_and_the_rest_kept() {
        let shown = redact_url(
            "https://gw.example/v1?api_key=k1&X-Amz-Signature=s2&sig=s3&auth=a4\
             &client_credentials=c5&sslpassword=p6&access_token=t7&region=eu&sslmode=require",
        );
        for secret in ["k1", "s2", "s3", "a4", "c5", "p6", "t7"] {
            assert!(
                !shown.contains(&format!("={secret}")),
                "{secret} in {shown}"
            );
        }
        assert!(
            shown.contains("region=eu") && shown.contains("sslmode=require"),
            "{shown}"
        );
        assert_eq!(
            redact_url("postgres://app:hunter2@db:5432/payments?application_name=w"),
            "postgres://app:***@db:5432/payments?application_name=w"
        );
    }

    #[test]
    fn every_url_of_a_node_list_is_redacted() {
        assert_eq!(
            redact_url("redis://:hunter2@r1:6379/,redis://:hunter3@r2:6379/"),
            "redis://:***@r1:6379/,redis://:***@r2:6379/"
        );
        // A piece that does not parse could be the rest of a password.
        assert_eq!(
            redact_url("rediss://u:hunter2@r1:6379,not a url://x"),
            "<unparseable url>"
        );
        // A comma inside a password is no list.
        for (raw, shown) in [
            ("postgres://app:s3cr,et@db/p", "postgres://app:***@db/p"),
            ("redis://:pa,ss@r1", "redis://:***@r1"),
        ] {
            assert_eq!(redact_url(raw), shown, "{raw}");
        }
        // Nor is a libpq host list; its password is masked all the same.
        let hosts = redact_url("postgres://app:hunter2@h1:5432,h2:5432/db");
        assert!(!hosts.contains("hunter2"), "{hosts}");
        // Later nodes, or all of them, written without a scheme.
        assert_eq!(
            redact_url("redis://:hunter2@r1:6379/,:hunter3@r2:6379/"),
            "redis://:***@r1:6379/,:***@r2:6379/"
        );
        let scheme_less = redact_url("r1:6379,:hunter3@r2:6379");
        assert!(!scheme_less.contains("hunter3"), "{scheme_less}");
        assert_eq!(redact_url("app:hunter2@db:5432"), "app:***@db:5432");
        assert_eq!(redact_url("db:5432"), "db:5432");
    }
}
