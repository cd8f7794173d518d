//! The lease check the processor hands to the gateway's charge: the adapter asks it
//! right before each POST that may create or charge, so a worker paused, cut off
//! from Postgres or behind a Redis that lost its token since it reserved sends
//! nothing once another holder may own the key.

use std::sync::PoisonError;

use super::*;
use crate::gateway::{LeaseGuard, LeaseLoss};

/// Whether the first check of a charge may skip its round trip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FirstCheck {
    /// A first attempt that reaches its first POST well inside the lease it was
    /// just granted: nobody can have taken over a live lease, so asking Redis would
    /// only cost a round trip.
    MaySkipWhileSurelyHeld,
    /// The attempt looked the charge up first (fence > 1, an unresolved charge,
    /// `--gateway-lookup always`): it asks.
    Asks,
}

/// The attempt's lease, checked (and renewed) by `extend` when an adapter is about
/// to POST. Only the first check of a charge may skip the round trip; every later
/// one asks (Stripe's confirm after its create): the shortcut trusts Redis to keep
/// the token, and after a Redis loss two holders' confirms of two PaymentIntents
/// are two charges no idempotency key can join. A first POST is harmless to skip
/// for: the charges gateway joins two holders' POSTs by their shared key, and
/// Stripe's first is a create (no charge) or the confirm of a PaymentIntent already
/// recorded (one charge at most, whoever confirms it).
pub(super) struct LeaseCheck<'a> {
    tokens: &'a dyn TokenStore,
    key: &'a IdempotencyKey,
    claim: &'a Claim,
    /// Until when the first check may skip its round trip; taken by the first check.
    skip_until: Mutex<Option<tokio::time::Instant>>,
}

impl<'a> LeaseCheck<'a> {
    pub(super) fn new(
        tokens: &'a dyn TokenStore,
        key: &'a IdempotencyKey,
        lease: &'a Lease<'a>,
        first: FirstCheck,
    ) -> Self {
        let skip_until = match first {
            FirstCheck::MaySkipWhileSurelyHeld => Some(lease.surely_held_until),
            FirstCheck::Asks => None,
        };
        Self {
            tokens,
            key,
            claim: lease.claim,
            skip_until: Mutex::new(skip_until),
        }
    }

    async fn ask(&self) -> Result<(), LeaseLoss> {
        match self
            .tokens
            .extend(self.key, self.claim)
            .instrument(token_span("extend"))
            .await
        {
            Ok(Transition::Applied) => Ok(()),
            Ok(Transition::Refused) => Err(LeaseLoss::Lost),
            Err(error) => {
                token_failure("extend", &error);
                Err(LeaseLoss::Unchecked(error.to_string()))
            }
        }
    }
}

#[async_trait::async_trait]
impl LeaseGuard for LeaseCheck<'_> {
    async fn check(&self) -> Result<(), LeaseLoss> {
        let skip_until = self
            .skip_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let surely_held = skip_until.is_some_and(|until| tokio::time::Instant::now() < until);
        if surely_held {
            return Ok(());
        }
        self.ask().await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::token::{IssueOutcome, LockOutcome, TokenPolicy, TokenView};

    /// Answers every `extend` with `answer`, counting them; nothing else is asked.
    struct Extends {
        answer: fn() -> Result<Transition, TokenError>,
        asked: AtomicUsize,
        policy: TokenPolicy,
    }

    fn unused() -> TokenError {
        TokenError::Corrupt("not asked by a lease check".to_owned())
    }

    #[async_trait::async_trait]
    impl TokenStore for Extends {
        fn policy(&self) -> &TokenPolicy {
            &self.policy
        }
        async fn issue(&self, _: &IdempotencyKey, _: Duration) -> Result<IssueOutcome, TokenError> {
            Err(unused())
        }
        async fn consume(&self, _: &IdempotencyKey) -> Result<bool, TokenError> {
            Err(unused())
        }
        async fn lock(
            &self,
            _: &IdempotencyKey,
            _: &str,
            _: Duration,
        ) -> Result<LockOutcome, TokenError> {
            Err(unused())
        }
        async fn release(&self, _: &IdempotencyKey, _: &str) -> Result<bool, TokenError> {
            Err(unused())
        }
        async fn reserve(&self, _: &IdempotencyKey, _: &str) -> Result<Reservation, TokenError> {
            Err(unused())
        }
        async fn reserve_reclaiming(
            &self,
            _: &IdempotencyKey,
            _: &str,
            _: &str,
        ) -> Result<Reservation, TokenError> {
            Err(unused())
        }
        async fn confirm(
            &self,
            _: &IdempotencyKey,
            _: &Claim,
            _: Uuid,
            _: &str,
        ) -> Result<Transition, TokenError> {
            Err(unused())
        }
        async fn restore(&self, _: &IdempotencyKey, _: &Claim) -> Result<Transition, TokenError> {
            Err(unused())
        }
        async fn extend(&self, _: &IdempotencyKey, _: &Claim) -> Result<Transition, TokenError> {
            self.asked.fetch_add(1, Ordering::SeqCst);
            (self.answer)()
        }
        async fn show(&self, _: &IdempotencyKey) -> Result<Option<TokenView>, TokenError> {
            Err(unused())
        }
        async fn expired_leases(&self, _: usize) -> Result<Vec<IdempotencyKey>, TokenError> {
            Err(unused())
        }
    }

    fn store(answer: fn() -> Result<Transition, TokenError>) -> Extends {
        Extends {
            answer,
            asked: AtomicUsize::new(0),
            policy: TokenPolicy::default(),
        }
    }

    fn claim() -> Claim {
        Claim {
            owner: "w:1".to_owned(),
            fence: 1,
        }
    }

    #[tokio::test]
    async fn only_the_first_check_of_a_surely_held_lease_skips_the_round_trip() {
        let tokens = store(|| Ok(Transition::Applied));
        let key = IdempotencyKey::try_from("k-1").unwrap();
        let claim = claim();
        let lease = Lease {
            claim: &claim,
            surely_held_until: tokio::time::Instant::now() + Duration::from_secs(60),
        };
        let check = LeaseCheck::new(&tokens, &key, &lease, FirstCheck::MaySkipWhileSurelyHeld);
        assert_eq!(check.check().await, Ok(()));
        assert_eq!(
            tokens.asked.load(Ordering::SeqCst),
            0,
            "the create: skipped"
        );
        assert_eq!(check.check().await, Ok(()));
        assert_eq!(check.check().await, Ok(()));
        assert_eq!(
            tokens.asked.load(Ordering::SeqCst),
            2,
            "every later POST asks"
        );

        let asks = LeaseCheck::new(&tokens, &key, &lease, FirstCheck::Asks);
        assert_eq!(asks.check().await, Ok(()));
        assert_eq!(
            tokens.asked.load(Ordering::SeqCst),
            3,
            "after a look-up: asks"
        );

        let gone = Lease {
            claim: &claim,
            surely_held_until: tokio::time::Instant::now(),
        };
        let late = LeaseCheck::new(&tokens, &key, &gone, FirstCheck::MaySkipWhileSurelyHeld);
        assert_eq!(late.check().await, Ok(()));
        assert_eq!(
            tokens.asked.load(Ordering::SeqCst),
            4,
            "past the sure half: asks"
        );
    }

    #[tokio::test]
    async fn a_refused_extend_is_a_lost_lease_and_a_failed_one_unchecked() {
        let key = IdempotencyKey::try_from("k-2").unwrap();
        let claim = claim();
        let lease = Lease {
            claim: &claim,
            surely_held_until: tokio::time::Instant::now(),
        };
        let refused = store(|| Ok(Transition::Refused));
        let check = LeaseCheck::new(&refused, &key, &lease, FirstCheck::Asks);
        assert_eq!(check.check().await, Err(LeaseLoss::Lost));

        let failing = store(|| Err(TokenError::Corrupt("a reply this code never writes".into())));
        let check = LeaseCheck::new(&failing, &key, &lease, FirstCheck::Asks);
        match check.check().await {
            Err(LeaseLoss::Unchecked(reason)) => {
                assert!(reason.contains("never writes"), "{reason}")
            }
            other => panic!("expected unchecked: {other:?}"),
        }
    }
}
