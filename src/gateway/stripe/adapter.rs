//! The Stripe adapter behind [`PaymentGateway`]: the two phases of one charge, the
//! look-up that decides every unknown outcome, and the listings `audit` reads.
//!
//! Stripe replays the first answer to an `Idempotency-Key` (a 500 and a 402
//! included) for at least a day, so a retry under the same key never settles
//! anything. Every create and every confirm therefore goes out under a key of its
//! own (`<key>:create:<n>`, `<key>:confirm:<m>`, both numbers recorded before the
//! request is sent), and before either the PaymentIntents recorded for the key are
//! retrieved: the first that has charged or declined is the answer; one awaiting
//! its confirm is confirmed (never a second one made); a new one is created only
//! when none is alive. A PaymentIntent is only ever confirmed once its id is
//! recorded, so one whose create answer was lost cannot have charged: it is looked
//! for by listing the window of its recorded time (the list has no metadata filter;
//! Search is eventually consistent), and at worst stays an unconfirmed orphan.
//!
//! What each answer means:
//!
//! | answer | create | confirm |
//! |---|---|---|
//! | 2xx | record the id, then confirm | `succeeded` approved; `requires_payment_method` (failed charge) or `requires_action` declined; `processing` unknown |
//! | 402 | refused (`invalid`) | declined (`decline_code`, else `code`), the PaymentIntent cancelled |
//! | 400 `idempotency_error` | nothing charged: retry, finding it by listing | unknown: look up |
//! | 400, 404 with a Stripe error | refused (`invalid`), unless `Stripe-Should-Retry: true` | the PaymentIntent is retrieved: its state decides; still awaiting its confirm, the refusal is final |
//! | 409 | nothing charged: retry | unknown (`InFlight`): look up |
//! | 401, 403, 429, failed connect | nothing charged: retry | nothing charged: retry |
//! | 5xx, timeout, unreadable 2xx | nothing charged (an unconfirmed PaymentIntent never charges): retry | unknown: look up |

use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::StatusCode;
use sqlx::PgPool;
use tracing::field::Empty;

use super::amount::{minor_units, stripe_amount};
use super::api::{is_intent_id, Failure, IntentStatus, NewIntent, PaymentIntent, StripeApi};
use super::records::{IntentRecord, Records};
use crate::fault::{FaultPoint, Faults};
use crate::gateway::client::note_failure;
use crate::gateway::interface::StripeCompat;
use crate::gateway::interface::{
    Charge, ChargeRequest, ChargeStatus, GatewayError, LedgerEntry, PaymentGateway, Unconfirmed,
};
use crate::gateway::transport::{checked_base_url, GatewayTransport};
use crate::token::IdempotencyKey;

/// A create whose answer was lost is looked for this long either side of its
/// recorded time (Postgres's clock against Stripe's), plus the request timeout.
const LIST_WINDOW_SKEW: Duration = Duration::from_secs(300);

/// The account name used where the server has no `GET /v1/account` (localstripe).
const LOCALSTRIPE_ACCOUNT: &str = "acct_localstripe";

/// Where Stripe is and how long to wait for it.
#[derive(Debug, Clone)]
pub struct StripeOptions {
    /// The API base (`https://api.stripe.com`).
    pub base_url: String,
    /// Pinned on every request (`Stripe-Version`).
    pub api_version: String,
    /// Stripe itself, or a fake lacking parts of its API.
    pub compat: StripeCompat,
    /// Bounds a whole request.
    pub timeout: Duration,
    /// Bounds the TCP connect.
    pub connect_timeout: Duration,
}

/// `--gateway stripe`.
pub struct StripeGateway {
    api: StripeApi,
    records: Records,
    /// The key's mode: `sk_live_`/`rk_live_` or `sk_test_`/`rk_test_`.
    livemode: bool,
    compat: StripeCompat,
    /// The account the key belongs to, asked once.
    account: tokio::sync::OnceCell<String>,
    timeout: Duration,
    faults: Faults,
}

impl std::fmt::Debug for StripeGateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StripeGateway")
            .field("livemode", &self.livemode)
            .field("compat", &self.compat)
            .finish_non_exhaustive()
    }
}

/// A PaymentIntent's state, as far as one payment is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
enum IntentState {
    /// `succeeded`: charged.
    Charged,
    /// A confirm's charge failed, or the card asked for an authentication an
    /// off-session payment cannot give: final, with Stripe's reason.
    Declined(String),
    /// A confirm is still being worked on (`processing`, or a status this adapter
    /// does not know): look again later.
    InProgress,
    /// Awaits its confirm.
    Confirmable,
    /// Authorised, waiting for a manual capture this worker never makes.
    ManualCapture,
    /// Cancelled, or without a payment method: it can charge nothing any more.
    Dead,
}

fn state(intent: &PaymentIntent, recorded_decline: Option<&str>) -> IntentState {
    match intent.status {
        IntentStatus::Succeeded => IntentState::Charged,
        IntentStatus::Processing | IntentStatus::Unknown => IntentState::InProgress,
        IntentStatus::RequiresConfirmation => IntentState::Confirmable,
        IntentStatus::RequiresCapture => IntentState::ManualCapture,
        IntentStatus::RequiresAction => IntentState::Declined(
            recorded_decline
                .unwrap_or("authentication_required")
                .to_owned(),
        ),
        IntentStatus::RequiresPaymentMethod | IntentStatus::Canceled => {
            match recorded_decline
                .map(str::to_owned)
                .or_else(|| intent.failed_charge())
            {
                Some(code) => IntentState::Declined(code),
                None => IntentState::Dead,
            }
        }
    }
}

/// What the PaymentIntents recorded for a key say, the latest first.
enum Standing {
    /// Charged or declined.
    Settled(Charge, PaymentIntent),
    /// A confirm is being worked on.
    InProgress,
    /// This one awaits its confirm.
    Confirmable(IntentRecord, PaymentIntent),
    /// None is alive: a new create attempt is due.
    Nothing,
}

fn approved(intent: &PaymentIntent) -> Charge {
    Charge {
        transaction_id: intent.id.clone(),
        status: ChargeStatus::Approved,
        decline_code: None,
    }
}

fn declined(intent_id: &str, code: String) -> Charge {
    Charge {
        transaction_id: intent_id.to_owned(),
        status: ChargeStatus::Declined,
        decline_code: Some(code),
    }
}

fn created_at(intent: &PaymentIntent) -> DateTime<Utc> {
    DateTime::from_timestamp(intent.created, 0).unwrap_or_default()
}

/// `intent` as a ledger entry: its key from the metadata, its amount in minor units.
fn entry(key: &str, intent: &PaymentIntent, charge: Charge) -> LedgerEntry {
    LedgerEntry {
        idempotency_key: key.to_owned(),
        transaction_id: intent.id.clone(),
        // An amount no whole number of minor units can match no command.
        amount_minor: minor_units(intent.amount, &intent.currency).unwrap_or(i64::MIN),
        currency: intent.currency.to_ascii_uppercase(),
        status: charge.status,
        charged_at: created_at(intent),
        attempts: 1,
        decline_code: charge.decline_code,
    }
}

fn status_of(failure: &Failure) -> Option<StatusCode> {
    match failure {
        Failure::Answered(answer) => StatusCode::from_u16(answer.status).ok(),
        _ => None,
    }
}

fn records_unavailable(error: sqlx::Error) -> GatewayError {
    GatewayError::Unavailable(format!(
        "the Stripe gateway's records could not be read or written: {error}"
    ))
}

impl StripeGateway {
    /// The adapter for Stripe at `options.base_url`, with the API key of
    /// `transport` (required: its prefix tells test from live mode), recording on
    /// `records` (a pool of its own, never the payment pool).
    pub fn new(
        options: &StripeOptions,
        transport: &GatewayTransport,
        records: PgPool,
    ) -> anyhow::Result<Self> {
        let base = checked_base_url(&options.base_url)?;
        anyhow::ensure!(
            !options.timeout.is_zero() && !options.connect_timeout.is_zero(),
            "gateway timeouts must be positive"
        );
        let key = transport.api_key().ok_or_else(|| {
            anyhow::anyhow!("--gateway stripe needs GATEWAY_API_KEY or GATEWAY_API_KEY_FILE")
        })?;
        let livemode = match key.expose().get(..8) {
            Some("sk_live_" | "rk_live_") => true,
            Some("sk_test_" | "rk_test_") => false,
            _ => anyhow::bail!(
                "GATEWAY_API_KEY is not a Stripe secret or restricted key (sk_test_, sk_live_, \
                 rk_test_ or rk_live_): its mode, test or live, cannot be told"
            ),
        };
        Ok(Self {
            api: StripeApi::new(
                &base,
                &options.api_version,
                options.compat,
                options.timeout,
                options.connect_timeout,
                transport,
            )?,
            records: Records::new(records),
            livemode,
            compat: options.compat,
            account: tokio::sync::OnceCell::new(),
            timeout: options.timeout,
            faults: Faults::from_env(),
        })
    }

    /// The same adapter with `faults` armed (tests only).
    pub fn with_faults(mut self, faults: Faults) -> Self {
        self.faults = faults;
        self
    }

    fn mode(livemode: bool) -> &'static str {
        if livemode {
            "live"
        } else {
            "test"
        }
    }

    /// The account the API key belongs to (asked once).
    async fn account(&self, key: &IdempotencyKey) -> Result<&str, GatewayError> {
        self.account
            .get_or_try_init(|| async {
                match self.compat {
                    StripeCompat::Localstripe => Ok(LOCALSTRIPE_ACCOUNT.to_owned()),
                    StripeCompat::Stripe => self.api.account_id().await.map_err(|failure| {
                        let error = GatewayError::Unavailable(format!(
                            "reading the Stripe account of the API key failed: {failure}"
                        ));
                        note_failure("account", key, status_of(&failure), &error);
                        error
                    }),
                }
            })
            .await
            .map(String::as_str)
    }

    /// A payment is continued only under the account and mode it started with: a
    /// key for another one cannot see its PaymentIntents, so whether it charged is
    /// unknown to this key, and a new PaymentIntent could charge twice.
    fn check_account(
        &self,
        key: &IdempotencyKey,
        account: &str,
        records: &[IntentRecord],
    ) -> Result<(), GatewayError> {
        match records
            .iter()
            .find(|r| r.account != account || r.livemode != self.livemode)
        {
            None => Ok(()),
            Some(record) => {
                tracing::error!(
                    idempotency_key = %key,
                    started_under = %record.account,
                    "payment started under another Stripe account or mode: refused under this API key"
                );
                Err(GatewayError::UnreadableAnswer(format!(
                    "the payment was started under Stripe account {} ({} mode) and this API key \
                     is for {account} ({} mode), which cannot see its PaymentIntents: it is only \
                     continued under the account it started with",
                    record.account,
                    Self::mode(record.livemode),
                    Self::mode(self.livemode)
                )))
            }
        }
    }

    /// The PaymentIntent of one create attempt: retrieved by its recorded id, or,
    /// when the create's answer was lost, found by listing its time window.
    /// `None`: that create made none that can be found.
    async fn intent_of(
        &self,
        key: &IdempotencyKey,
        record: &IntentRecord,
    ) -> Result<Option<PaymentIntent>, GatewayError> {
        let intent = match &record.payment_intent_id {
            Some(id) if is_intent_id(id) => match self.api.retrieve(id).await {
                Ok(Some(intent)) => intent,
                Ok(None) => {
                    return Err(GatewayError::UnreadableAnswer(format!(
                        "PaymentIntent {id} recorded for this payment is unknown to this API key \
                         (another account or mode?)"
                    )))
                }
                Err(failure) => {
                    let error = GatewayError::Unavailable(format!(
                        "retrieving PaymentIntent {id} failed: {failure}"
                    ));
                    note_failure("lookup", key, status_of(&failure), &error);
                    return Err(error);
                }
            },
            Some(id) => {
                return Err(GatewayError::Protocol(format!(
                    "recorded PaymentIntent id {id:?} is not one"
                )))
            }
            None => match self.find_lost_create(key, record).await? {
                Some(intent) => intent,
                None => return Ok(None),
            },
        };
        if intent.livemode.is_some_and(|live| live != record.livemode) {
            return Err(GatewayError::UnreadableAnswer(format!(
                "PaymentIntent {} is in the other mode than the payment's",
                intent.id
            )));
        }
        Ok(Some(intent))
    }

    /// Lists the PaymentIntents created around a create attempt whose answer was
    /// lost and keeps the one whose metadata names this key and attempt.
    async fn find_lost_create(
        &self,
        key: &IdempotencyKey,
        record: &IntentRecord,
    ) -> Result<Option<PaymentIntent>, GatewayError> {
        let margin = (LIST_WINDOW_SKEW + self.timeout).as_secs() as i64;
        let at = record.requested_at.timestamp();
        let listed = self
            .api
            .list(Some((at - margin, at + margin)))
            .await
            .map_err(|failure| {
                let error = GatewayError::Unavailable(format!(
                    "listing PaymentIntents to find a create whose answer was lost failed: {failure}"
                ));
                note_failure("lookup", key, status_of(&failure), &error);
                error
            })?;
        let attempt = record.create_attempt.to_string();
        let Some(found) = listed.into_iter().find(|intent| {
            intent.metadata("idempotency_key") == Some(key.as_str())
                && intent.metadata("create_attempt") == Some(attempt.as_str())
        }) else {
            return Ok(None);
        };
        tracing::info!(idempotency_key = %key, payment_intent = %found.id, "found a PaymentIntent whose create answer was lost");
        self.records
            .record_intent(key.as_str(), record.create_attempt, &found.id)
            .await
            .map_err(records_unavailable)?;
        Ok(Some(found))
    }

    /// Reads the key's PaymentIntents, the latest attempt first, and says where
    /// the payment stands. A declined one still alive is cancelled here.
    async fn standing(
        &self,
        key: &IdempotencyKey,
        records: &[IntentRecord],
    ) -> Result<Standing, GatewayError> {
        for record in records {
            let Some(intent) = self.intent_of(key, record).await? else {
                continue;
            };
            match state(&intent, record.decline_code.as_deref()) {
                IntentState::Charged => return Ok(Standing::Settled(approved(&intent), intent)),
                IntentState::Declined(code) => {
                    let charge = self.settle_decline(key, record, &intent, code).await;
                    return Ok(Standing::Settled(charge, intent));
                }
                IntentState::InProgress => return Ok(Standing::InProgress),
                IntentState::Confirmable => {
                    return Ok(Standing::Confirmable(record.clone(), intent))
                }
                IntentState::ManualCapture => return Err(manual_capture(&intent)),
                IntentState::Dead => {}
            }
        }
        Ok(Standing::Nothing)
    }

    /// A decline is recorded, then the PaymentIntent cancelled, so nothing can
    /// confirm it later (best effort: either failing leaves the decline standing).
    async fn settle_decline(
        &self,
        key: &IdempotencyKey,
        record: &IntentRecord,
        intent: &PaymentIntent,
        code: String,
    ) -> Charge {
        if record.decline_code.is_none() {
            if let Err(error) = self
                .records
                .record_decline(key.as_str(), record.create_attempt, &code)
                .await
            {
                tracing::warn!(idempotency_key = %key, %error, "recording a decline failed");
            }
        }
        if intent.status != IntentStatus::Canceled {
            if let Err(failure) = self.api.cancel(&intent.id).await {
                tracing::warn!(idempotency_key = %key, payment_intent = %intent.id, %failure, "cancelling a declined PaymentIntent failed; audit lists it");
            }
        }
        declined(&intent.id, code)
    }

    /// The phase-one answer made for this request, or the key was reused.
    fn check_for(
        key: &IdempotencyKey,
        intent: &PaymentIntent,
        amount: i64,
        currency: &str,
    ) -> Result<(), GatewayError> {
        if intent.metadata("idempotency_key") == Some(key.as_str())
            && intent.amount == amount
            && intent.currency.eq_ignore_ascii_case(currency)
        {
            Ok(())
        } else {
            Err(GatewayError::Rejected {
                status: 422,
                reason: format!(
                    "idempotency_key_reused: PaymentIntent {} of this key was made for another amount or currency",
                    intent.id
                ),
            })
        }
    }

    /// Phase one: a new PaymentIntent under `<key>:create:<n>`, its attempt and
    /// time recorded before the request, its id recorded before anything confirms
    /// it. Whatever goes wrong, nothing is charged: an unconfirmed PaymentIntent
    /// never charges.
    async fn create(
        &self,
        key: &IdempotencyKey,
        request: &ChargeRequest,
        amount: i64,
        payment_id: uuid::Uuid,
        account: &str,
    ) -> Result<(IntentRecord, PaymentIntent), GatewayError> {
        let mut record = self
            .records
            .begin_create(key.as_str(), payment_id, account, self.livemode)
            .await
            .map_err(records_unavailable)?;
        let idempotency_key = format!("{key}:create:{}", record.create_attempt);
        let new = NewIntent {
            amount,
            currency: request.currency.to_ascii_lowercase(),
            payment_method: &request.payment_method,
            idempotency_key: key.as_str(),
            payment_id: payment_id.to_string(),
            create_attempt: record.create_attempt,
        };
        let intent = match self.api.create(&idempotency_key, &new).await {
            Ok(intent) if is_intent_id(&intent.id) => intent,
            Ok(intent) => {
                return Err(GatewayError::Protocol(format!(
                    "Stripe answered a create with id {:?}",
                    intent.id
                )))
            }
            Err(failure) => {
                let error = match &failure {
                    Failure::Answered(answer)
                        if matches!(answer.status, 400 | 402 | 404)
                            && !answer.is_idempotency_error()
                            && !answer.error_is_empty()
                            && answer.should_retry != Some(true) =>
                    {
                        GatewayError::Rejected {
                            status: answer.status,
                            reason: answer.reason.clone(),
                        }
                    }
                    _ => GatewayError::Unavailable(format!(
                        "creating the PaymentIntent failed ({failure}); nothing is charged: the \
                         next attempt looks for it, then makes another"
                    )),
                };
                note_failure("charge", key, status_of(&failure), &error);
                return Err(error);
            }
        };
        self.records
            .record_intent(key.as_str(), record.create_attempt, &intent.id)
            .await
            .map_err(|error| {
                GatewayError::Unavailable(format!(
                    "PaymentIntent {} was made but its id could not be recorded ({error}); it is \
                     not confirmed, and the next attempt finds it by listing",
                    intent.id
                ))
            })?;
        record.payment_intent_id = Some(intent.id.clone());
        Ok((record, intent))
    }

    /// Phase two: confirms `intent` under `<key>:confirm:<m>`, the count recorded
    /// first. Only an answer that says what happened is final; anything else is
    /// an unknown outcome for the look-up to decide.
    async fn confirm(
        &self,
        key: &IdempotencyKey,
        record: &IntentRecord,
        intent: &PaymentIntent,
    ) -> Result<Charge, GatewayError> {
        let attempt = self
            .records
            .begin_confirm(key.as_str(), record.create_attempt)
            .await
            .map_err(records_unavailable)?;
        let idempotency_key = format!("{key}:confirm:{attempt}");
        let failure = match self.api.confirm(&idempotency_key, &intent.id).await {
            Ok(answer) => return self.after_confirm(key, record, answer).await,
            Err(failure) => failure,
        };
        let error = match &failure {
            Failure::Answered(answer) if answer.status == 402 => {
                let code = answer
                    .error
                    .decline_code
                    .clone()
                    .or_else(|| answer.error.code.clone())
                    .unwrap_or_else(|| "card_declined".to_owned());
                let mut answered = intent.clone();
                answered.status = IntentStatus::RequiresPaymentMethod;
                return Ok(self.settle_decline(key, record, &answered, code).await);
            }
            Failure::Answered(answer) if answer.is_idempotency_error() => {
                GatewayError::UnreadableAnswer(format!("confirm of {}: {failure}", intent.id))
            }
            Failure::Answered(answer) if matches!(answer.status, 400 | 404) => {
                return self.confirm_refused(key, record, intent, &failure).await
            }
            Failure::Answered(answer) if answer.status == 409 => GatewayError::InFlight,
            Failure::Answered(answer) if matches!(answer.status, 401 | 403 | 429) => {
                GatewayError::Unavailable(format!("confirm of {}: {failure}", intent.id))
            }
            Failure::NotSent(_) => {
                GatewayError::Unavailable(format!("confirm of {}: {failure}", intent.id))
            }
            Failure::NoAnswer(_) => GatewayError::Timeout,
            // A 5xx may have charged (Stripe's rule), so may an unreadable 2xx.
            Failure::Answered(_) | Failure::Unreadable(_) => {
                GatewayError::UnreadableAnswer(format!("confirm of {}: {failure}", intent.id))
            }
        };
        note_failure("charge", key, status_of(&failure), &error);
        Err(error)
    }

    /// What a confirm's 2xx answer says.
    async fn after_confirm(
        &self,
        key: &IdempotencyKey,
        record: &IntentRecord,
        answer: PaymentIntent,
    ) -> Result<Charge, GatewayError> {
        match state(&answer, None) {
            IntentState::Charged => Ok(approved(&answer)),
            IntentState::Declined(code) => {
                Ok(self.settle_decline(key, record, &answer, code).await)
            }
            IntentState::InProgress => Err(GatewayError::InFlight),
            IntentState::ManualCapture => Err(manual_capture(&answer)),
            IntentState::Confirmable => Err(GatewayError::UnreadableAnswer(format!(
                "Stripe answered the confirm of {} with a PaymentIntent still awaiting it",
                answer.id
            ))),
            IntentState::Dead => Err(GatewayError::Unavailable(format!(
                "PaymentIntent {} was cancelled before its confirm: nothing is charged",
                answer.id
            ))),
        }
    }

    /// A confirm refused with 400 or 404: the PaymentIntent's own state decides
    /// (it may have moved since it was read). A cancelled one is final for it: it
    /// is never confirmed again, and the next attempt makes a new one.
    async fn confirm_refused(
        &self,
        key: &IdempotencyKey,
        record: &IntentRecord,
        intent: &PaymentIntent,
        failure: &Failure,
    ) -> Result<Charge, GatewayError> {
        let now = match self.api.retrieve(&intent.id).await {
            Ok(Some(now)) => now,
            _ => {
                let error = GatewayError::UnreadableAnswer(format!(
                    "confirm of {} refused ({failure}) and the PaymentIntent could not be read",
                    intent.id
                ));
                note_failure("charge", key, status_of(failure), &error);
                return Err(error);
            }
        };
        match state(&now, record.decline_code.as_deref()) {
            IntentState::Confirmable => {
                // The request itself is refused: final. Cancel the PaymentIntent so
                // it does not linger as an orphan.
                if let Err(cancel) = self.api.cancel(&now.id).await {
                    tracing::warn!(idempotency_key = %key, %cancel, "cancelling a refused PaymentIntent failed");
                }
                let (status, reason) = match failure {
                    Failure::Answered(answer) => (answer.status, answer.reason.clone()),
                    other => (400, other.to_string()),
                };
                let error = GatewayError::Rejected { status, reason };
                note_failure("charge", key, status_of(failure), &error);
                Err(error)
            }
            _ => self.after_confirm(key, record, now).await,
        }
    }

    /// The charge: see the module documentation.
    async fn charge_payment(
        &self,
        key: &IdempotencyKey,
        request: &ChargeRequest,
    ) -> Result<Charge, GatewayError> {
        let amount = stripe_amount(request.amount_minor, &request.currency).map_err(|reason| {
            GatewayError::Rejected {
                status: 400,
                reason,
            }
        })?;
        let payment_id = request.payment_id.ok_or_else(|| {
            GatewayError::Protocol("a Stripe charge needs the id of its payment row".to_owned())
        })?;
        let account = self.account(key).await?;
        let records = self
            .records
            .of(key.as_str())
            .await
            .map_err(records_unavailable)?;
        self.check_account(key, account, &records)?;
        match self.standing(key, &records).await? {
            Standing::Settled(charge, intent) => {
                Self::check_for(key, &intent, amount, &request.currency)?;
                return Ok(charge);
            }
            Standing::InProgress => return Err(GatewayError::InFlight),
            Standing::Confirmable(record, intent) => {
                Self::check_for(key, &intent, amount, &request.currency)?;
                return self.confirm(key, &record, &intent).await;
            }
            Standing::Nothing => {}
        }
        let (record, intent) = self
            .create(key, request, amount, payment_id, account)
            .await?;
        if let Err(fault) = self.faults.hit(FaultPoint::AfterCreate, key.as_str()).await {
            return Err(GatewayError::Unavailable(fault.to_string()));
        }
        match state(&intent, None) {
            IntentState::Confirmable => self.confirm(key, &record, &intent).await,
            _ => self.after_confirm(key, &record, intent).await,
        }
    }

    /// Every PaymentIntent this worker made (metadata names a key).
    async fn ours(&self) -> Result<Vec<(String, PaymentIntent)>, GatewayError> {
        let listed = self.api.list(None).await.map_err(|failure| {
            GatewayError::Unavailable(format!("listing PaymentIntents failed: {failure}"))
        })?;
        Ok(listed
            .into_iter()
            .filter_map(|intent| {
                let key = intent.metadata("idempotency_key")?.to_owned();
                Some((key, intent))
            })
            .collect())
    }
}

fn manual_capture(intent: &PaymentIntent) -> GatewayError {
    GatewayError::Rejected {
        status: 400,
        reason: format!(
            "manual_capture_not_supported: PaymentIntent {} waits for a manual capture, which \
             this worker never makes",
            intent.id
        ),
    }
}

#[async_trait::async_trait]
impl PaymentGateway for StripeGateway {
    #[tracing::instrument(
        name = "gateway charge",
        skip_all,
        fields(
            otel.name = "stripe charge",
            otel.kind = "client",
            gateway.kind = "stripe",
            http.response.status_code = Empty,
            gateway.status = Empty,
        )
    )]
    async fn charge(
        &self,
        key: &IdempotencyKey,
        request: &ChargeRequest,
    ) -> Result<Charge, GatewayError> {
        let charge = self.charge_payment(key, request).await?;
        tracing::Span::current().record("gateway.status", charge.status.as_str());
        Ok(charge)
    }

    #[tracing::instrument(
        name = "gateway lookup",
        skip_all,
        fields(
            otel.name = "stripe lookup",
            otel.kind = "client",
            gateway.kind = "stripe",
            http.response.status_code = Empty,
        )
    )]
    async fn lookup(&self, key: &IdempotencyKey) -> Result<Option<LedgerEntry>, GatewayError> {
        let records = self
            .records
            .of(key.as_str())
            .await
            .map_err(records_unavailable)?;
        if records.is_empty() {
            return Ok(None);
        }
        let account = self.account(key).await?;
        self.check_account(key, account, &records)?;
        match self.standing(key, &records).await? {
            Standing::Settled(charge, intent) => Ok(Some(entry(key.as_str(), &intent, charge))),
            Standing::InProgress | Standing::Confirmable(..) | Standing::Nothing => Ok(None),
        }
    }

    async fn ledger(&self) -> Result<Vec<LedgerEntry>, GatewayError> {
        Ok(self
            .ours()
            .await?
            .into_iter()
            .filter_map(|(key, intent)| {
                let charge = match state(&intent, None) {
                    IntentState::Charged => approved(&intent),
                    IntentState::Declined(code) => declined(&intent.id, code),
                    _ => return None,
                };
                Some(entry(&key, &intent, charge))
            })
            .collect())
    }

    fn accepts(&self, request: &ChargeRequest) -> Result<(), String> {
        stripe_amount(request.amount_minor, &request.currency).map(|_| ())
    }

    async fn unconfirmed(&self) -> Result<Vec<Unconfirmed>, GatewayError> {
        Ok(self
            .ours()
            .await?
            .into_iter()
            .filter(|(_, intent)| {
                matches!(state(intent, None), IntentState::Confirmable)
                    || (intent.status == IntentStatus::RequiresPaymentMethod
                        && state(intent, None) == IntentState::Dead)
            })
            .map(|(key, intent)| Unconfirmed {
                idempotency_key: key,
                amount_minor: minor_units(intent.amount, &intent.currency).unwrap_or(i64::MIN),
                currency: intent.currency.to_ascii_uppercase(),
                created_at: created_at(&intent),
                id: intent.id,
            })
            .collect())
    }

    async fn cancel_unconfirmed(&self, unconfirmed: &Unconfirmed) -> Result<(), GatewayError> {
        if !is_intent_id(&unconfirmed.id) {
            return Err(GatewayError::Protocol(format!(
                "{:?} is no PaymentIntent id",
                unconfirmed.id
            )));
        }
        match self.api.cancel(&unconfirmed.id).await {
            Ok(_) => Ok(()),
            Err(Failure::Answered(answer)) if answer.status == 400 => {
                // Cancelled meanwhile, or confirmed by a worker first.
                match self.api.retrieve(&unconfirmed.id).await {
                    Ok(Some(now)) if now.status == IntentStatus::Canceled => Ok(()),
                    Ok(Some(now)) => Err(GatewayError::Rejected {
                        status: 400,
                        reason: format!("no longer unconfirmed: {:?}", now.status),
                    }),
                    _ => Err(GatewayError::Unavailable(answer.reason)),
                }
            }
            Err(failure) => Err(GatewayError::Unavailable(failure.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn intent(status: &str, extra: serde_json::Value) -> PaymentIntent {
        let mut value = serde_json::json!({
            "id": "pi_1", "amount": 100, "currency": "usd", "status": status, "created": 1,
            "metadata": {"idempotency_key": "k"},
        });
        if let (Some(object), Some(extra)) = (value.as_object_mut(), extra.as_object()) {
            object.extend(extra.clone());
        }
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn each_status_means_what_the_payment_needs() {
        let none = serde_json::json!({});
        assert_eq!(
            state(&intent("succeeded", none.clone()), None),
            IntentState::Charged
        );
        assert_eq!(
            state(&intent("requires_confirmation", none.clone()), None),
            IntentState::Confirmable
        );
        assert_eq!(
            state(&intent("processing", none.clone()), None),
            IntentState::InProgress
        );
        assert_eq!(
            state(&intent("some_new_status", none.clone()), None),
            IntentState::InProgress
        );
        assert_eq!(
            state(&intent("requires_capture", none.clone()), None),
            IntentState::ManualCapture
        );
        assert_eq!(
            state(&intent("canceled", none.clone()), None),
            IntentState::Dead
        );
        let failed = serde_json::json!({"last_payment_error": {"code": "card_declined", "decline_code": "insufficient_funds"}});
        assert_eq!(
            state(&intent("requires_payment_method", failed.clone()), None),
            IntentState::Declined("insufficient_funds".into())
        );
        // Cancelled after the decline: still a decline.
        assert_eq!(
            state(&intent("canceled", failed), None),
            IntentState::Declined("insufficient_funds".into())
        );
        let charged_object =
            serde_json::json!({"latest_charge": {"id": "ch_1", "status": "failed"}});
        assert_eq!(
            state(&intent("canceled", charged_object), None),
            IntentState::Declined("declined".into())
        );
        assert_eq!(
            state(&intent("canceled", none.clone()), Some("card_declined")),
            IntentState::Declined("card_declined".into())
        );
        assert_eq!(
            state(&intent("requires_action", none), None),
            IntentState::Declined("authentication_required".into())
        );
    }
}
