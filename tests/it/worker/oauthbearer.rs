//! Kafka `SASL OAUTHBEARER` with OIDC client credentials, as managed clusters
//! offer it: the settings go through KAFKA_CONFIG_FILE (the client secret with
//! them) to librdkafka's own OIDC support (`sasl.oauthbearer.method=oidc`).
//!
//! librdkafka fetches tokens itself, through libcurl, and only a build with the
//! feature `kafka-oidc` has it (the image's production build). On such a build
//! (`PW_TEST_BINARY=<a --features kafka-oidc build>`) this test serves a token
//! endpoint and shows that `payment-worker produce` asks it for a token with the
//! client's id and secret (HTTP Basic) and `grant_type=client_credentials`; the
//! local mock broker does not check the token, so the login itself is not shown
//! here. On a build without it (the suite's own) it shows the worker refusing the
//! settings at start, naming the missing support, never the secret.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use crate::support::pki::path_str;
use crate::support::procs::{binary, dev_kafka, run_to_end};
use crate::support::redis_servers::{private_file, TempDir};

const CLIENT_SECRET: &str = "oidc-client-secret-4e1f0b";

/// Whether the binary under test carries librdkafka's OIDC (feature `kafka-oidc`,
/// which `--version` names). The suite's own build does not; run this test with
/// `PW_TEST_BINARY` set to a `--features kafka-oidc` build to see the token fetched.
fn binary_has_oidc() -> bool {
    let program = std::env::var("PW_TEST_BINARY")
        .unwrap_or_else(|_| crate::support::procs::BINARY.to_owned());
    let version = std::process::Command::new(program)
        .arg("--version")
        .output()
        .expect("the binary runs");
    String::from_utf8_lossy(&version.stdout).contains("kafka-oidc")
}

/// Answers the first token request with an unsigned JWT and hands its head and
/// body to the test.
async fn token_endpoint() -> (u16, tokio::sync::oneshot::Receiver<(Vec<String>, String)>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (seen, request) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let mut stream = BufReader::new(stream);
        let mut head = Vec::new();
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            stream.read_line(&mut line).await.unwrap();
            let line = line.trim_end().to_owned();
            if line.is_empty() {
                break;
            }
            if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = value.trim().parse().unwrap();
            }
            head.push(line);
        }
        let mut body = vec![0; length];
        stream.read_exact(&mut body).await.unwrap();
        let expires = chrono::Utc::now().timestamp() + 3600;
        let part = |json: &str| {
            use base64_url::encode;
            encode(json)
        };
        let token = format!(
            "{}.{}.c2ln",
            part(r#"{"alg":"none"}"#),
            part(&format!(r#"{{"sub":"payment-worker","exp":{expires}}}"#))
        );
        let answer =
            format!(r#"{{"access_token":"{token}","token_type":"bearer","expires_in":3600}}"#);
        let _ = stream
            .get_mut()
            .write_all(
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{answer}",
                    answer.len()
                )
                .as_bytes(),
            )
            .await;
        let _ = seen.send((head, String::from_utf8_lossy(&body).into_owned()));
    });
    (port, request)
}

/// base64url without padding, as JWT parts are written.
mod base64_url {
    pub fn encode(text: &str) -> String {
        const TABLE: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut out = String::new();
        for chunk in text.as_bytes().chunks(3) {
            let n = (u32::from(chunk[0]) << 16)
                | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
                | u32::from(*chunk.get(2).unwrap_or(&0));
            for i in 0..=chunk.len() {
                out.push(char::from(TABLE[((n >> (18 - 6 * i)) & 63) as usize]));
            }
        }
        out
    }

    pub fn basic(user: &str, password: &str) -> String {
        // Standard alphabet with padding, as HTTP Basic writes it.
        let url_safe = encode(&format!("{user}:{password}"));
        let mut standard: String = url_safe
            .chars()
            .map(|c| match c {
                '-' => '+',
                '_' => '/',
                other => other,
            })
            .collect();
        while !standard.len().is_multiple_of(4) {
            standard.push('=');
        }
        standard
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidc_client_credentials_reach_the_token_endpoint_or_are_refused_without_curl() {
    let (_kafka, brokers) = dev_kafka(1).await;
    let (port, request) = token_endpoint().await;
    let dir = TempDir::new("pw-oidc");
    let mut properties = String::new();
    writeln!(
        properties,
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=OAUTHBEARER\n\
         sasl.oauthbearer.method=oidc\nsasl.oauthbearer.client.id=payment-worker\n\
         sasl.oauthbearer.client.secret={CLIENT_SECRET}\nsasl.oauthbearer.scope=kafka\n\
         sasl.oauthbearer.token.endpoint.url=http://127.0.0.1:{port}/oauth2/token"
    )
    .unwrap();
    let file = private_file(&dir.0, "kafka.properties", &properties);
    let env: HashMap<String, String> = [
        ("KAFKA_BROKERS", brokers.trim().to_owned()),
        ("KAFKA_CONFIG_FILE", path_str(&file).to_owned()),
        ("RUST_LOG", "debug".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let produce = binary(&["produce", "--count", "1"], &env);

    if binary_has_oidc() {
        let mut producing = crate::support::procs::Proc::spawn("produce-oidc", produce);
        let (head, body) = tokio::time::timeout(Duration::from_secs(60), request)
            .await
            .expect("the token endpoint was asked")
            .unwrap();
        producing.sigkill();
        assert!(head[0].starts_with("POST /oauth2/token "), "{head:?}");
        let basic = format!(
            "Basic {}",
            base64_url::basic("payment-worker", CLIENT_SECRET)
        );
        let authorization = head.iter().find_map(|h| {
            let (name, value) = h.split_once(':')?;
            name.eq_ignore_ascii_case("authorization")
                .then(|| value.trim().to_owned())
        });
        assert_eq!(authorization.as_deref(), Some(basic.as_str()), "{head:?}");
        assert!(body.contains("grant_type=client_credentials"), "{body}");
        assert!(body.contains("scope=kafka"), "{body}");
        let output = producing.lines().join("\n");
        assert!(!output.contains(CLIENT_SECRET), "{output}");
    } else {
        let (status, lines) = run_to_end("produce-oidc", produce, Duration::from_secs(60)).await;
        let output = lines.join("\n");
        assert_eq!(status.code(), Some(1), "{output}");
        assert!(
            output.contains("sasl.oauthbearer") && output.contains("libcurl"),
            "the refusal names the setting and what the build lacks: {output}"
        );
        assert!(!output.contains(CLIENT_SECRET), "{output}");
    }
}
