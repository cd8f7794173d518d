//! Credentials and TLS of every gateway adapter, through the binary: a worker
//! trusts an HTTPS gateway whose CA it is given (`GATEWAY_CA_CERT`, added to the
//! system roots) and refuses it otherwise; it presents a client certificate when
//! the gateway requires one; `GATEWAY_API_KEY_FILE` is read and sent as Bearer,
//! and the key shows in no log line, `--help` or error.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use payment_worker::configuration::StripeCompat;
use payment_worker::payment::{CommandContext, Outcome};
use payment_worker_devtools::{GatewaySimulator, RunningSimulator, SimulatorConfig};
use rdkafka::message::{Header, OwnedHeaders};
use tracing::Instrument;

use crate::support::helpers::{span_exporter, unique, TestDb, TestRedis, REDIS_URL};
use crate::support::pki::{path_str, TestPki};
use crate::support::procs::{binary, run_to_end};
use crate::support::scripted_stripe::ScriptedStripe;
use crate::support::stripe::{command, StripeRig};
use crate::support::tls_front::TlsFront;

struct Stores {
    db: TestDb,
    redis: TestRedis,
}

impl Stores {
    async fn new() -> Self {
        Self {
            db: TestDb::new().await,
            redis: TestRedis::new().await,
        }
    }

    fn env(&self, gateway: &[(&str, &str)]) -> HashMap<String, String> {
        let mut env: HashMap<String, String> = [
            ("DATABASE_URL", self.db.url.as_str()),
            ("REDIS_URL", REDIS_URL),
            ("REDIS_KEY_PREFIX", self.redis.prefix.as_str()),
            ("DATABASE_MAX_CONNECTIONS", "2"),
            ("GATEWAY_TIMEOUT", "3s"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        env.extend(
            gateway
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        env
    }
}

fn order(key: &str) -> String {
    serde_json::json!({"idempotency_key": key, "account_id": "acct_1", "amount_minor": 1200,
        "currency": "USD", "payment_method": "pm_card_visa"})
    .to_string()
}

/// `process` for a new key with `env`: its exit code, its output, and the key.
async fn process(env: &HashMap<String, String>, tag: &str) -> (Option<i32>, String, String) {
    let key = unique(tag);
    let (status, lines) = run_to_end(
        "process",
        binary(&["process", &order(&key)], env),
        Duration::from_secs(60),
    )
    .await;
    (status.code(), lines.join("\n"), key)
}

fn simulator() -> (RunningSimulator, SocketAddr) {
    let simulator =
        GatewaySimulator::bind("127.0.0.1:0".parse().unwrap(), SimulatorConfig::default())
            .unwrap()
            .spawn();
    let addr = simulator
        .url()
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    (simulator, addr)
}

fn charged(simulator: &RunningSimulator, key: &str) -> bool {
    simulator.ledger().iter().any(|e| e.idempotency_key == key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_trusts_an_https_gateway_through_the_ca_it_is_given_and_only_so() {
    let stores = Stores::new().await;
    let pki = TestPki::new();
    let (simulator, upstream) = simulator();
    let front = TlsFront::start(pki.rustls_server(), upstream).await;
    let url = front.url();

    let (code, output, key) = process(
        &stores.env(&[
            ("GATEWAY_URL", &url),
            ("GATEWAY_CA_CERT", path_str(&pki.ca())),
        ]),
        "tls-ca",
    )
    .await;
    assert_eq!(code, Some(0), "{output}");
    assert!(output.contains("\"outcome\":\"succeeded\""), "{output}");
    assert!(charged(&simulator, &key));

    // The system roots alone, or an unrelated CA: the server is not trusted and
    // nothing is sent (75: try again later).
    for (tag, env) in [
        ("tls-none", stores.env(&[("GATEWAY_URL", &url)])),
        (
            "tls-wrong",
            stores.env(&[
                ("GATEWAY_URL", &url),
                ("GATEWAY_CA_CERT", path_str(&pki.wrong_ca())),
            ]),
        ),
    ] {
        let refused_before = front.refused();
        let (code, output, key) = process(&env, tag).await;
        assert_eq!(code, Some(75), "{tag}: {output}");
        assert!(!charged(&simulator, &key), "{tag}");
        assert!(
            front.refused() > refused_before,
            "{tag}: the handshake failed"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_presents_its_client_certificate_to_a_gateway_that_requires_one() {
    let stores = Stores::new().await;
    let pki = TestPki::new();
    let (simulator, upstream) = simulator();
    let front = TlsFront::start(pki.rustls_server_requiring_clients(), upstream).await;
    let url = front.url();
    let ca = path_str(&pki.ca()).to_owned();

    let (code, output, key) = process(
        &stores.env(&[
            ("GATEWAY_URL", &url),
            ("GATEWAY_CA_CERT", &ca),
            ("GATEWAY_CLIENT_CERT", path_str(&pki.client_cert())),
            ("GATEWAY_CLIENT_KEY", path_str(&pki.client_key())),
        ]),
        "mtls-ok",
    )
    .await;
    assert_eq!(code, Some(0), "{output}");
    assert!(charged(&simulator, &key));

    let (code, output, key) = process(
        &stores.env(&[("GATEWAY_URL", &url), ("GATEWAY_CA_CERT", &ca)]),
        "mtls-none",
    )
    .await;
    assert_eq!(code, Some(75), "{output}");
    assert!(!charged(&simulator, &key));
    assert!(
        front.refused() > 0,
        "the gateway refused the anonymous client"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_file_is_sent_as_bearer_and_never_shown() {
    const SECRET: &str = "sk_test_from_a_file_7c1d29";
    let stores = Stores::new().await;
    // The server knows the key: any other Bearer is a 401, nothing charged.
    let server = ScriptedStripe::start(&[(SECRET, "acct_file")]).await;
    let key_file = std::env::temp_dir().join(unique("pw-api-key"));
    std::fs::write(&key_file, format!("{SECRET}\n")).unwrap();
    let file = key_file.display().to_string();
    let mut env = stores.env(&[
        ("GATEWAY_KIND", "stripe"),
        ("GATEWAY_URL", &server.url()),
        ("GATEWAY_API_KEY_FILE", &file),
    ]);
    env.insert("RUST_LOG".into(), "debug".into());

    let (code, output, key) = process(&env, "key-file").await;
    assert_eq!(code, Some(0), "{output}");
    assert!(output.contains("\"outcome\":\"succeeded\""), "{output}");
    assert_eq!(server.charges(&key), 1, "the key was accepted as Bearer");
    assert!(!output.contains(SECRET), "the key in the output:\n{output}");

    // `--help` with the key in the environment.
    let mut with_key = env.clone();
    with_key.insert("GATEWAY_API_KEY".into(), SECRET.into());
    for command in [
        &["run", "--help"][..],
        &["audit", "--help"],
        &["process", "--help"],
    ] {
        let (status, lines) =
            run_to_end("help", binary(command, &with_key), Duration::from_secs(30)).await;
        assert!(status.success());
        let help = lines.join("\n");
        assert!(help.contains("GATEWAY_API_KEY_FILE"), "{help}");
        assert!(!help.contains(SECRET), "{command:?} shows the key:\n{help}");
    }

    // Both forms given: a usage error naming both settings, not the key.
    let (code, output, _) = process(&with_key, "key-both").await;
    assert_eq!(code, Some(2), "{output}");
    assert!(
        output.contains("GATEWAY_API_KEY and GATEWAY_API_KEY_FILE"),
        "{output}"
    );
    assert!(!output.contains(SECRET), "{output}");

    // A wrong key: refused by the account probe at start, which ends the command
    // with a message naming the setting (not 75: retrying cannot help), and still
    // not shown.
    std::fs::write(&key_file, "sk_test_revoked_key_99\n").unwrap();
    let (code, output, key) = process(&env, "key-wrong").await;
    assert_eq!(code, Some(1), "{output}");
    assert!(output.contains("GATEWAY_API_KEY_FILE"), "{output}");
    assert_eq!(server.charges(&key), 0);
    assert!(!output.contains("sk_test_revoked_key_99"), "{output}");

    // A key in the URL is refused without being repeated.
    let mut in_url = stores.env(&[
        ("GATEWAY_KIND", "stripe"),
        ("GATEWAY_URL", "http://sk_test_in_the_url_55@127.0.0.1:9"),
        ("GATEWAY_API_KEY_FILE", &file),
    ]);
    in_url.insert("RUST_LOG".into(), "debug".into());
    let (code, output, _) = process(&in_url, "key-url").await;
    assert_eq!(code, Some(1), "{output}");
    assert!(output.contains("must not carry credentials"), "{output}");
    assert!(!output.contains("sk_test_in_the_url_55"), "{output}");

    // So is the key in the URL's path, as the configured key or as any Stripe key.
    for (tag, url) in [
        ("key-path", "http://127.0.0.1:9/v1/sk_test_revoked_key_99"),
        (
            "key-path-other",
            "http://127.0.0.1:9/sk_live_other_key_77/v1",
        ),
    ] {
        let mut in_path = stores.env(&[
            ("GATEWAY_KIND", "stripe"),
            ("GATEWAY_URL", url),
            ("GATEWAY_API_KEY_FILE", &file),
        ]);
        in_path.insert("RUST_LOG".into(), "debug".into());
        let (code, output, _) = process(&in_path, tag).await;
        assert_eq!(code, Some(1), "{tag}: {output}");
        assert!(
            output.contains("carries the API key") || output.contains("in its path"),
            "{tag}: {output}"
        );
        for secret in ["sk_test_revoked_key_99", "sk_live_other_key_77"] {
            assert!(!output.contains(secret), "{tag}: {output}");
        }
    }
    let _ = std::fs::remove_file(&key_file);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_is_in_no_exported_span() {
    const SECRET: &str = "sk_test_span_check_4f2a90";
    let server = ScriptedStripe::start(&[(SECRET, "acct_span")]).await;
    let rig = StripeRig::new(&server.url(), StripeCompat::Stripe, Duration::from_secs(5)).await;
    let processor = rig.processor(std::sync::Arc::new(rig.gateway_with_key(SECRET)));
    // A sampled remote parent: the test exporter keeps this trace's spans.
    let trace = crate::support::helpers::card_free_trace_id().to_string();
    let span = tracing::info_span!("api key span check");
    let traceparent = format!("00-{trace}-00f067aa0ba902b7-01");
    let headers = OwnedHeaders::new().insert(Header {
        key: "traceparent",
        value: Some(&traceparent),
    });
    payment_worker::telemetry::adopt_remote_parent(&span, Some(&headers));
    let key = unique("span-key");
    let outcome = processor
        .process(
            &command(&key, 800, "USD", "pm_card_visa"),
            &CommandContext::default(),
        )
        .instrument(span)
        .await;
    assert!(
        matches!(
            outcome,
            payment_worker::payment::Attempt::Final(Outcome::Succeeded { .. })
        ),
        "{outcome:?}"
    );
    let spans: Vec<_> = span_exporter()
        .get_finished_spans()
        .unwrap()
        .into_iter()
        .filter(|s| s.span_context.trace_id().to_string() == trace)
        .collect();
    assert!(
        spans.iter().any(|s| s.name == "stripe charge"),
        "the Stripe gateway's span was exported: {spans:#?}"
    );
    for exported in &spans {
        let text = format!("{exported:?}");
        assert!(!text.contains(SECRET), "the key in a span: {text}");
    }
}
