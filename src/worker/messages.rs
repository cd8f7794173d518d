//! The wire formats of the answers (docs/CONTRACT.md, "Messages"): the result
//! record and the dead-letter header names. Pure formats: the publisher builds the
//! records, `dead_letter.rs` assembles a dead letter's headers, `inbound.rs` reads
//! commands.

use rdkafka::message::{Message, OwnedHeaders, OwnedMessage};
use uuid::Uuid;

use crate::payment::{OriginalAnswer, SourcePosition};

/// One record on the results topic: a command's outcome.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ResultRecord {
    /// The command's key, when it had a readable one.
    pub idempotency_key: Option<String>,
    /// The payment's id, when there is one.
    pub payment_id: Option<Uuid>,
    /// The refund's id, on a refund's answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refund_id: Option<Uuid>,
    /// `succeeded`, `declined`, `duplicate` or `rejected`; for a refund `refunded`,
    /// `refund_declined`, `duplicate` or `rejected`.
    pub outcome: String,
    /// The gateway's transaction id, when charged or declined.
    pub gateway_transaction_id: Option<String>,
    /// Why it was rejected.
    pub reason: Option<String>,
    /// The command record this answers.
    pub source: SourcePosition,
    /// On a `duplicate`: the first answer, like a cached response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original: Option<OriginalAnswer>,
    /// `true` when a charge may exist for this command that no payment row records
    /// (its dead letter says `x-charge-unknown: true`, and `audit` lists it): a client
    /// reading only results must not resubmit it under a new key, or it may pay twice.
    /// Absent otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub charge_unknown: bool,
}

/// Dead-letter header: the rejection's code.
pub const ERROR_KIND: &str = "x-error-kind";
/// Dead-letter header: the reason, in words.
pub const ERROR_REASON: &str = "x-error-reason";
pub const SOURCE_TOPIC: &str = "x-source-topic";
pub const SOURCE_PARTITION: &str = "x-source-partition";
pub const SOURCE_OFFSET: &str = "x-source-offset";
/// Dead-letter header: attempts made.
pub const ATTEMPTS: &str = "x-attempts";
/// `true` when a charge may exist that no payment row records: on a dead letter
/// whose command ended without a booked answer after an attempt that may have
/// charged (a timeout, a 5xx after the POST, a panic after it, a look-up that could
/// not answer, a takeover of a holder's expired lease, a record flagged so), or whose
/// charge the database refused to record (absent otherwise). Read back as evidence
/// on a redriven record.
pub const CHARGE_UNKNOWN: &str = "x-charge-unknown";
/// On a dead letter whose value was masked: what was masked (`card_number`).
pub const PAYLOAD_REDACTED: &str = "x-payload-redacted";
/// Header on a dead letter whose value could not be kept.
pub const PAYLOAD_DROPPED: &str = "x-payload-dropped";
/// The dropped value's size in bytes.
pub const ORIGINAL_SIZE: &str = "x-original-size";
/// On a dead letter still too large without its value: what else of the original
/// record was left out (`key,headers`).
pub const ORIGINAL_DROPPED: &str = "x-original-dropped";

/// On a dead letter or result whose record key is not echoed as it came (it held a
/// card number and is masked, or it was too large for a result): the hex
/// HMAC-SHA256 of the key as it came under the operators' secret
/// (`KEY_HASH_SECRET_FILE`), to correlate (`payment-worker key-hash`).
pub const KEY_HMAC_SHA256: &str = "x-key-hmac-sha256";
/// What earlier versions wrote instead, an unkeyed SHA-256: stripped like the
/// worker's other headers, never carried on.
pub const LEGACY_KEY_SHA256: &str = "x-key-sha256";
/// On a dead letter: the producer's headers that held a card number (in name or
/// value) and were masked, by their masked names, comma-separated.
pub const HEADERS_REDACTED: &str = "x-headers-redacted";

/// The headers this worker writes on a dead letter; a redrive strips them again,
/// and a dead letter never carries a client's own copy of one (in any letter
/// case): a `x-payload-dropped` sent with a command would make `dlq redrive` pass
/// its dead letter over as altered.
const DEAD_LETTER_HEADERS: [&str; 14] = [
    ERROR_KIND,
    ERROR_REASON,
    SOURCE_TOPIC,
    SOURCE_PARTITION,
    SOURCE_OFFSET,
    ATTEMPTS,
    CHARGE_UNKNOWN,
    PAYLOAD_REDACTED,
    PAYLOAD_DROPPED,
    ORIGINAL_SIZE,
    ORIGINAL_DROPPED,
    KEY_HMAC_SHA256,
    LEGACY_KEY_SHA256,
    HEADERS_REDACTED,
];

/// A record's headers, names kept as raw bytes, without the dead-letter headers
/// (for a dead letter of a redriven record, and for the redrive itself).
pub fn without_dead_letter_headers(message: &OwnedMessage) -> Option<OwnedHeaders> {
    let original = message.headers()?;
    Some(crate::kafka_headers::copy_without(
        original,
        &DEAD_LETTER_HEADERS,
    ))
}

#[cfg(test)]
mod tests {
    use rdkafka::message::{Header, Headers, Timestamp};

    use super::*;

    #[test]
    fn a_clients_copy_of_a_dead_letter_header_is_stripped_in_any_letter_case() {
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "X-Payload-Dropped",
                value: Some("card_number"),
            })
            .insert(Header {
                key: ORIGINAL_DROPPED,
                value: Some("key,headers"),
            })
            .insert(Header {
                key: "X-Error-Kind",
                value: Some("invalid"),
            })
            .insert(Header {
                key: "traceparent",
                value: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
            });
        let message = OwnedMessage::new(
            Some(b"{}".to_vec()),
            Some(b"k".to_vec()),
            "payments.commands".into(),
            Timestamp::now(),
            0,
            0,
            Some(headers),
        );
        let kept = without_dead_letter_headers(&message).expect("headers");
        let names: Vec<&str> = kept.iter().map(|h| h.key).collect();
        assert_eq!(names, vec!["traceparent"]);
    }
}
