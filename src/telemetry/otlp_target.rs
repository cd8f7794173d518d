//! One signal's OTLP target as the standard `OTEL_*` variables give it: whether OTLP
//! is wanted at all, the endpoint, TLS (CA, client certificate), timeout, protocol and
//! compression. Apart from the providers, which only ask it for a client.

pub(super) fn env_set(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.trim().is_empty())
}

pub(super) fn sdk_disabled() -> bool {
    std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"))
}

pub(super) fn otlp_wanted(signal_endpoint: &str) -> bool {
    !sdk_disabled() && (env_set("OTEL_EXPORTER_OTLP_ENDPOINT") || env_set(signal_endpoint))
}

/// The signal's protocol as the SDK resolves it; `None` when unset (the SDK then
/// uses HTTP/protobuf).
pub(super) fn protocol(signal: &str) -> Option<String> {
    [
        format!("OTEL_EXPORTER_OTLP_{signal}_PROTOCOL"),
        "OTEL_EXPORTER_OTLP_PROTOCOL".to_owned(),
    ]
    .iter()
    .find_map(|name| std::env::var(name).ok().filter(|v| !v.trim().is_empty()))
}

/// A certificate (chain) and its private key, PEM.
type PemPair = (Vec<u8>, Vec<u8>);

/// Where a signal is exported and which extra CA verifies it, from the standard
/// variables (the per-signal one first).
pub(super) struct OtlpTarget {
    https: bool,
    ca_file: Option<String>,
    client_certificate: Option<String>,
    client_key: Option<String>,
    timeout: std::time::Duration,
}

impl OtlpTarget {
    pub(super) fn of(signal: &str) -> Self {
        let first_set = |names: [String; 2]| {
            names
                .iter()
                .find_map(|name| std::env::var(name).ok().filter(|v| !v.trim().is_empty()))
        };
        let endpoint = first_set([
            format!("OTEL_EXPORTER_OTLP_{signal}_ENDPOINT"),
            "OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(),
        ]);
        let ca_file = first_set([
            format!("OTEL_EXPORTER_OTLP_{signal}_CERTIFICATE"),
            "OTEL_EXPORTER_OTLP_CERTIFICATE".to_owned(),
        ]);
        let client_certificate = first_set([
            format!("OTEL_EXPORTER_OTLP_{signal}_CLIENT_CERTIFICATE"),
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE".to_owned(),
        ]);
        let client_key = first_set([
            format!("OTEL_EXPORTER_OTLP_{signal}_CLIENT_KEY"),
            "OTEL_EXPORTER_OTLP_CLIENT_KEY".to_owned(),
        ]);
        // The SDK's own default (10 s) when unset or unreadable.
        let timeout_ms = first_set([
            format!("OTEL_EXPORTER_OTLP_{signal}_TIMEOUT"),
            "OTEL_EXPORTER_OTLP_TIMEOUT".to_owned(),
        ])
        .and_then(|ms| ms.trim().parse::<u64>().ok())
        .unwrap_or(10_000);
        Self {
            https: endpoint.is_some_and(|e| e.trim().to_ascii_lowercase().starts_with("https://")),
            ca_file,
            client_certificate,
            client_key,
            timeout: std::time::Duration::from_millis(timeout_ms),
        }
    }

    /// Whether this export needs our TLS set-up (an `https://` endpoint, a CA file or
    /// a client certificate).
    pub(super) fn wants_tls(&self) -> bool {
        self.https || self.ca_file.is_some() || self.client_certificate.is_some()
    }

    /// The client certificate (chain) and its key, PEM, when both are set.
    fn client_identity(&self) -> Result<Option<PemPair>, String> {
        let read = |path: &str| {
            crate::configuration::read_setting_file(path.as_ref())
                .map_err(|e| format!("reading {path}: {e}"))
        };
        match (&self.client_certificate, &self.client_key) {
            (Some(cert), Some(key)) => Ok(Some((read(cert)?, read(key)?))),
            (None, None) => Ok(None),
            _ => Err(
                "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and OTEL_EXPORTER_OTLP_CLIENT_KEY go together"
                    .to_owned(),
            ),
        }
    }

    fn ca_pem(&self) -> Result<Option<Vec<u8>>, String> {
        self.ca_file
            .as_ref()
            .map(|path| {
                crate::configuration::read_setting_file(path.as_ref())
                    .map_err(|e| format!("reading CA file {path}: {e}"))
            })
            .transpose()
    }

    /// gRPC: the system roots and the CA file.
    pub(super) fn grpc_tls(
        &self,
    ) -> Result<opentelemetry_otlp::tonic_types::transport::ClientTlsConfig, String> {
        use opentelemetry_otlp::tonic_types::transport::{Certificate, ClientTlsConfig, Identity};
        let mut config = ClientTlsConfig::new().with_native_roots();
        if let Some(pem) = self.ca_pem()? {
            config = config.ca_certificate(Certificate::from_pem(pem));
        }
        if let Some((cert, key)) = self.client_identity()? {
            config = config.identity(Identity::from_pem(cert, key));
        }
        Ok(config)
    }

    /// HTTP/protobuf: a blocking client verifying against the system roots and the CA
    /// file. Built on a thread of its own: a blocking client may not be created (nor
    /// dropped) on a tokio worker thread.
    pub(super) fn http_client(&self) -> Result<reqwest::blocking::Client, String> {
        let mut builder = reqwest::blocking::Client::builder().timeout(self.timeout);
        if let Some(pem) = self.ca_pem()? {
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| format!("reading the OTLP CA certificate: {e}"))?;
            builder = builder.tls_certs_merge(certs);
        }
        if let Some((mut pem, key)) = self.client_identity()? {
            pem.push(b'\n');
            pem.extend(key);
            let identity = reqwest::Identity::from_pem(&pem)
                .map_err(|e| format!("reading the OTLP client certificate and key: {e}"))?;
            builder = builder.identity(identity);
        }
        std::thread::spawn(move || builder.build())
            .join()
            .map_err(|_| "building the OTLP HTTP client panicked".to_owned())?
            .map_err(|e| format!("building the OTLP HTTP client: {e}"))
    }
}

/// `OTEL_EXPORTER_OTLP_{signal}_COMPRESSION` or `OTEL_EXPORTER_OTLP_COMPRESSION`: the
/// SDK applies `gzip` itself; any other value than `gzip` or `none` would be skipped
/// by it with a warning few read, so the exporter is refused instead.
pub(super) fn check_compression(signal: &str) -> Result<(), String> {
    for name in [
        format!("OTEL_EXPORTER_OTLP_{signal}_COMPRESSION"),
        "OTEL_EXPORTER_OTLP_COMPRESSION".to_owned(),
    ] {
        let Some(value) = std::env::var(&name).ok().filter(|v| !v.trim().is_empty()) else {
            continue;
        };
        return match value.trim().to_ascii_lowercase().as_str() {
            "gzip" | "none" => Ok(()),
            other => Err(format!(
                "{name}={other:?} is not supported: use gzip or none"
            )),
        };
    }
    Ok(())
}
