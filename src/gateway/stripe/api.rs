//! Stripe's HTTP API as the adapter uses it: PaymentIntents created, confirmed,
//! retrieved, listed and cancelled, and the account a key belongs to. Every request
//! pins `Stripe-Version`; every POST carries the `Idempotency-Key` its caller made.
//! What an answer means for a payment is decided in `adapter.rs`, not here.

use std::collections::HashSet;
use std::time::Duration;

use reqwest::StatusCode;
use serde::Deserialize;

use super::super::bodies::{error_text, read_body, BodyError, ONE_ANSWER};
use super::super::client::{reason_from_body, record_status, trace_headers, unreadable_json};
use super::super::transport::{describe, GatewayTransport};

/// Stripe-compatible servers that lack parts of Stripe's API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum StripeCompat {
    /// Stripe itself.
    #[default]
    #[value(help = None::<&str>)]
    Stripe,
    /// localstripe, the test fake: no `off_session` on a confirm, no `created`
    /// filter on the list (the whole list is paged), no `GET /v1/account`.
    #[value(help = None::<&str>)]
    Localstripe,
}

/// `key` when the worker could have made a request under it: a valid idempotency
/// key holding no card number (what `metadata[idempotency_key]` must be for a
/// PaymentIntent or a refund to be the worker's).
pub(super) fn worker_key(key: &str) -> Option<&str> {
    crate::token::IdempotencyKey::check(key).ok()?;
    (!crate::redaction::contains_card_number(key)).then_some(key)
}

/// A PaymentIntent id as Stripe makes them; anything else never reaches a URL path.
pub(super) fn is_intent_id(id: &str) -> bool {
    id.starts_with("pi_")
        && id.len() <= 255
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Where a PaymentIntent stands (Stripe's `status`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum IntentStatus {
    RequiresPaymentMethod,
    RequiresConfirmation,
    RequiresAction,
    Processing,
    RequiresCapture,
    Canceled,
    Succeeded,
    #[serde(other)]
    Unknown,
}

/// Why the last confirm failed (`last_payment_error`). A code the worker could not
/// keep (`gateway/ids.rs`) is left out, as the `charges` adapter's are.
#[derive(Debug, Clone, Default, Deserialize)]
pub(super) struct PaymentError {
    #[serde(default, deserialize_with = "super::super::ids::decline_code")]
    pub code: Option<String>,
    #[serde(default, deserialize_with = "super::super::ids::decline_code")]
    pub decline_code: Option<String>,
}

impl PaymentError {
    /// `decline_code`, else `code`.
    pub fn reason(&self) -> Option<String> {
        self.decline_code.clone().or_else(|| self.code.clone())
    }
}

/// The fields of a PaymentIntent the adapter reads; everything else is ignored
/// (Stripe adds fields; its fakes lack some).
#[derive(Debug, Clone, Deserialize)]
pub(super) struct PaymentIntent {
    pub id: String,
    pub amount: i64,
    pub currency: String,
    pub status: IntentStatus,
    /// Unix seconds, Stripe's clock.
    pub created: i64,
    #[serde(default)]
    pub livemode: Option<bool>,
    #[serde(default)]
    pub metadata: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    pub last_payment_error: Option<PaymentError>,
    /// An id, or the charge itself where a server expands it: present once a
    /// confirm made a charge (a failed one included).
    #[serde(default)]
    pub latest_charge: Option<serde_json::Value>,
}

impl PaymentIntent {
    /// A metadata value, when it is text.
    pub fn metadata(&self, name: &str) -> Option<&str> {
        self.metadata.get(name).and_then(|v| v.as_str())
    }

    /// The key this worker made it under, when it is one of this worker's: its
    /// metadata holds a key the worker could have taken (no card number), the
    /// payment's id and the create attempt, as the worker writes them. A Stripe
    /// account may be shared: another integration's PaymentIntent with an
    /// `idempotency_key` of its own is not ours to book, audit or cancel.
    pub fn made_by_worker(&self) -> Option<&str> {
        let key = worker_key(self.metadata("idempotency_key")?)?;
        self.metadata("payment_id")?.parse::<uuid::Uuid>().ok()?;
        self.metadata("create_attempt")?.parse::<u32>().ok()?;
        Some(key)
    }

    /// Whether a confirm of it made a charge that failed: a decline, even once
    /// the PaymentIntent was cancelled afterwards.
    pub fn failed_charge(&self) -> Option<String> {
        if let Some(error) = &self.last_payment_error {
            return Some(error.reason().unwrap_or_else(|| "declined".to_owned()));
        }
        self.latest_charge
            .as_ref()
            .filter(|charge| !charge.is_null())
            .map(|_| "declined".to_owned())
    }
}

/// Stripe's error object (`{"error": {...}}`), as far as the adapter reads it. Its
/// codes are kept (a decline's code goes to the payment's row and result) only when
/// a row can hold them and they hold no card number, as `PaymentError`'s.
#[derive(Debug, Clone, Default, Deserialize)]
pub(super) struct ErrorBody {
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    #[serde(default, deserialize_with = "super::super::ids::decline_code")]
    pub code: Option<String>,
    #[serde(default, deserialize_with = "super::super::ids::decline_code")]
    pub decline_code: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
}

#[derive(Deserialize)]
struct ErrorEnvelope {
    error: ErrorBody,
}

/// How a Stripe request failed.
#[derive(Debug)]
pub(super) enum Failure {
    /// Nothing was sent (the connection could not be made).
    NotSent(String),
    /// The request may have reached Stripe and no answer came back.
    NoAnswer(String),
    /// Stripe answered with an error status.
    Answered(Answer),
    /// A 2xx whose body is not what was asked for.
    Unreadable(String),
    /// A listing that stopped before its end (its page limit, or a server that
    /// repeats a page): what it did not read is unknown, so it proves nothing.
    Incomplete(String),
}

/// An error answer: status, Stripe's error object (empty when the body was not
/// one), and the retry advice headers.
#[derive(Debug)]
pub(super) struct Answer {
    pub status: u16,
    pub error: ErrorBody,
    /// `Stripe-Should-Retry`, when sent.
    pub should_retry: Option<bool>,
    /// `Idempotent-Replayed: true`: the first answer to this key, not a new attempt.
    pub replayed: bool,
    /// Shown to operators: code and message, card numbers masked, shortened.
    pub reason: String,
}

impl Answer {
    pub fn is_idempotency_error(&self) -> bool {
        self.error.kind.as_deref() == Some("idempotency_error")
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotSent(text) => write!(f, "not sent: {text}"),
            Self::NoAnswer(text) => write!(f, "no answer: {text}"),
            Self::Answered(answer) => {
                let replayed = if answer.replayed { " (replayed)" } else { "" };
                write!(f, "HTTP {}{replayed}: {}", answer.status, answer.reason)
            }
            Self::Unreadable(text) => write!(f, "unreadable answer: {text}"),
            Self::Incomplete(text) => write!(f, "incomplete listing: {text}"),
        }
    }
}

/// What a create sends.
pub(super) struct NewIntent<'a> {
    pub amount: i64,
    /// Lower case, as Stripe writes it.
    pub currency: String,
    pub payment_method: &'a str,
    pub idempotency_key: &'a str,
    pub payment_id: String,
    pub create_attempt: i32,
}

/// The HTTP side of the adapter.
pub(super) struct StripeApi {
    http: reqwest::Client,
    base: String,
    version: String,
    compat: StripeCompat,
    /// A listing never reads more pages than this.
    pub max_pages: usize,
}

/// Page size of the list endpoint (Stripe's maximum).
const PAGE: &str = "100";
/// The pages a listing reads at most unless told otherwise: a million
/// PaymentIntents, and a bound on a server that loops on a cursor.
const MAX_PAGES: usize = 10_000;

impl StripeApi {
    pub fn new(
        base: &str,
        version: &str,
        compat: StripeCompat,
        timeout: Duration,
        connect_timeout: Duration,
        transport: &GatewayTransport,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            http: transport.client(base, timeout, connect_timeout)?,
            base: base.to_owned(),
            version: version.to_owned(),
            compat,
            max_pages: MAX_PAGES,
        })
    }

    fn intents_url(&self) -> String {
        format!("{}/v1/payment_intents", self.base)
    }

    pub(super) fn post(
        &self,
        url: String,
        idempotency_key: Option<&str>,
    ) -> reqwest::RequestBuilder {
        let request = self
            .http
            .post(url)
            .header("Stripe-Version", &self.version)
            .headers(trace_headers());
        match idempotency_key {
            Some(key) => request.header("Idempotency-Key", key),
            None => request,
        }
    }

    pub(super) fn get(&self, url: String) -> reqwest::RequestBuilder {
        self.http
            .get(url)
            .header("Stripe-Version", &self.version)
            .headers(trace_headers())
    }

    /// `POST /v1/payment_intents` under `Idempotency-Key: idempotency_key`.
    pub async fn create(
        &self,
        idempotency_key: &str,
        intent: &NewIntent<'_>,
    ) -> Result<PaymentIntent, Failure> {
        let attempt = intent.create_attempt.to_string();
        let amount = intent.amount.to_string();
        let form = [
            ("amount", amount.as_str()),
            ("currency", intent.currency.as_str()),
            ("payment_method", intent.payment_method),
            ("capture_method", "automatic"),
            ("metadata[idempotency_key]", intent.idempotency_key),
            ("metadata[payment_id]", intent.payment_id.as_str()),
            ("metadata[create_attempt]", attempt.as_str()),
        ];
        send(
            self.post(self.intents_url(), Some(idempotency_key))
                .form(&form),
        )
        .await
    }

    /// `POST /v1/payment_intents/{id}/confirm` under `Idempotency-Key:
    /// idempotency_key`, off session (nobody is there to authenticate).
    pub async fn confirm(&self, idempotency_key: &str, id: &str) -> Result<PaymentIntent, Failure> {
        let url = format!("{}/{id}/confirm", self.intents_url());
        let form: &[(&str, &str)] = match self.compat {
            StripeCompat::Stripe => &[("off_session", "true")],
            StripeCompat::Localstripe => &[],
        };
        send(self.post(url, Some(idempotency_key)).form(form)).await
    }

    /// `POST /v1/payment_intents/{id}/cancel`.
    pub async fn cancel(&self, id: &str) -> Result<PaymentIntent, Failure> {
        let url = format!("{}/{id}/cancel", self.intents_url());
        let empty: &[(&str, &str)] = &[];
        send(self.post(url, None).form(empty)).await
    }

    /// `GET /v1/payment_intents/{id}`; `None` when Stripe has no such
    /// PaymentIntent for this key's account and mode.
    pub async fn retrieve(&self, id: &str) -> Result<Option<PaymentIntent>, Failure> {
        match send(self.get(format!("{}/{id}", self.intents_url()))).await {
            Err(Failure::Answered(answer)) if answer.status == 404 && !answer.error_is_empty() => {
                Ok(None)
            }
            other => other.map(Some),
        }
    }

    /// Every PaymentIntent created within `window` (Unix seconds, both ends
    /// included), or every one when `window` is `None`, paged to the end, and
    /// Stripe's clock when it answered the first page. Stripe's list has no
    /// metadata filter: the caller filters. A listing that cannot reach the end
    /// (more pages than `max_pages`, a server repeating a page) is a failure,
    /// never a shorter list.
    pub async fn list(&self, window: Option<(i64, i64)>) -> Result<Listing, Failure> {
        let filter = match (window, self.compat) {
            (Some((from, to)), StripeCompat::Stripe) => {
                vec![
                    ("created[gte]", from.to_string()),
                    ("created[lte]", to.to_string()),
                ]
            }
            // localstripe refuses the filter: page everything, filter below.
            _ => Vec::new(),
        };
        let (mut found, served_at): (Vec<PaymentIntent>, _) =
            self.page_through(self.intents_url(), &filter).await?;
        if let Some((from, to)) = window {
            found.retain(|intent| (from..=to).contains(&intent.created));
        }
        Ok(Listing {
            intents: found,
            served_at,
        })
    }

    /// Every object at `url` (a Stripe list endpoint) matching `filter`, paged to
    /// the end, and Stripe's clock when it answered the first page. A listing
    /// that cannot reach the end (more pages than `max_pages`, a server
    /// repeating a page) is a failure, never a shorter list.
    pub(super) async fn page_through<T: Listed>(
        &self,
        url: String,
        filter: &[(&str, String)],
    ) -> Result<(Vec<T>, Option<i64>), Failure> {
        let mut found = Vec::new();
        let mut seen = HashSet::new();
        let mut after: Option<String> = None;
        let mut served_at = None;
        for page_number in 0..self.max_pages {
            let mut query: Vec<(&str, String)> = vec![("limit", PAGE.to_owned())];
            query.extend(filter.iter().map(|(k, v)| (*k, v.clone())));
            if let Some(after) = &after {
                query.push(("starting_after", after.clone()));
            }
            let (page, date): (ListPage<T>, _) =
                send_dated(self.get(url.clone()).query(&query)).await?;
            if page_number == 0 {
                served_at = date;
            }
            let mut new = 0;
            for object in page.data {
                if seen.insert(object.id().to_owned()) {
                    after = Some(object.id().to_owned());
                    new += 1;
                    found.push(object);
                }
            }
            if !page.has_more {
                return Ok((found, served_at));
            }
            // A server that starts over on a cursor it does not know repeats ids.
            if new == 0 {
                return Err(Failure::Incomplete(format!(
                    "stopped at page {}: the server answered it with objects already \
                     listed and says more follow",
                    page_number + 1
                )));
            }
        }
        Err(Failure::Incomplete(format!(
            "stopped at its page limit of {} pages ({} objects) before the end",
            self.max_pages,
            found.len()
        )))
    }

    /// One page of PaymentIntents (`GET /v1/payment_intents?limit=1`): whether the
    /// key is taken and the route is there.
    pub async fn first_page(&self) -> Result<(), Failure> {
        let _: ListPage<PaymentIntent> =
            send(self.get(self.intents_url()).query(&[("limit", "1")])).await?;
        Ok(())
    }

    /// The API base, as configured (it holds no credentials: they are refused in
    /// it).
    pub fn base(&self) -> &str {
        &self.base
    }

    /// `GET /v1/account`: the id of the account the API key belongs to.
    pub async fn account_id(&self) -> Result<String, Failure> {
        #[derive(Deserialize)]
        struct Account {
            id: String,
        }
        let account: Account = send(self.get(format!("{}/v1/account", self.base))).await?;
        Ok(account.id)
    }
}

/// What a listing read.
pub(super) struct Listing {
    pub intents: Vec<PaymentIntent>,
    /// Stripe's clock (its `Date` header, Unix seconds) when it answered the first
    /// page: every PaymentIntent created before that second was in the listing.
    pub served_at: Option<i64>,
}

#[derive(Deserialize)]
#[serde(bound = "T: serde::de::DeserializeOwned")]
struct ListPage<T> {
    data: Vec<T>,
    #[serde(default)]
    has_more: bool,
}

/// An object of a Stripe list: its id is the cursor of the next page.
pub(super) trait Listed: serde::de::DeserializeOwned {
    fn id(&self) -> &str;
}

impl Listed for PaymentIntent {
    fn id(&self) -> &str {
        &self.id
    }
}

impl Answer {
    /// The body was no Stripe error (a proxy's page, a router's 404).
    pub fn error_is_empty(&self) -> bool {
        self.error.kind.is_none() && self.error.code.is_none() && self.error.message.is_none()
    }
}

/// Sends `request` and reads a 2xx body as `T`; anything else is a [`Failure`].
pub(super) async fn send<T: serde::de::DeserializeOwned>(
    request: reqwest::RequestBuilder,
) -> Result<T, Failure> {
    send_dated(request).await.map(|(body, _)| body)
}

/// [`send`], with the server's clock at the answer (its `Date` header, Unix
/// seconds) when it sent a readable one.
async fn send_dated<T: serde::de::DeserializeOwned>(
    request: reqwest::RequestBuilder,
) -> Result<(T, Option<i64>), Failure> {
    let response = request.send().await.map_err(|error| {
        if error.is_connect() {
            Failure::NotSent(describe(&error))
        } else {
            Failure::NoAnswer(describe(&error))
        }
    })?;
    let status = response.status();
    record_status(status);
    if status.is_success() {
        let date = response
            .headers()
            .get(reqwest::header::DATE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| chrono::DateTime::parse_from_rfc2822(v).ok())
            .map(|date| date.timestamp());
        let bytes = read_body(response, ONE_ANSWER)
            .await
            .map_err(|error| match error {
                BodyError::Transport(_) => Failure::NoAnswer(error.describe()),
                BodyError::TooLarge { .. } => Failure::Unreadable(error.describe()),
            })?;
        let body = serde_json::from_slice(&bytes)
            .map_err(|error| Failure::Unreadable(unreadable_json(&error)))?;
        return Ok((body, date));
    }
    Err(Failure::Answered(read_error(status, response).await))
}

async fn read_error(status: StatusCode, response: reqwest::Response) -> Answer {
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_ascii_lowercase)
    };
    let should_retry = header("stripe-should-retry").map(|v| v == "true");
    let replayed = header("idempotent-replayed").is_some_and(|v| v == "true");
    let body = error_text(response).await;
    let error = serde_json::from_str::<ErrorEnvelope>(&body)
        .map(|e| e.error)
        .unwrap_or_default();
    let text = match (&error.code, &error.decline_code, &error.message) {
        (None, None, None) => body,
        (code, decline, message) => [code, decline, message]
            .into_iter()
            .flatten()
            .cloned()
            .collect::<Vec<_>>()
            .join(": "),
    };
    Answer {
        status: status.as_u16(),
        error,
        should_retry,
        replayed,
        reason: reason_from_body(text),
    }
}

#[cfg(test)]
mod tests {
    use super::PaymentIntent;

    fn intent(metadata: serde_json::Value) -> PaymentIntent {
        serde_json::from_value(serde_json::json!({
            "id": "pi_1", "amount": 500, "currency": "usd", "status": "succeeded",
            "created": 1_700_000_000, "metadata": metadata,
        }))
        .unwrap()
    }

    #[test]
    fn an_error_code_a_row_cannot_keep_is_left_out() {
        let body = |decline_code: &str| {
            serde_json::from_value::<super::ErrorEnvelope>(serde_json::json!({
                "error": {"type": "card_error", "code": "card_declined", "decline_code": decline_code}
            }))
            .map(|envelope| envelope.error)
            .unwrap_or_default()
        };
        assert_eq!(
            body("insufficient_funds").decline_code.as_deref(),
            Some("insufficient_funds")
        );
        for unkeepable in ["4111 1111 1111 1111", "a\0b", &"x".repeat(300)] {
            let error = body(unkeepable);
            assert_eq!(error.decline_code, None, "{unkeepable:?}");
            assert_eq!(error.code.as_deref(), Some("card_declined"));
        }
    }

    /// A shared Stripe account: only what the worker wrote is the worker's.
    #[test]
    fn only_a_payment_intent_with_the_workers_metadata_is_the_workers() {
        let ours = serde_json::json!({
            "idempotency_key": "order-77",
            "payment_id": "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
            "create_attempt": "0",
        });
        assert_eq!(intent(ours.clone()).made_by_worker(), Some("order-77"));
        let mut others = vec![
            serde_json::json!({"idempotency_key": "order-77"}),
            serde_json::json!({"idempotency_key": "order-77", "payment_id": "42", "create_attempt": "0"}),
        ];
        for (field, value) in [
            ("create_attempt", "first"),
            ("idempotency_key", "order 77"),
            ("idempotency_key", "4111111111111111"),
        ] {
            let mut other = ours.clone();
            other[field] = value.into();
            others.push(other);
        }
        for other in others {
            assert_eq!(intent(other.clone()).made_by_worker(), None, "{other}");
        }
    }
}
