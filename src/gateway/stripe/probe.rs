//! The account probed once at start. A key Stripe refuses, or a server without
//! Stripe's routes, would otherwise fail every command the same way, retried until
//! each one's budget ran out (`status=404 class="transient"`, forever): at start it
//! is one clear message and the process ends. A probe that meets an outage (no
//! connection, a 5xx, a 429) says so and the worker starts: its commands are
//! retried as any outage's are, and the account is asked again before the first
//! charge.

use super::adapter::StripeGateway;
use super::api::{Failure, StripeCompat};

/// What the probe asked: the account (Stripe), or one page of PaymentIntents
/// (localstripe, which has no account route).
fn route(compat: StripeCompat) -> &'static str {
    match compat {
        StripeCompat::Stripe => "GET /v1/account",
        StripeCompat::Localstripe => "GET /v1/payment_intents",
    }
}

impl StripeGateway {
    /// Asks for the API key's account (with `STRIPE_COMPAT=localstripe`, for one
    /// page of PaymentIntents) and keeps the answer. `Err` is the reason the
    /// gateway cannot work as configured: the key refused (401, 403), no such
    /// route (404), or an answer that is not Stripe's. The server's own error text
    /// is left out: a server could echo the key.
    pub async fn probe(&self) -> anyhow::Result<()> {
        let asked = match self.compat {
            StripeCompat::Stripe => self.api.account_id().await.map(Some),
            StripeCompat::Localstripe => self.api.first_page().await.map(|()| None),
        };
        let failure = match asked {
            Ok(account) => {
                if let Some(account) = account {
                    tracing::info!(account = %account, mode = Self::mode(self.livemode), "the Stripe account of the API key");
                    // Kept: the first charge need not ask again.
                    let _ = self.account.set(account);
                }
                return Ok(());
            }
            Err(failure) => failure,
        };
        let route = route(self.compat);
        let base = self.api.base();
        let status = match &failure {
            Failure::Answered(answer) => Some(answer.status),
            _ => None,
        };
        match (status, &failure) {
            (Some(401), _) => anyhow::bail!(
                "Stripe at {base} refused the API key (HTTP 401) on {route}: GATEWAY_API_KEY or \
                 GATEWAY_API_KEY_FILE holds no key it accepts (revoked, mistyped, or for \
                 another server); no payment was attempted"
            ),
            (Some(403), _) => anyhow::bail!(
                "Stripe at {base} refused the API key access to {route} (HTTP 403): a \
                 restricted key needs read access to the account, which the worker reads to \
                 continue each payment under the account it started with"
            ),
            (Some(404), _) => match self.compat {
                StripeCompat::Stripe => anyhow::bail!(
                    "{base} has no {route} (HTTP 404): GATEWAY_URL is not Stripe's API base. \
                     For the localstripe test fake, which has no account route, set \
                     STRIPE_COMPAT=localstripe"
                ),
                StripeCompat::Localstripe => anyhow::bail!(
                    "{base} has no {route} (HTTP 404): GATEWAY_URL is not the base of a \
                     Stripe API (STRIPE_COMPAT=localstripe)"
                ),
            },
            (_, Failure::Unreadable(why)) => anyhow::bail!(
                "{base} answered {route} with something that is not Stripe's answer ({why}): \
                 GATEWAY_URL is not Stripe's API base"
            ),
            // The server's error text stays out of the log, as for every gateway
            // failure: the status, or what the connection met, says enough.
            (Some(status), _) => {
                tracing::warn!(status, route, "the Stripe account could not be probed at start; starting anyway, commands are retried until Stripe answers");
                Ok(())
            }
            (None, failure) => {
                tracing::warn!(%failure, route, "the Stripe account could not be probed at start; starting anyway, commands are retried until Stripe answers");
                Ok(())
            }
        }
    }
}
