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
//! Search is eventually consistent), and at worst stays an unconfirmed orphan. What
//! a listing covered is remembered (`listed.rs`); one that stops short fails.
//!
//! The caller's lease is checked right before the create and right before every
//! confirm (`LeaseGuard`), each of which may come seconds after the charge began:
//! two holders' PaymentIntents have keys of their own, so Stripe cannot join their
//! confirms, and only the lease keeps a holder that was replaced meanwhile from
//! charging a second time. A check that does not pass sends nothing.
//!
//! What each answer means:
//!
//! | answer | create | confirm |
//! |---|---|---|
//! | 2xx | record the id, then confirm | `succeeded` approved; `requires_payment_method` (failed charge) or `requires_action` declined; `processing` unknown |
//! | 402 | refused (`invalid`) | declined (`decline_code`, else `code`), the PaymentIntent cancelled |
//! | 400 `idempotency_error` | nothing charged: retry, finding it by listing | unknown: look up |
//! | 400, 404 with a Stripe error | refused (`invalid`), unless `Stripe-Should-Retry: true` | the PaymentIntent is retrieved: its state decides; still awaiting its confirm, the refusal is final |
//! | 4xx (but 409) without a Stripe error (a proxy's page) | nothing charged: retry | unknown: look up |
//! | 409 | nothing charged: retry | unknown (`InFlight`): look up |
//! | 401, 403, 429 (with a Stripe error), failed connect | nothing charged: retry | nothing charged: retry |
//! | 5xx, timeout, unreadable 2xx | nothing charged (an unconfirmed PaymentIntent never charges): retry | unknown: look up |
//!
//! Refunds (`refunds.rs`) go out under attempt keys of their own too
//! (`<key>:refund:<n>`), found again by listing the PaymentIntent's refunds.
//!
//! At start the account is probed (`probe.rs`): a key Stripe refuses or a server
//! without its routes ends the command with a message instead.

use std::time::Duration;

use reqwest::StatusCode;
use sqlx::PgPool;
use tracing::field::Empty;

use super::amount::{minor_units, stripe_amount};
use super::api::{is_intent_id, Failure, IntentStatus, PaymentIntent, StripeApi, StripeCompat};
use super::intent_state::{approved, created_at, declined, entry, state, IntentState, Standing};
use super::listed::Listed;
use super::records::{IntentRecord, Records};
use crate::fault::{FaultPoint, Faults};
use crate::gateway::client::note_failure;
use crate::gateway::interface::{
    Charge, ChargeRequest, GatewayError, LeaseGuard, LedgerEntry, PaymentGateway, Unconfirmed,
};
use crate::gateway::refunds::{RefundEntry, RefundRequest};
use crate::gateway::transport::{checked_base_url, GatewayTransport};
use crate::token::IdempotencyKey;

/// A create whose answer was lost is looked for this long either side of its
/// recorded time (Postgres's clock against Stripe's), plus the request timeout.
pub(super) const LIST_WINDOW_SKEW: Duration = Duration::from_secs(300);

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
    pub(super) api: StripeApi,
    pub(super) records: Records,
    /// The key's mode: `sk_live_`/`rk_live_` or `sk_test_`/`rk_test_`.
    pub(super) livemode: bool,
    pub(super) compat: StripeCompat,
    /// The account the key belongs to, asked once.
    pub(super) account: tokio::sync::OnceCell<String>,
    /// What listings for lost creates already covered.
    pub(super) listed: Listed,
    pub(super) timeout: Duration,
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

pub(super) fn status_of(failure: &Failure) -> Option<StatusCode> {
    match failure {
        Failure::Answered(answer) => StatusCode::from_u16(answer.status).ok(),
        _ => None,
    }
}

pub(super) fn records_unavailable(error: sqlx::Error) -> GatewayError {
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
            listed: Listed::default(),
            timeout: options.timeout,
            faults: Faults::from_env(),
        })
    }

    /// The same adapter with `faults` armed (tests only).
    pub fn with_faults(mut self, faults: Faults) -> Self {
        self.faults = faults;
        self
    }

    /// The same adapter reading at most `pages` pages (of 100 PaymentIntents) per
    /// listing, instead of 10,000.
    pub fn with_list_page_limit(mut self, pages: usize) -> Self {
        self.api.max_pages = pages.max(1);
        self
    }

    pub(super) fn mode(livemode: bool) -> &'static str {
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

    /// The charge: see the module documentation. `lease` is checked right before
    /// the create and before the confirm, each of which may come seconds after the
    /// charge began.
    async fn charge_payment(
        &self,
        key: &IdempotencyKey,
        request: &ChargeRequest,
        lease: &dyn LeaseGuard,
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
                return self.confirm(key, &record, &intent, lease).await;
            }
            Standing::Nothing => {}
        }
        let (record, intent) = self
            .create(key, request, amount, payment_id, account, lease)
            .await?;
        if let Err(fault) = self.faults.hit(FaultPoint::AfterCreate, key.as_str()).await {
            return Err(GatewayError::Unavailable(fault.to_string()));
        }
        match state(&intent, None) {
            IntentState::Confirmable => self.confirm(key, &record, &intent, lease).await,
            _ => self.after_confirm(key, &record, intent).await,
        }
    }

    /// Every PaymentIntent this worker made (its metadata as the worker writes it).
    async fn ours(&self) -> Result<Vec<(String, PaymentIntent)>, GatewayError> {
        let listed = self.api.list(None).await.map_err(|failure| {
            GatewayError::Unavailable(format!("listing PaymentIntents failed: {failure}"))
        })?;
        Ok(listed
            .intents
            .into_iter()
            .filter_map(|intent| {
                let key = intent.made_by_worker()?.to_owned();
                Some((key, intent))
            })
            .collect())
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
        lease: &dyn LeaseGuard,
    ) -> Result<Charge, GatewayError> {
        let charge = self.charge_payment(key, request, lease).await?;
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

    #[tracing::instrument(
        name = "gateway refund",
        skip_all,
        fields(
            otel.name = "stripe refund",
            otel.kind = "client",
            gateway.kind = "stripe",
            http.response.status_code = Empty,
            gateway.status = Empty,
        )
    )]
    async fn refund(
        &self,
        key: &IdempotencyKey,
        request: &RefundRequest,
        lease: &dyn LeaseGuard,
    ) -> Result<Charge, GatewayError> {
        let answer = self.refund_payment(key, request, lease).await?;
        tracing::Span::current().record("gateway.status", answer.status.as_str());
        Ok(answer)
    }

    #[tracing::instrument(
        name = "gateway refund lookup",
        skip_all,
        fields(
            otel.name = "stripe refund lookup",
            otel.kind = "client",
            gateway.kind = "stripe",
            http.response.status_code = Empty,
        )
    )]
    async fn lookup_refund(
        &self,
        key: &IdempotencyKey,
        request: &RefundRequest,
    ) -> Result<Option<RefundEntry>, GatewayError> {
        self.find_refund(key, request).await
    }

    async fn refunds(&self) -> Result<Vec<RefundEntry>, GatewayError> {
        self.our_refunds().await
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
