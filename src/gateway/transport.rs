//! How every gateway client reaches its gateway: the API key as a Bearer token,
//! the system's roots plus `GATEWAY_CA_CERT`, a client certificate for mutual TLS.
//! Whoever makes a transport reads the files once, at start (`startup`); the key
//! is kept only as a sensitive default header of the HTTP client.

use std::time::Duration;

use anyhow::Context as _;

use crate::redaction::{redact_url, Secret};

/// Credentials and TLS material for one gateway client, read at start.
#[derive(Clone, Default)]
pub struct GatewayTransport {
    api_key: Option<Secret>,
    ca_pem: Option<Vec<u8>>,
    /// Certificate chain followed by its private key, as reqwest reads an identity.
    identity_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for GatewayTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayTransport")
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("ca", &self.ca_pem.is_some())
            .field("client_certificate", &self.identity_pem.is_some())
            .finish()
    }
}

impl GatewayTransport {
    /// A transport with these credentials: the API key, a PEM bundle of CAs
    /// trusted besides the system roots, and a PEM client certificate (chain)
    /// followed by its private key.
    pub fn new(
        api_key: Option<Secret>,
        ca_pem: Option<Vec<u8>>,
        identity_pem: Option<Vec<u8>>,
    ) -> Self {
        Self {
            api_key,
            ca_pem,
            identity_pem,
        }
    }

    /// A transport that sends this API key and nothing else (tests, tools).
    pub fn with_api_key(key: Secret) -> Self {
        Self {
            api_key: Some(key),
            ..Self::default()
        }
    }

    /// The API key, for the one check that must read it (Stripe's test or live mode).
    pub(super) fn api_key(&self) -> Option<&Secret> {
        self.api_key.as_ref()
    }

    /// An HTTP client for `base_url` with these credentials: the key as a
    /// sensitive `Authorization: Bearer` header, the CA bundle added to the system
    /// roots, the client certificate presented when the server asks. Redirects are
    /// never followed (a redirected POST would turn into a GET).
    pub(super) fn client(
        &self,
        base_url: &str,
        timeout: Duration,
        connect_timeout: Duration,
    ) -> anyhow::Result<reqwest::Client> {
        crate::telemetry::install_crypto_provider();
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(key) = &self.api_key {
            anyhow::ensure!(
                !url_carries(base_url, key.expose()),
                "the gateway URL carries the API key: it belongs in GATEWAY_API_KEY or \
                 GATEWAY_API_KEY_FILE only, never in a URL that reaches log lines"
            );
            let mut value =
                reqwest::header::HeaderValue::from_str(&format!("Bearer {}", key.expose()))
                    .map_err(|_| {
                        anyhow::anyhow!("GATEWAY_API_KEY holds characters a header cannot carry")
                    })?;
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        let mut builder = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(connect_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .tcp_nodelay(true)
            .pool_idle_timeout(Duration::from_secs(30))
            .user_agent(concat!("payment-worker/", env!("CARGO_PKG_VERSION")))
            .default_headers(headers);
        if let Some(pem) = &self.ca_pem {
            let certificates = reqwest::Certificate::from_pem_bundle(pem)
                .context("GATEWAY_CA_CERT is not a PEM certificate bundle")?;
            anyhow::ensure!(
                !certificates.is_empty(),
                "GATEWAY_CA_CERT holds no certificate"
            );
            builder = builder.tls_certs_merge(certificates);
        }
        if let Some(pem) = &self.identity_pem {
            let identity = reqwest::Identity::from_pem(pem).context(
                "GATEWAY_CLIENT_CERT and GATEWAY_CLIENT_KEY are not a PEM certificate and its key",
            )?;
            builder = builder.identity(identity);
        }
        builder
            .build()
            .with_context(|| format!("building the HTTP client for {}", redact_url(base_url)))
    }
}

/// Checks a gateway base URL: http or https, no credentials, query or fragment
/// (a key belongs in `GATEWAY_API_KEY`, never in a URL that reaches log lines).
/// Returns it without a trailing slash.
pub(super) fn checked_base_url(base_url: &str) -> anyhow::Result<String> {
    let url = reqwest::Url::parse(base_url)
        .with_context(|| format!("invalid gateway URL {}", redact_url(base_url)))?;
    anyhow::ensure!(
        matches!(url.scheme(), "http" | "https"),
        "gateway URL must be http or https, got {:?}",
        url.scheme()
    );
    anyhow::ensure!(
        url.query().is_none() && url.fragment().is_none(),
        "gateway URL must not carry a query or fragment"
    );
    anyhow::ensure!(
        url.username().is_empty() && url.password().is_none(),
        "gateway URL must not carry credentials (use GATEWAY_API_KEY or GATEWAY_API_KEY_FILE)"
    );
    anyhow::ensure!(
        !url.path_segments()
            .into_iter()
            .flatten()
            .any(looks_like_stripe_key),
        "gateway URL must not carry credentials in its path (use GATEWAY_API_KEY or \
         GATEWAY_API_KEY_FILE)"
    );
    Ok(url.as_str().trim_end_matches('/').to_owned())
}

/// A Stripe secret, restricted or publishable key: never part of a URL.
fn looks_like_stripe_key(segment: &str) -> bool {
    ["sk_", "rk_", "pk_"].iter().any(|kind| {
        segment
            .strip_prefix(kind)
            .is_some_and(|rest| rest.starts_with("live_") || rest.starts_with("test_"))
    })
}

/// Whether `key` appears in `url`, as written or percent-decoded.
fn url_carries(url: &str, key: &str) -> bool {
    if key.is_empty() {
        return false;
    }
    // The form decoder percent-decodes each `&`-separated part of the text.
    url.contains(key)
        || url::form_urlencoded::parse(url.as_bytes())
            .any(|(name, value)| name.contains(key) || value.contains(key))
}

/// The whole error chain: reqwest's Display stops at the top level and hides the
/// cause an operator needs ("connection refused", "dns error", …).
/// The URL in it is cut to the gateway's origin: a look-up's path ends with the
/// idempotency key, which may hold a card number, and these texts reach log lines.
pub(super) fn describe(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    if let Some(url) = error.url() {
        text = text.replace(url.as_str(), &url.origin().ascii_serialization());
    }
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_in_the_path_is_refused_and_an_ordinary_path_is_not() {
        for url in [
            "https://api.example.com/sk_test_abc123/v1",
            "https://api.example.com/v1/rk_live_abc123",
        ] {
            let error = checked_base_url(url).unwrap_err().to_string();
            assert!(error.contains("in its path"), "{url}: {error}");
            assert!(!error.contains("abc123"), "{error}");
        }
        assert_eq!(
            checked_base_url("https://api.example.com/stripe/sk_prefix/").unwrap(),
            "https://api.example.com/stripe/sk_prefix"
        );
    }

    #[test]
    fn the_configured_key_anywhere_in_the_url_is_refused() {
        let transport = GatewayTransport::with_api_key(Secret::from("k3y-Of-any-shape"));
        let timeout = Duration::from_secs(1);
        for url in [
            "https://gw.example.com/k3y-Of-any-shape/charges",
            "https://gw.example.com/k3y%2DOf%2Dany%2Dshape",
        ] {
            let error = transport
                .client(url, timeout, timeout)
                .unwrap_err()
                .to_string();
            assert!(error.contains("carries the API key"), "{url}: {error}");
            assert!(!error.contains("k3y"), "{error}");
        }
        assert!(transport
            .client("https://gw.example.com/charges", timeout, timeout)
            .is_ok());
    }
}
