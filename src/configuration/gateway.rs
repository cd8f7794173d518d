//! Which payment gateway, where, and with which credentials and TLS: the settings
//! every command that talks to the gateway shares (`run`, `process`, `audit`).

use std::path::PathBuf;
use std::time::Duration;

use super::parse_duration;
pub use crate::gateway::StripeCompat;
use crate::redaction::{redact_url, Secret};

/// `GATEWAY_URL` of the `charges` gateway when none is given: a local simulator.
pub const DEFAULT_CHARGES_URL: &str = "http://127.0.0.1:8080";
/// `GATEWAY_URL` of the `stripe` gateway when none is given.
pub const DEFAULT_STRIPE_URL: &str = "https://api.stripe.com";
/// The Stripe API version every request pins (`Stripe-Version`) unless told otherwise.
pub const DEFAULT_STRIPE_API_VERSION: &str = "2024-06-20";

/// Which protocol the gateway speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum GatewayKind {
    /// `POST /charges` with an `Idempotency-Key`, `GET /charges/{key}`, `GET /charges`.
    // The flag's help describes the values; a help per value would switch `--help`
    // to its long layout. The doc comments are for the library.
    #[default]
    #[value(help = None::<&str>)]
    Charges,
    /// Stripe's PaymentIntents: create, record, confirm.
    #[value(help = None::<&str>)]
    Stripe,
}

impl GatewayKind {
    /// Whether a gateway of this kind can take `request` at all, decided before
    /// anything is sent, by the rule its adapter's [`PaymentGateway::accepts`]
    /// applies (`stripe_amount` for Stripe): what `replay --dry-run` predicts
    /// without a gateway. `Err` is the refusal (`<reason code>: <explanation>`).
    ///
    /// [`PaymentGateway::accepts`]: crate::gateway::PaymentGateway::accepts
    pub fn accepts(self, request: &crate::gateway::ChargeRequest) -> Result<(), String> {
        match self {
            Self::Charges => Ok(()),
            Self::Stripe => {
                crate::gateway::stripe_amount(request.amount_minor, &request.currency).map(|_| ())
            }
        }
    }
}

/// Where the gateway is and how to reach it: kind, URL, credentials, TLS.
#[derive(Clone, clap::Args)]
pub struct GatewayAccess {
    /// `charges` (the simulator's protocol) or `stripe` (PaymentIntents).
    #[arg(
        id = "gateway_kind",
        long = "gateway",
        env = "GATEWAY_KIND",
        value_enum,
        default_value = "charges"
    )]
    pub kind: GatewayKind,
    /// Base URL of the gateway [default: http://127.0.0.1:8080 for `charges`,
    /// https://api.stripe.com for `stripe`]. Credentials are refused in it.
    #[arg(
        id = "gateway_url",
        long = "gateway-url",
        env = "GATEWAY_URL",
        hide_env_values = true
    )]
    pub url: Option<String>,
    /// API key, sent as `Authorization: Bearer` (prefer GATEWAY_API_KEY_FILE).
    #[arg(
        id = "gateway_api_key",
        long = "gateway-api-key",
        env = "GATEWAY_API_KEY",
        hide_env_values = true,
        value_name = "KEY"
    )]
    pub api_key: Option<Secret>,
    /// File holding the API key, read once at start (a trailing line break is
    /// ignored); replace the file and restart the workers to rotate the key.
    #[arg(
        id = "gateway_api_key_file",
        long = "gateway-api-key-file",
        env = "GATEWAY_API_KEY_FILE",
        value_name = "PATH"
    )]
    pub api_key_file: Option<PathBuf>,
    /// PEM bundle of CAs trusted for the gateway's certificate, besides the system roots.
    #[arg(
        id = "gateway_ca_cert",
        long = "gateway-ca-cert",
        env = "GATEWAY_CA_CERT",
        value_name = "PATH"
    )]
    pub ca_cert: Option<PathBuf>,
    /// PEM certificate (chain) this worker presents to the gateway (mutual TLS).
    #[arg(
        id = "gateway_client_cert",
        long = "gateway-client-cert",
        env = "GATEWAY_CLIENT_CERT",
        value_name = "PATH",
        requires = "gateway_client_key"
    )]
    pub client_cert: Option<PathBuf>,
    /// PEM private key of GATEWAY_CLIENT_CERT.
    #[arg(
        id = "gateway_client_key",
        long = "gateway-client-key",
        env = "GATEWAY_CLIENT_KEY",
        value_name = "PATH",
        requires = "gateway_client_cert"
    )]
    pub client_key: Option<PathBuf>,
    /// The Stripe gateway's own settings.
    #[command(flatten)]
    pub stripe: StripeSettings,
}

impl GatewayAccess {
    /// `GATEWAY_URL`, or the default of the gateway's kind.
    pub fn url(&self) -> &str {
        match (&self.url, self.kind) {
            (Some(url), _) => url,
            (None, GatewayKind::Charges) => DEFAULT_CHARGES_URL,
            (None, GatewayKind::Stripe) => DEFAULT_STRIPE_URL,
        }
    }
}

impl std::fmt::Debug for GatewayAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = |given: bool| if given { "<set>" } else { "<unset>" };
        f.debug_struct("GatewayAccess")
            .field("kind", &self.kind)
            .field("url", &without_user(self.url()))
            .field("api_key", &set(self.api_key.is_some()))
            .field("api_key_file", &self.api_key_file)
            .field("ca_cert", &self.ca_cert)
            .field("client_cert", &self.client_cert)
            .field("client_key", &self.client_key)
            .field("stripe", &self.stripe)
            .finish()
    }
}

/// `url` as `redact_url` shows it, and without its user name either: Stripe takes
/// its key as the user name of HTTP basic authentication.
fn without_user(url: &str) -> String {
    let shown = redact_url(url);
    match url::Url::parse(&shown) {
        Ok(mut parsed) if !parsed.username().is_empty() => {
            let _ = parsed.set_username("***");
            parsed.to_string()
        }
        _ => shown,
    }
}

/// Settings only the `stripe` gateway reads.
#[derive(Debug, Clone, clap::Args)]
pub struct StripeSettings {
    /// Stripe API version pinned on every request (`Stripe-Version`).
    #[arg(
        long = "stripe-api-version",
        env = "STRIPE_API_VERSION",
        default_value = DEFAULT_STRIPE_API_VERSION
    )]
    pub api_version: String,
    /// `localstripe` for the localstripe test fake, which lacks parts of Stripe's API.
    #[arg(
        long = "stripe-compat",
        env = "STRIPE_COMPAT",
        value_enum,
        default_value = "stripe"
    )]
    pub compat: StripeCompat,
    /// Connections of the Stripe gateway's own pool, on which it records each
    /// PaymentIntent before confirming it (apart from the payment pool).
    #[arg(
        long = "stripe-record-connections",
        env = "STRIPE_RECORD_CONNECTIONS",
        default_value_t = 4,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub record_connections: u32,
}

impl Default for StripeSettings {
    fn default() -> Self {
        Self {
            api_version: DEFAULT_STRIPE_API_VERSION.to_owned(),
            compat: StripeCompat::Stripe,
            record_connections: 4,
        }
    }
}

/// The payment gateway: which, where, with which credentials, and how long to wait for it.
#[derive(Clone, clap::Args)]
pub struct GatewaySettings {
    /// Kind, URL, credentials and TLS.
    #[command(flatten)]
    pub access: GatewayAccess,
    /// A charge without an answer after this long has an UNKNOWN outcome.
    #[arg(id = "gateway_timeout", long = "gateway-timeout", env = "GATEWAY_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Longest wait for a TCP connection to the gateway.
    #[arg(long = "gateway-connect-timeout", env = "GATEWAY_CONNECT_TIMEOUT", default_value = "1s", value_parser = parse_duration)]
    pub connect_timeout: Duration,
    /// When to look a charge up by key before charging: `uncertain` (after an
    /// earlier attempt may have charged) or `always`.
    #[arg(
        long = "gateway-lookup",
        env = "GATEWAY_LOOKUP",
        value_enum,
        default_value = "uncertain"
    )]
    pub lookup: crate::payment::GatewayLookup,
}

impl std::fmt::Debug for GatewaySettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The client refuses a URL with credentials, but only after `run` logged
        // its settings: the log line must not carry them either (nor the API key).
        f.debug_struct("GatewaySettings")
            .field("access", &self.access)
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("lookup", &self.lookup)
            .finish()
    }
}
