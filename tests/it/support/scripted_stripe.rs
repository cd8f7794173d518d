//! A Stripe-like server for what localstripe cannot show: it keeps the first
//! answer to each `Idempotency-Key` and replays it (a 500 included) with
//! `Idempotent-Replayed: true`, as Stripe does; it has an account per API key;
//! its list is newest first and filters on `created`; and a scripted create or
//! confirm can do its work and then answer 500, or answer 500 without doing it,
//! or decline with a `decline_code`, or answer with a proxy's page instead of
//! Stripe's error. A request can be held at the door (before any work) until the
//! test lets it in, so an interleaving of two workers is made, not hoped for.
//! Charges are counted per idempotency key, so a second charge is observed, not
//! inferred.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};

/// How the server answers one scripted create or confirm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scripted {
    /// Do the work (create the PaymentIntent, or charge it), then answer 500.
    ServerErrorAfterWork,
    /// Answer 500 without doing anything.
    ServerErrorBeforeWork,
    /// A confirm declined with this `decline_code` (402 `card_error`).
    Decline(&'static str),
    /// Answer this status with an error of this `type`, and `Stripe-Should-Retry`
    /// when given, without doing anything.
    Refuse(u16, &'static str, Option<bool>),
    /// Answer this status with an HTML page, as a proxy in front of Stripe does,
    /// without doing anything.
    ProxyPage(u16),
}

/// Which requests a hold applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `POST /v1/payment_intents` for the key in its metadata.
    Create,
    /// `GET /v1/payment_intents/{id}` of this id.
    Retrieve,
}

/// A request held at the door, before the server did anything for it: the test
/// learns it arrived, makes what it wants happen meanwhile, then lets it in.
#[derive(Clone)]
pub struct Gate {
    arrived: Arc<tokio::sync::Semaphore>,
    released: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Gate {
    fn new() -> Self {
        Self {
            arrived: Arc::new(tokio::sync::Semaphore::new(0)),
            released: Arc::new(tokio::sync::watch::Sender::new(false)),
        }
    }

    /// Waits until the held request has arrived (at most 30 s).
    pub async fn arrival(&self) {
        tokio::time::timeout(std::time::Duration::from_secs(30), self.arrived.acquire())
            .await
            .expect("the held request never arrived")
            .unwrap()
            .forget();
    }

    /// Lets the held request in.
    pub fn release(&self) {
        self.released.send_replace(true);
    }

    async fn hold(&self) {
        let mut released = self.released.subscribe();
        self.arrived.add_permits(1);
        let _ = released.wait_for(|released| *released).await;
    }
}

struct Hold {
    route: Route,
    subject: String,
    /// Matching requests still let through before the held one.
    skip: usize,
    gate: Gate,
}

/// The `created` bounds one list request asked for.
pub type ListWindow = (Option<i64>, Option<i64>);

/// One create or confirm as it arrived: what the adapter must send on each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    pub idempotency_key: String,
    pub stripe_version: Option<String>,
    /// A confirm's `off_session` field; `None` on a create.
    pub off_session: Option<String>,
    /// The trace context headers it carried (`traceparent`, `tracestate`,
    /// `baggage`), as they came.
    pub trace_headers: Vec<(String, String)>,
}

#[derive(Clone)]
struct Intent {
    id: String,
    account: String,
    amount: i64,
    currency: String,
    status: &'static str,
    created: i64,
    metadata: serde_json::Map<String, Value>,
    last_payment_error: Option<Value>,
}

impl Intent {
    fn json(&self) -> Value {
        json!({
            "id": self.id, "object": "payment_intent", "amount": self.amount,
            "currency": self.currency, "status": self.status, "created": self.created,
            "livemode": false, "metadata": self.metadata,
            "last_payment_error": self.last_payment_error,
        })
    }
}

#[derive(Default)]
struct Books {
    intents: Vec<Intent>,
    /// (account, Idempotency-Key) → the first answer.
    replies: HashMap<(String, String), Reply>,
    /// Every create or confirm received, replays included.
    received: Vec<Received>,
    /// Charges made, per metadata idempotency key.
    charges: HashMap<String, usize>,
    creates: HashMap<String, VecDeque<Scripted>>,
    confirms: HashMap<String, VecDeque<Scripted>>,
    accounts: HashMap<String, String>,
    holds: Vec<Hold>,
    /// Every request of any kind, refused ones included.
    requests: usize,
    retrieves: usize,
    lists: usize,
    /// The `created` bounds of every list request, in order.
    list_windows: Vec<ListWindow>,
    next_id: u64,
}

pub struct ScriptedStripe {
    books: Arc<Mutex<Books>>,
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ScriptedStripe {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Status, body and `Stripe-Should-Retry` of one answer.
type Reply = (u16, String, Option<bool>);

fn error(status: u16, kind: &str, code: Option<&str>, decline: Option<&str>) -> Reply {
    let body = json!({"error": {"type": kind, "code": code, "decline_code": decline,
        "message": format!("scripted {kind}")}});
    (status, body.to_string(), None)
}

fn ok(body: Value) -> Reply {
    (200, body.to_string(), None)
}

fn answer((status, body, should_retry): Reply, replayed: bool) -> Response {
    let content_type = if body.starts_with('<') {
        "text/html"
    } else {
        "application/json"
    };
    let mut response = (
        StatusCode::from_u16(status).unwrap(),
        [("content-type", content_type)],
        body,
    )
        .into_response();
    if replayed {
        response
            .headers_mut()
            .insert("idempotent-replayed", "true".parse().unwrap());
    }
    if let Some(retry) = should_retry {
        response
            .headers_mut()
            .insert("stripe-should-retry", retry.to_string().parse().unwrap());
    }
    response
}

fn refused(status: u16, kind: &str, should_retry: Option<bool>) -> Reply {
    let (status, body, _) = error(status, kind, None, None);
    (status, body, should_retry)
}

/// A proxy's error page: no Stripe error object in it.
fn proxy_page(status: u16) -> Reply {
    let body = format!(
        "<html><head><title>{status}</title></head><body><center><h1>{status}</h1></center>\
         <hr><center>nginx</center></body></html>"
    );
    (status, body, None)
}

/// The gate of the hold on `route` for `subject`, when this request is the held
/// one; a hold with requests left to skip counts this one off instead.
fn held(books: &Mutex<Books>, route: Route, subject: &str) -> Option<Gate> {
    let mut books = books.lock().unwrap();
    let at = books
        .holds
        .iter()
        .position(|h| h.route == route && h.subject == subject)?;
    if books.holds[at].skip > 0 {
        books.holds[at].skip -= 1;
        return None;
    }
    Some(books.holds.remove(at).gate)
}

impl ScriptedStripe {
    /// Serves on a random port; `accounts` maps API keys to account ids.
    pub async fn start(accounts: &[(&str, &str)]) -> Self {
        let books = Arc::new(Mutex::new(Books {
            accounts: accounts
                .iter()
                .map(|(k, a)| ((*k).to_owned(), (*a).to_owned()))
                .collect(),
            ..Books::default()
        }));
        let app = Router::new()
            .route("/v1/account", get(account))
            .route("/v1/payment_intents", post(create).get(list))
            .route("/v1/payment_intents/{id}", get(retrieve))
            .route("/v1/payment_intents/{id}/confirm", post(confirm))
            .route("/v1/payment_intents/{id}/cancel", post(cancel))
            .with_state(Arc::clone(&books));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self { books, addr, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The next creates for payments of `key` are answered so, in order.
    pub fn script_creates(&self, key: &str, answers: &[Scripted]) {
        let mut books = self.books.lock().unwrap();
        books
            .creates
            .entry(key.to_owned())
            .or_default()
            .extend(answers);
    }

    /// The next confirms for payments of `key` are answered so, in order.
    pub fn script_confirms(&self, key: &str, answers: &[Scripted]) {
        let mut books = self.books.lock().unwrap();
        books
            .confirms
            .entry(key.to_owned())
            .or_default()
            .extend(answers);
    }

    /// Charges made for `key`.
    pub fn charges(&self, key: &str) -> usize {
        self.books
            .lock()
            .unwrap()
            .charges
            .get(key)
            .copied()
            .unwrap_or(0)
    }

    /// (id, status) of every PaymentIntent made for `key`, oldest first.
    pub fn intents(&self, key: &str) -> Vec<(String, String)> {
        self.books
            .lock()
            .unwrap()
            .intents
            .iter()
            .filter(|i| i.metadata.get("idempotency_key").and_then(Value::as_str) == Some(key))
            .map(|i| (i.id.clone(), i.status.to_owned()))
            .collect()
    }

    /// Every create or confirm Idempotency-Key received for `key`, in order.
    pub fn keys_seen(&self, key: &str) -> Vec<String> {
        self.received(key)
            .into_iter()
            .map(|r| r.idempotency_key)
            .collect()
    }

    /// Every create or confirm received for `key`, in order.
    pub fn received(&self, key: &str) -> Vec<Received> {
        let prefix = format!("{key}:");
        self.books
            .lock()
            .unwrap()
            .received
            .iter()
            .filter(|r| r.idempotency_key.starts_with(&prefix))
            .cloned()
            .collect()
    }

    /// Requests of any kind received.
    pub fn requests(&self) -> usize {
        self.books.lock().unwrap().requests
    }

    pub fn retrieves(&self) -> usize {
        self.books.lock().unwrap().retrieves
    }

    pub fn lists(&self) -> usize {
        self.books.lock().unwrap().lists
    }

    /// The `created` bounds of every list request so far, in order.
    pub fn list_windows(&self) -> Vec<ListWindow> {
        self.books.lock().unwrap().list_windows.clone()
    }

    /// Holds the `skip + 1`-th next request on `route` for `subject` (a key for
    /// creates, a PaymentIntent id for retrieves) at the door until the returned
    /// gate is released.
    pub fn hold(&self, route: Route, subject: &str, skip: usize) -> Gate {
        let gate = Gate::new();
        self.books.lock().unwrap().holds.push(Hold {
            route,
            subject: subject.to_owned(),
            skip,
            gate: gate.clone(),
        });
        gate
    }

    /// `count` PaymentIntents of other payments under `account`, created now and
    /// awaiting their confirm: the rest of a busy account, for listings to page.
    pub fn crowd(&self, account: &str, count: usize) {
        let mut books = self.books.lock().unwrap();
        for n in 0..count {
            books.next_id += 1;
            let intent = Intent {
                id: format!("pi_scripted{:06}", books.next_id),
                account: account.to_owned(),
                amount: 100,
                currency: "usd".to_owned(),
                status: "requires_confirmation",
                created: chrono::Utc::now().timestamp(),
                metadata: [(
                    "idempotency_key".to_owned(),
                    Value::String(format!("someone-else-{n}")),
                )]
                .into_iter()
                .collect(),
                last_payment_error: None,
            };
            books.intents.push(intent);
        }
    }
}

type Shared = State<Arc<Mutex<Books>>>;

fn account_of(books: &Books, headers: &HeaderMap) -> Option<String> {
    let key = headers
        .get("authorization")?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")?;
    books.accounts.get(key).cloned()
}

fn unauthorized() -> Response {
    answer(error(401, "invalid_request_error", None, None), false)
}

fn form(body: &Bytes) -> HashMap<String, String> {
    url::form_urlencoded::parse(body).into_owned().collect()
}

async fn account(State(books): Shared, headers: HeaderMap) -> Response {
    let mut books = books.lock().unwrap();
    books.requests += 1;
    match account_of(&books, &headers) {
        Some(id) => answer(ok(json!({"id": id})), false),
        None => unauthorized(),
    }
}

/// Replays the first answer to `(account, key)`, or runs `work` and keeps its answer.
fn once(
    books: &mut Books,
    account: &str,
    headers: &HeaderMap,
    off_session: Option<String>,
    work: impl FnOnce(&mut Books) -> Reply,
) -> Response {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let key = header("idempotency-key").unwrap_or_default();
    let trace_headers = ["traceparent", "tracestate", "baggage"]
        .iter()
        .flat_map(|name| {
            headers.get_all(*name).iter().map(move |value| {
                (
                    (*name).to_owned(),
                    String::from_utf8_lossy(value.as_bytes()).into_owned(),
                )
            })
        })
        .collect();
    books.received.push(Received {
        idempotency_key: key.clone(),
        stripe_version: header("stripe-version"),
        off_session,
        trace_headers,
    });
    if let Some(first) = books.replies.get(&(account.to_owned(), key.clone())) {
        return answer(first.clone(), true);
    }
    let reply = work(books);
    if !key.is_empty() {
        books
            .replies
            .insert((account.to_owned(), key), reply.clone());
    }
    answer(reply, false)
}

async fn create(State(books): Shared, headers: HeaderMap, body: Bytes) -> Response {
    let params = form(&body);
    let for_key = params
        .get("metadata[idempotency_key]")
        .cloned()
        .unwrap_or_default();
    if let Some(gate) = held(&books, Route::Create, &for_key) {
        gate.hold().await;
    }
    let mut books = books.lock().unwrap();
    books.requests += 1;
    let Some(account) = account_of(&books, &headers) else {
        return unauthorized();
    };
    let owner = account.clone();
    once(&mut books, &account, &headers, None, move |books| {
        let scripted = books
            .creates
            .get_mut(&for_key)
            .and_then(VecDeque::pop_front);
        match scripted {
            Some(Scripted::ServerErrorBeforeWork) => return error(500, "api_error", None, None),
            Some(Scripted::Refuse(status, kind, retry)) => return refused(status, kind, retry),
            Some(Scripted::ProxyPage(status)) => return proxy_page(status),
            _ => {}
        }
        books.next_id += 1;
        let metadata = params
            .iter()
            .filter_map(|(k, v)| {
                let name = k.strip_prefix("metadata[")?.strip_suffix(']')?;
                Some((name.to_owned(), Value::String(v.clone())))
            })
            .collect();
        let intent = Intent {
            id: format!("pi_scripted{:06}", books.next_id),
            account: owner,
            amount: params
                .get("amount")
                .and_then(|a| a.parse().ok())
                .unwrap_or(0),
            currency: params.get("currency").cloned().unwrap_or_default(),
            status: "requires_confirmation",
            created: chrono::Utc::now().timestamp(),
            metadata,
            last_payment_error: None,
        };
        let reply = ok(intent.json());
        books.intents.push(intent);
        match scripted {
            Some(Scripted::ServerErrorAfterWork) => error(500, "api_error", None, None),
            _ => reply,
        }
    })
}

fn intent_index(books: &Books, account: &str, id: &str) -> Option<usize> {
    books
        .intents
        .iter()
        .position(|i| i.id == id && i.account == account)
}

async fn confirm(
    State(books): Shared,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut books = books.lock().unwrap();
    books.requests += 1;
    let Some(account) = account_of(&books, &headers) else {
        return unauthorized();
    };
    let account_for_work = account.clone();
    let off_session = form(&body).remove("off_session");
    once(&mut books, &account, &headers, off_session, move |books| {
        let Some(at) = intent_index(books, &account_for_work, &id) else {
            return error(404, "invalid_request_error", Some("resource_missing"), None);
        };
        if books.intents[at].status != "requires_confirmation" {
            return error(
                400,
                "invalid_request_error",
                Some("payment_intent_unexpected_state"),
                None,
            );
        }
        let key = books.intents[at]
            .metadata
            .get("idempotency_key")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        match books.confirms.get_mut(&key).and_then(VecDeque::pop_front) {
            Some(Scripted::ServerErrorBeforeWork) => error(500, "api_error", None, None),
            Some(Scripted::Refuse(status, kind, retry)) => refused(status, kind, retry),
            Some(Scripted::ProxyPage(status)) => proxy_page(status),
            Some(Scripted::Decline(code)) => {
                let intent = &mut books.intents[at];
                intent.status = "requires_payment_method";
                intent.last_payment_error = Some(
                    json!({"type": "card_error", "code": "card_declined", "decline_code": code}),
                );
                error(402, "card_error", Some("card_declined"), Some(code))
            }
            scripted => {
                books.intents[at].status = "succeeded";
                *books.charges.entry(key).or_default() += 1;
                if scripted == Some(Scripted::ServerErrorAfterWork) {
                    error(500, "api_error", None, None)
                } else {
                    ok(books.intents[at].json())
                }
            }
        }
    })
}

async fn cancel(State(books): Shared, Path(id): Path<String>, headers: HeaderMap) -> Response {
    let mut books = books.lock().unwrap();
    books.requests += 1;
    let Some(account) = account_of(&books, &headers) else {
        return unauthorized();
    };
    let Some(at) = intent_index(&books, &account, &id) else {
        return answer(
            error(404, "invalid_request_error", Some("resource_missing"), None),
            false,
        );
    };
    let intent = &mut books.intents[at];
    if intent.status == "succeeded" || intent.status == "canceled" {
        return answer(
            error(
                400,
                "invalid_request_error",
                Some("payment_intent_unexpected_state"),
                None,
            ),
            false,
        );
    }
    intent.status = "canceled";
    answer(ok(intent.json()), false)
}

async fn retrieve(State(books): Shared, Path(id): Path<String>, headers: HeaderMap) -> Response {
    if let Some(gate) = held(&books, Route::Retrieve, &id) {
        gate.hold().await;
    }
    let mut books = books.lock().unwrap();
    books.requests += 1;
    let Some(account) = account_of(&books, &headers) else {
        return unauthorized();
    };
    books.retrieves += 1;
    match intent_index(&books, &account, &id) {
        Some(at) => answer(ok(books.intents[at].json()), false),
        None => answer(
            error(404, "invalid_request_error", Some("resource_missing"), None),
            false,
        ),
    }
}

async fn list(State(books): Shared, headers: HeaderMap, RawQuery(query): RawQuery) -> Response {
    let mut books = books.lock().unwrap();
    books.requests += 1;
    let Some(account) = account_of(&books, &headers) else {
        return unauthorized();
    };
    books.lists += 1;
    let query: HashMap<String, String> =
        url::form_urlencoded::parse(query.unwrap_or_default().as_bytes())
            .into_owned()
            .collect();
    let number = |name: &str| query.get(name).and_then(|v| v.parse::<i64>().ok());
    let limit = number("limit").unwrap_or(10).clamp(1, 100) as usize;
    books
        .list_windows
        .push((number("created[gte]"), number("created[lte]")));
    let (from, to) = (
        number("created[gte]").unwrap_or(i64::MIN),
        number("created[lte]").unwrap_or(i64::MAX),
    );
    // Newest first, as Stripe lists.
    let matching: Vec<&Intent> = books
        .intents
        .iter()
        .rev()
        .filter(|i| i.account == account && (from..=to).contains(&i.created))
        .collect();
    let start = match query.get("starting_after") {
        Some(after) => matching
            .iter()
            .position(|i| &i.id == after)
            .map_or(matching.len(), |p| p + 1),
        None => 0,
    };
    let page: Vec<Value> = matching[start..]
        .iter()
        .take(limit)
        .map(|i| i.json())
        .collect();
    let has_more = start + page.len() < matching.len();
    answer(
        ok(json!({"object": "list", "data": page, "has_more": has_more})),
        false,
    )
}
