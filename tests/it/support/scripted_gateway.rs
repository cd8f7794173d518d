//! A gateway that answers the way real ones do when something is off: an HTTP
//! front, scripted per idempotency key, in front of the simulator's real ledger.
//! A scripted answer can refuse a POST without charging, or charge in the ledger
//! and then answer badly (409, a redirect, a garbled or cut-off body), so a second
//! charge or a missing one is visible in the ledger, not inferred.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use payment_worker_devtools::RunningSimulator;

/// How the front answers one `POST /charges`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostAnswer {
    /// Relay to the ledger and relay its answer (what happens once a script ran out).
    Forward,
    /// Answer this status without charging.
    Refuse(u16),
    /// Charge in the ledger, then answer this status instead of the charge.
    ChargeThen(u16),
    /// Charge, then answer 200 with a body that is not a charge.
    ChargeThenGarbledBody,
    /// Charge, then answer 200 and break the connection in the middle of the body.
    ChargeThenCutBody,
    /// Charge, then answer the ledger's 200 followed by this many bytes of white
    /// space (still the same JSON), streamed without a declared length.
    ChargeThenPaddedBody(usize),
    /// Charge, then answer the ledger's 200 with this transaction id instead of the
    /// charge's own (a gateway that hands out an id twice).
    ChargeWithTransactionId(&'static str),
    /// Answer nothing; charge this long after the POST arrived (a request queued
    /// inside the gateway that lands after the caller gave up on it).
    ChargeLate(Duration),
}

/// How the front changes the ledger's answer to a look-up (a gateway, or a proxy or
/// cache in front of it, that answers with the wrong charge).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LookupAnswer {
    /// The charge with this amount instead of its own.
    Amount(i64),
    /// The charge with this currency instead of its own.
    Currency(&'static str),
    /// The charge as if it had been made under this key.
    Key(&'static str),
}

#[derive(Default)]
struct Script {
    /// Keys whose look-ups that find a charge are altered so.
    lookups_altered: HashMap<String, LookupAnswer>,
    posts: HashMap<String, VecDeque<PostAnswer>>,
    /// Keys whose look-ups are answered 503.
    lookups_down: HashSet<String>,
    /// Keys whose look-ups are answered 404 whatever the ledger holds (a gateway that
    /// has not booked the charge yet).
    lookups_hidden: HashSet<String>,
    /// Look-ups received per key, whatever the answer.
    lookups_seen: HashMap<String, usize>,
    /// POSTs received per key, whatever the answer.
    posts_seen: HashMap<String, usize>,
}

struct Front {
    ledger_url: String,
    http: reqwest::Client,
    script: Mutex<Script>,
}

impl Front {
    /// Relays a POST to the ledger, which charges.
    async fn charge_in_ledger(&self, key: &str, body: Bytes) -> reqwest::Response {
        self.http
            .post(format!("{}/charges", self.ledger_url))
            .header("Idempotency-Key", key)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap()
    }
}

pub struct ScriptedGateway {
    front: Arc<Front>,
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ScriptedGateway {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ScriptedGateway {
    /// Starts the front on a random port, relaying to `ledger`.
    pub async fn start(ledger: &RunningSimulator) -> Self {
        let front = Arc::new(Front {
            ledger_url: ledger.url(),
            http: crate::support::helpers::http(),
            script: Mutex::new(Script::default()),
        });
        let app = Router::new()
            .route("/charges", post(charge).get(whole_ledger))
            .route("/charges/{key}", get(lookup))
            .with_state(Arc::clone(&front));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self { front, addr, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The next POSTs for `key` get these answers, in order; later ones are relayed.
    pub fn script(&self, key: &str, answers: &[PostAnswer]) {
        let mut script = self.front.script.lock().unwrap();
        script
            .posts
            .entry(key.to_owned())
            .or_default()
            .extend(answers.iter().copied());
    }

    pub fn lookups_down(&self, key: &str, down: bool) {
        mark(
            &mut self.front.script.lock().unwrap().lookups_down,
            key,
            down,
        );
    }

    pub fn lookups_hidden(&self, key: &str, hidden: bool) {
        mark(
            &mut self.front.script.lock().unwrap().lookups_hidden,
            key,
            hidden,
        );
    }

    /// Look-ups for `key` that find a charge answer it altered by `answer`.
    pub fn lookups_altered(&self, key: &str, answer: LookupAnswer) {
        let mut script = self.front.script.lock().unwrap();
        script.lookups_altered.insert(key.to_owned(), answer);
    }

    pub fn lookups_seen(&self, key: &str) -> usize {
        let script = self.front.script.lock().unwrap();
        script.lookups_seen.get(key).copied().unwrap_or(0)
    }

    pub fn posts_seen(&self, key: &str) -> usize {
        let script = self.front.script.lock().unwrap();
        script.posts_seen.get(key).copied().unwrap_or(0)
    }
}

/// Puts `key` in `keys`, or takes it out.
fn mark(keys: &mut HashSet<String>, key: &str, on: bool) {
    if on {
        keys.insert(key.to_owned());
    } else {
        keys.remove(key);
    }
}

fn status(code: u16) -> StatusCode {
    StatusCode::from_u16(code).unwrap()
}

async fn charge(State(front): State<Arc<Front>>, headers: HeaderMap, body: Bytes) -> Response {
    let key = headers
        .get("Idempotency-Key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let answer = {
        let mut script = front.script.lock().unwrap();
        *script.posts_seen.entry(key.clone()).or_default() += 1;
        script
            .posts
            .get_mut(&key)
            .and_then(VecDeque::pop_front)
            .unwrap_or(PostAnswer::Forward)
    };
    if let PostAnswer::Refuse(code) = answer {
        return (status(code), r#"{"error":"scripted"}"#).into_response();
    }
    if let PostAnswer::ChargeLate(after) = answer {
        // On a task of its own: the caller's timeout closes this connection first.
        let late = Arc::clone(&front);
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            late.charge_in_ledger(&key, body).await;
        });
        tokio::time::sleep(after * 4).await;
        return StatusCode::GATEWAY_TIMEOUT.into_response();
    }
    let relayed = front.charge_in_ledger(&key, body).await;
    let ledger_status = relayed.status();
    let ledger_body = relayed.bytes().await.unwrap();
    match answer {
        // Refusals and late charges were answered above.
        PostAnswer::Refuse(_) | PostAnswer::ChargeLate(_) | PostAnswer::Forward => (
            status(ledger_status.as_u16()),
            [("content-type", "application/json")],
            ledger_body,
        )
            .into_response(),
        PostAnswer::ChargeThen(code) => {
            let mut response = (status(code), r#"{"error":"scripted"}"#).into_response();
            if (300..400).contains(&code) {
                response
                    .headers_mut()
                    .insert("location", format!("/charges/{key}").parse().unwrap());
            }
            response
        }
        PostAnswer::ChargeThenPaddedBody(padding) => {
            const CHUNK: usize = 64 << 10;
            let mut chunks: Vec<Result<Bytes, std::io::Error>> = vec![Ok(ledger_body)];
            chunks.extend(
                (0..padding.div_ceil(CHUNK))
                    .map(|n| Ok(Bytes::from(vec![b' '; CHUNK.min(padding - n * CHUNK)]))),
            );
            (
                status(ledger_status.as_u16()),
                [("content-type", "application/json")],
                Body::from_stream(futures::stream::iter(chunks)),
            )
                .into_response()
        }
        PostAnswer::ChargeWithTransactionId(id) => {
            let mut charge: serde_json::Value = serde_json::from_slice(&ledger_body).unwrap();
            charge["transaction_id"] = id.into();
            (
                status(ledger_status.as_u16()),
                [("content-type", "application/json")],
                charge.to_string(),
            )
                .into_response()
        }
        PostAnswer::ChargeThenGarbledBody => (
            StatusCode::OK,
            [("content-type", "application/json")],
            r#"{"transaction_id": "#,
        )
            .into_response(),
        PostAnswer::ChargeThenCutBody => {
            let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
                Ok(Bytes::from_static(br#"{"transaction_id":""#)),
                Err(std::io::Error::other("connection cut by the script")),
            ];
            (
                StatusCode::OK,
                [("content-type", "application/json")],
                Body::from_stream(futures::stream::iter(chunks)),
            )
                .into_response()
        }
    }
}

async fn lookup(State(front): State<Arc<Front>>, Path(key): Path<String>) -> Response {
    let altered = {
        let mut script = front.script.lock().unwrap();
        *script.lookups_seen.entry(key.clone()).or_default() += 1;
        if script.lookups_down.contains(&key) {
            return (StatusCode::SERVICE_UNAVAILABLE, "scripted outage").into_response();
        }
        if script.lookups_hidden.contains(&key) {
            return (StatusCode::NOT_FOUND, r#"{"error":"not found"}"#).into_response();
        }
        script.lookups_altered.get(&key).cloned()
    };
    let Some(altered) = altered else {
        return relay_get(&front, &format!("{}/charges/{key}", front.ledger_url)).await;
    };
    let relayed = front
        .http
        .get(format!("{}/charges/{key}", front.ledger_url))
        .send()
        .await
        .unwrap();
    let code = relayed.status().as_u16();
    let mut entry: serde_json::Value = match relayed.json().await {
        Ok(entry) if code == 200 => entry,
        _ => return (status(code), r#"{"error":"not found"}"#).into_response(),
    };
    match altered {
        LookupAnswer::Amount(amount) => entry["amount_minor"] = amount.into(),
        LookupAnswer::Currency(currency) => entry["currency"] = currency.into(),
        LookupAnswer::Key(other) => entry["idempotency_key"] = other.into(),
    }
    (
        StatusCode::OK,
        [("content-type", "application/json")],
        entry.to_string(),
    )
        .into_response()
}

async fn whole_ledger(State(front): State<Arc<Front>>) -> Response {
    relay_get(&front, &format!("{}/charges", front.ledger_url)).await
}

async fn relay_get(front: &Front, url: &str) -> Response {
    let relayed = front.http.get(url).send().await.unwrap();
    let code = relayed.status().as_u16();
    let body = relayed.bytes().await.unwrap();
    (status(code), [("content-type", "application/json")], body).into_response()
}
