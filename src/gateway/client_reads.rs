//! The reads of the `charges` protocol, shared by charges and refunds: one entry
//! by key (`GET /charges/{key}`, `GET /refunds/{key}`) and a whole listing
//! (`GET /charges`, `GET /refunds`). Asking changes nothing at the gateway, so
//! every failure is transient except a refusal of the request itself.

use reqwest::StatusCode;

use super::bodies::{LISTING, ONE_ANSWER};
use super::client::{
    idempotent_request_error, idempotent_request_error_or, note_failure, read_json, record_status,
    trace_headers, HttpGateway, MIN_LEDGER_TIMEOUT,
};
use super::interface::{GatewayError, LedgerEntry};
use crate::token::IdempotencyKey;

/// An entry of a listing (`GET /charges`, `GET /refunds`): made under a key, at a time.
pub(super) trait KeyedEntry: serde::de::DeserializeOwned {
    fn idempotency_key(&self) -> &str;
    fn made_at(&self) -> chrono::DateTime<chrono::Utc>;
}

impl KeyedEntry for LedgerEntry {
    fn idempotency_key(&self) -> &str {
        &self.idempotency_key
    }

    fn made_at(&self) -> chrono::DateTime<chrono::Utc> {
        self.charged_at
    }
}

impl HttpGateway {
    /// Look-up for keys made only of dots: `.` and `..` are dot segments that every
    /// URL parser folds away (`/charges/..` is `/`), even percent-encoded, so they
    /// are asked for through the listing at `collection` filtered by key instead.
    async fn lookup_via_listing<T: KeyedEntry>(
        &self,
        collection: &reqwest::Url,
        key: &IdempotencyKey,
    ) -> Result<Option<T>, GatewayError> {
        let response = self
            .http
            .get(collection.clone())
            .query(&[("idempotency_key", key.as_str())])
            .send()
            .await
            .map_err(idempotent_request_error)?;
        if !response.status().is_success() {
            return Err(Self::read_error_from(response).await);
        }
        let entries: Vec<T> = read_json(response, LISTING)
            .await
            .map_err(idempotent_request_error_or)?;
        Ok(entries
            .into_iter()
            .filter(|entry| entry.idempotency_key() == key.as_str())
            .max_by_key(|entry| entry.made_at()))
    }

    /// `GET {collection}/{key}`: the entry made under `key`, `None` on 404
    /// (`operation` names the call in failure counts).
    pub(super) async fn lookup_at<T: KeyedEntry>(
        &self,
        collection: &reqwest::Url,
        operation: &'static str,
        key: &IdempotencyKey,
    ) -> Result<Option<T>, GatewayError> {
        if key.as_str().bytes().all(|b| b == b'.') {
            return self.lookup_via_listing(collection, key).await;
        }
        // The key alphabet [A-Za-z0-9._:-] is all URL-safe in a path segment; an
        // http(s) URL always takes one more.
        let mut url = collection.clone();
        if let Ok(mut segments) = url.path_segments_mut() {
            segments.push(key.as_str());
        }
        let response = match self.http.get(url).headers(trace_headers()).send().await {
            Ok(response) => response,
            Err(error) => {
                let error = idempotent_request_error(error);
                note_failure(operation, key, None, &error);
                return Err(error);
            }
        };
        let status = response.status();
        record_status(status);
        if status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let found = if status.is_success() {
            read_json(response, ONE_ANSWER)
                .await
                .map(Some)
                .map_err(idempotent_request_error_or)
        } else {
            Err(Self::read_error_from(response).await)
        };
        if let Err(error) = &found {
            note_failure(operation, key, Some(status), error);
        }
        found
    }

    /// `GET {collection}`: every entry, with the long timeout of a dump.
    pub(super) async fn list_at<T: KeyedEntry>(
        &self,
        collection: &reqwest::Url,
    ) -> Result<Vec<T>, GatewayError> {
        let response = self
            .http
            .get(collection.clone())
            .timeout(self.timeout.max(MIN_LEDGER_TIMEOUT))
            .send()
            .await
            .map_err(idempotent_request_error)?;
        if !response.status().is_success() {
            return Err(Self::read_error_from(response).await);
        }
        read_json(response, LISTING)
            .await
            .map_err(idempotent_request_error_or)
    }
}
