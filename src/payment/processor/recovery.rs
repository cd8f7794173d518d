//! When the token cannot decide: the payments row (and, for a missing token, the
//! gateway) answers instead. Apart because it is the one path that reads rather
//! than reserves.

use super::*;

/// How a token that is not there is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Absence {
    /// `Missing`: never issued, expired or consumed; no charge unless the gateway shows one.
    Missing,
    /// `Unsettled`: expired while an attempt held it; its charge is unknown.
    ExpiredWhileHeld,
}

impl Processor {
    pub(super) async fn decide_from_postgres(
        &self,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        tombstone_payment: Uuid,
    ) -> Attempt {
        match self.find_existing(key).await {
            Ok(Some(existing)) => outcome_for_existing(&existing, fingerprint).into(),
            Ok(None) => {
                tracing::warn!(idempotency_key = %key, "completed token without a payment row");
                Attempt::Final(Outcome::Duplicate {
                    payment_id: tombstone_payment,
                    original: None,
                })
            }
            Err(error) => database_failure("payment look-up", &error),
        }
    }

    pub(super) async fn find_existing(
        &self,
        key: &IdempotencyKey,
    ) -> Result<Option<PaymentRecord>, sqlx::Error> {
        let mut conn = self.pool.acquire().await?;
        let stall = Stall::default();
        let found = stall
            .bounded(
                "payment look-up",
                persistence::find_payment(&mut conn, key.as_str()),
            )
            .await;
        stall.release(conn);
        found
    }

    /// `issued` mode, token missing or expired while held (docs/CONTRACT.md,
    /// "Outcomes"): Postgres, then the gateway, decide. A token that expired while
    /// an attempt held it never means "nothing charged": that attempt's request may
    /// still land, so no charge found yet is a retry with the charge unknown.
    pub(super) async fn recover_missing(
        &self,
        command: &PaymentCommand,
        fingerprint: &Fingerprint,
        context: &CommandContext<'_>,
        absence: Absence,
    ) -> Attempt {
        let key = &command.idempotency_key;
        match self.find_existing(key).await {
            Ok(Some(existing)) => return outcome_for_existing(&existing, fingerprint).into(),
            Ok(None) => {}
            Err(error) => return database_failure("payment look-up", &error),
        }
        let charge = match (self.gateway.lookup(key).await, absence) {
            // The key's charge was made for another request (or the gateway answered
            // for another key): never book it as this one.
            (Ok(Some(found)), _) => {
                self.mark_at_stake(ChargeAtStake::of_charge(command), context.source);
                match charging::checked_charge(found, command) {
                    Ok(charge) => charge,
                    Err(mismatch) => return mismatch,
                }
            }
            (Ok(None), Absence::Missing) => {
                return Attempt::Final(Outcome::Rejected {
                    kind: RejectionKind::TokenMissing,
                    reason: "token_missing: never issued, expired, or already consumed".to_owned(),
                })
            }
            (Ok(None), Absence::ExpiredWhileHeld) => return retry_unknown(
                "the token expired while an attempt held it, and the gateway shows no charge yet",
            ),
            (Err(error), Absence::Missing) => {
                return retry(format!("gateway look-up failed: {error}"))
            }
            (Err(error), Absence::ExpiredWhileHeld) => {
                return retry_unknown(format!(
                    "the token expired while an attempt held it, and the look-up failed: {error}"
                ))
            }
        };
        // An earlier attempt charged and crashed before recording: record, never re-charge.
        let row = row_context(context, 0);
        let inserted = async {
            let mut conn = self.pool.acquire().await?;
            let stall = Stall::default();
            let inserted = stall
                .bounded(
                    "recording the recovered charge",
                    persistence::insert(&mut conn, command, fingerprint, &row, Some(&charge)),
                )
                .await;
            stall.release(conn);
            inserted
        }
        .await;
        match inserted {
            Ok(Some(payment_id)) => final_outcome(payment_id, &charge).into(),
            Ok(None) => match self.find_existing(key).await {
                Ok(Some(existing)) => outcome_for_existing(&existing, fingerprint).into(),
                Ok(None) => retry("payment row vanished after a conflict"),
                Err(error) => database_failure("payment look-up", &error),
            },
            Err(error) => database_failure_after_charge("recording the recovered charge", &error),
        }
    }
}
