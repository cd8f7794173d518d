//! `replay --dry-run`: what replaying the commands topic would do, decided
//! read-only from Postgres (the truth) and the token store. Neither the group's
//! offsets nor the gateway are touched.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use rdkafka::message::{Message, OwnedMessage};

use super::dry_run_report::{
    DryRunReport, DryRunVerdict, Tally, WOULD_CHARGE, WOULD_LOOK_UP, WOULD_REFUND,
};
use super::restarts::restart_of;
use super::topics::{group_offsets, partition_ranges, read_ranges, window, PartitionRange};
use crate::configuration::{GatewayKind, KafkaSettings};
use crate::payment::{Command, CommandKind, Fingerprint, GatewayLookup, RefundStatus};
use crate::token::IdempotencyKey;
use crate::token::{TokenMode, TokenState, TokenStore};
use crate::worker::Inbound;

/// Which records a dry run examines and how the worker would be configured.
#[derive(Debug, Clone, Copy, Default)]
pub struct DryRunScope {
    /// Start of every partition (`None`: the beginning), clamped to what it holds.
    pub to_offset: Option<i64>,
    /// Examine at most this many records, shared evenly between the partitions.
    pub limit: Option<usize>,
    /// The workers' `--gateway-lookup`: with `always` every charge is a look-up first.
    pub lookup: GatewayLookup,
    /// The workers' `--gateway`: what it refuses before anything is sent is `invalid`.
    pub gateway: GatewayKind,
}

/// Runs a dry run and builds its report.
pub async fn dry_run_report(
    kafka: &KafkaSettings,
    scope: &DryRunScope,
    pool: &sqlx::PgPool,
    store: &dyn TokenStore,
    mode: TokenMode,
    list: bool,
) -> anyhow::Result<DryRunReport> {
    let (in_range, tally) = examine(kafka, scope, pool, store, mode, list).await?;
    Ok(DryRunReport::new(
        &kafka.commands_topic,
        scope.to_offset,
        in_range,
        tally,
    ))
}

/// Decides, read-only, what each command from `to_offset` (or the beginning) would
/// do if replayed by workers with the default `--gateway-lookup uncertain`.
pub async fn dry_run_verdicts(
    kafka: &KafkaSettings,
    to_offset: Option<i64>,
    pool: &sqlx::PgPool,
    store: &dyn TokenStore,
    mode: TokenMode,
) -> anyhow::Result<Vec<DryRunVerdict>> {
    let scope = DryRunScope {
        to_offset,
        ..DryRunScope::default()
    };
    let (_, tally) = examine(kafka, &scope, pool, store, mode, true).await?;
    Ok(tally.records.unwrap_or_default())
}

/// Offsets of each partition read at a time: a dry run holds one window's records
/// (and, with `--list`, every verdict), however long the topic is, and each read of
/// a window has its own deadline.
const READ_WINDOW: i64 = 1000;

/// The records in range and the verdicts on those examined (each one, in partition
/// and offset order, when `list`). The topic is read a window at a time and each
/// window examined in the order it was read, as the workers would meet the records.
async fn examine(
    kafka: &KafkaSettings,
    scope: &DryRunScope,
    pool: &sqlx::PgPool,
    store: &dyn TokenStore,
    mode: TokenMode,
    list: bool,
) -> anyhow::Result<(u64, Tally)> {
    let ranges = off_the_runtime(kafka, {
        let scope = *scope;
        move |kafka| replay_ranges(kafka, &scope)
    })
    .await?;
    let in_range = ranges.iter().map(|r| r.available).sum::<i64>().max(0) as u64;
    let unknown = outcomes_unknown(pool).await?;
    let mut examiner = Examiner {
        scope,
        pool,
        store,
        mode,
        unknown,
        decided_here: HashMap::new(),
    };
    let mut tally = Tally::new(list);
    for step in 0.. {
        let next = window(&ranges, READ_WINDOW, step);
        if next.is_empty() {
            break;
        }
        let records = off_the_runtime(kafka, move |kafka| {
            read_ranges(kafka, &kafka.commands_topic, &next)
        })
        .await?;
        for record in &records {
            tally.add(examiner.record(record).await?);
        }
    }
    if let Some(records) = &mut tally.records {
        records.sort_by_key(|v| (v.partition, v.offset));
    }
    Ok((in_range, tally))
}

/// Runs `read` on a blocking thread: reading a topic blocks.
async fn off_the_runtime<T: Send + 'static>(
    kafka: &KafkaSettings,
    read: impl FnOnce(&KafkaSettings) -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    let kafka = kafka.clone();
    tokio::task::spawn_blocking(move || read(&kafka)).await?
}

/// Keys given up on with their outcome unknown, since when, and whose (a charge's or
/// a refund's): the workers look these up before anything is sent, whatever their
/// token says.
async fn outcomes_unknown(
    pool: &sqlx::PgPool,
) -> anyhow::Result<HashMap<String, (DateTime<Utc>, CommandKind)>> {
    Ok(crate::payment::unresolved_charges(pool, "")
        .await?
        .into_iter()
        .map(|u| {
            let kind = match u.kind.as_str() {
                "charge" => CommandKind::Charge,
                _ => CommandKind::Refund,
            };
            (u.idempotency_key, (u.dead_lettered_at, kind))
        })
        .collect())
}

/// What a dry run reads its verdicts from, and what it decided so far.
struct Examiner<'a> {
    scope: &'a DryRunScope,
    pool: &'a sqlx::PgPool,
    store: &'a dyn TokenStore,
    mode: TokenMode,
    /// Keys given up on with their outcome unknown ([`outcomes_unknown`]).
    unknown: HashMap<String, (DateTime<Utc>, CommandKind)>,
    /// Keys this replay would charge (or look up) at an earlier record: the workers
    /// answer their later records from that first one, not from today's state.
    decided_here: HashMap<String, (Fingerprint, i64)>,
}

impl Examiner<'_> {
    /// The verdict on one record.
    async fn record(&mut self, record: &OwnedMessage) -> anyhow::Result<DryRunVerdict> {
        let (idempotency_key, (verdict, detail)) = match Inbound::read(record).command {
            Err(reason) => (None, ("invalid", reason.to_string())),
            Ok(command) => {
                let accepted = match &command {
                    Command::Charge(charge) => self.scope.gateway.accepts(&charge.charge_request()),
                    Command::Refund(_) => Ok(()),
                };
                let verdict = match accepted {
                    Err(refusal) => ("invalid", refusal),
                    Ok(()) => self.command(&command, record.offset()).await?,
                };
                (Some(command.idempotency_key().as_str().to_owned()), verdict)
            }
        };
        Ok(DryRunVerdict {
            partition: record.partition(),
            offset: record.offset(),
            idempotency_key,
            verdict,
            detail,
        })
    }

    /// The verdict on a valid command the gateway accepts, at `offset`: from its
    /// payment row, else from an earlier record of this replay, else from its token.
    async fn command(
        &mut self,
        command: &Command,
        offset: i64,
    ) -> anyhow::Result<(&'static str, String)> {
        let key = command.idempotency_key();
        let fingerprint = command.fingerprint();
        let mut conn = self.pool.acquire().await?;
        let existing = own_row(&mut conn, command).await?;
        let other = match existing {
            Some(_) => None,
            None => self.other_kinds_row(&mut conn, command).await?,
        };
        drop(conn);
        let verdict = match (existing, other) {
            (_, Some(detail)) => ("key_reused", format!("key belongs to {detail}")),
            (Some((stored, same)), None) if stored == fingerprint => same,
            (Some((_, (_, detail))), None) => ("key_reused", format!("key belongs to {detail}")),
            (None, None) => match self.decided_earlier(key, &fingerprint) {
                Some(verdict) => verdict,
                None => {
                    // A charge is looked up first for a charge's unknown outcome only;
                    // a refund for any remembered under its key.
                    let since = match (command, self.unknown.get(key.as_str())) {
                        (Command::Refund(_), Some(&(since, _)))
                        | (Command::Charge(_), Some(&(since, CommandKind::Charge))) => Some(since),
                        _ => None,
                    };
                    self.decide_from_token(key, fingerprint, offset, since)
                        .await?
                }
            },
        };
        Ok(match (command, verdict) {
            (Command::Refund(_), (WOULD_CHARGE, detail)) => (WOULD_REFUND, detail),
            (_, verdict) => verdict,
        })
    }

    /// The other kind's row under the command's key, if one holds it: a charge and a
    /// refund never share a key, and the workers refuse a command whose key the
    /// other kind's row holds (the tables decide, not the token).
    async fn other_kinds_row(
        &self,
        conn: &mut sqlx::PgConnection,
        command: &Command,
    ) -> anyhow::Result<Option<String>> {
        let key = command.idempotency_key();
        Ok(match command {
            // (Unless a charge under it is remembered unknown: that one is looked up.)
            Command::Charge(_) if self.charge_unknown(key) => None,
            Command::Charge(_) => crate::payment::find_refund(&mut *conn, key.as_str())
                .await?
                .map(|row| format!("refund {}", row.id)),
            // A charge under the key remembered unknown may be booked yet.
            Command::Refund(_) if self.charge_unknown(key) => {
                Some("a charge whose outcome is unknown (unresolved_charges)".to_owned())
            }
            Command::Refund(_) => crate::payment::find_payment(&mut *conn, key.as_str())
                .await?
                .map(|row| format!("payment {}", row.id)),
        })
    }

    /// Whether a charge under `key` was given up on with its outcome unknown.
    fn charge_unknown(&self, key: &IdempotencyKey) -> bool {
        matches!(
            self.unknown.get(key.as_str()),
            Some((_, CommandKind::Charge))
        )
    }

    /// The verdict when an earlier record of this replay already decided the key.
    fn decided_earlier(
        &self,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
    ) -> Option<(&'static str, String)> {
        match self.decided_here.get(key.as_str())? {
            (earlier, first) if earlier == fingerprint => Some((
                "duplicate",
                format!("of offset {first}, earlier in this replay"),
            )),
            (_, first) => Some((
                "key_reused",
                format!("key first used at offset {first}, earlier in this replay"),
            )),
        }
    }

    /// The verdict from the key's token ([`token_verdict`]); a key it would charge or
    /// look up is decided here for the records after it.
    async fn decide_from_token(
        &mut self,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
        offset: i64,
        unknown_since: Option<DateTime<Utc>>,
    ) -> anyhow::Result<(&'static str, String)> {
        let token = self.store.show(key).await?;
        let verdict = token_verdict(token.as_ref(), self.mode, self.scope.lookup, unknown_since);
        if [WOULD_CHARGE, WOULD_LOOK_UP].contains(&verdict.0) {
            self.decided_here
                .insert(key.as_str().to_owned(), (fingerprint, offset));
        }
        Ok(verdict)
    }
}

/// The command's own row under its key (a payment's for a charge, a refund's for a
/// refund): its fingerprint, and the verdict for the same request.
async fn own_row(
    conn: &mut sqlx::PgConnection,
    command: &Command,
) -> anyhow::Result<Option<(Fingerprint, (&'static str, String))>> {
    let key = command.idempotency_key();
    Ok(match command {
        Command::Charge(_) => crate::payment::find_payment(&mut *conn, key.as_str())
            .await?
            .map(|row| {
                (
                    row.fingerprint,
                    ("duplicate", format!("payment {}", row.id)),
                )
            }),
        Command::Refund(_) => crate::payment::find_refund(&mut *conn, key.as_str())
            .await?
            .map(|row| {
                let same = match row.status {
                    RefundStatus::Processing => (
                        WOULD_LOOK_UP,
                        format!("refund {} reserved, its answer unknown", row.id),
                    ),
                    // A kept refusal (before anything was sent, or by the
                    // gateway): the replay answers it again, as the refusal it was.
                    RefundStatus::Rejected => (
                        "invalid",
                        format!(
                            "refund {} refused for good ({})",
                            row.id,
                            row.failure_reason
                                .as_deref()
                                .and_then(|reason| reason.split(':').next())
                                .unwrap_or("refused")
                        ),
                    ),
                    _ => ("duplicate", format!("refund {}", row.id)),
                };
                (row.fingerprint, same)
            }),
    })
}

/// The verdict for a command with no payment row, from its token: the processor
/// looks the charge up first whenever its reservation is not the first (fence > 1),
/// which is so for a token restored after an attempt or taken over after its
/// lease expired, for a key in `unresolved_charges` (`charge_unknown_since`: given
/// up on with its charge unknown, whatever its token says now), and always under
/// `--gateway-lookup always`.
fn token_verdict(
    token: Option<&crate::token::TokenView>,
    mode: TokenMode,
    lookup: GatewayLookup,
    charge_unknown_since: Option<DateTime<Utc>>,
) -> (&'static str, String) {
    let charge = || match (charge_unknown_since, lookup) {
        (Some(since), _) => (
            WOULD_LOOK_UP,
            format!(
                "charge unknown since {} (unresolved_charges)",
                since.format("%Y-%m-%dT%H:%M:%SZ")
            ),
        ),
        (None, GatewayLookup::Always) => (WOULD_LOOK_UP, "--gateway-lookup always".to_owned()),
        (None, _) => (WOULD_CHARGE, String::new()),
    };
    match token {
        None if mode == TokenMode::Issued => (
            "token_missing",
            "never issued, expired or consumed".to_owned(),
        ),
        None => charge(),
        Some(view) => match view.state {
            TokenState::Completed => ("duplicate", "completed token".to_owned()),
            TokenState::Processing if view.lease_left.is_some_and(|l| l > Duration::ZERO) => {
                ("in_flight", "another worker holds the token".to_owned())
            }
            TokenState::Processing => (
                WOULD_LOOK_UP,
                format!("lease expired (fence {}): taken over", view.fence),
            ),
            TokenState::Pending if view.fence >= 1 => (
                WOULD_LOOK_UP,
                format!("{} earlier reservation(s)", view.fence),
            ),
            TokenState::Pending => charge(),
        },
    }
}

/// Per partition, where a replay starts and, under a limit, where reading stops.
/// A replay never moves a partition forward: where the group has not read as far as
/// the target, the workers go on from its committed offset, so the dry run starts
/// there too, by the replay's own rule.
fn replay_ranges(
    kafka: &KafkaSettings,
    scope: &DryRunScope,
) -> anyhow::Result<Vec<PartitionRange>> {
    let committed = group_offsets(kafka, &kafka.commands_topic)?;
    let mut ranges = partition_ranges(kafka, &kafka.commands_topic, |partition, low| {
        // (`partition_ranges` keeps the start within the high watermark.)
        restart_of(
            scope.to_offset,
            low,
            i64::MAX,
            committed.get(&partition).copied(),
        )
        .start
    })?;
    if let Some(limit) = scope.limit {
        share_limit(&mut ranges, limit);
    }
    Ok(ranges)
}

/// Shortens the ranges so that at most `limit` records are read in all, shared
/// evenly: a partition with fewer records than its share leaves the rest to others.
fn share_limit(ranges: &mut [PartitionRange], limit: usize) {
    let mut left = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut taken = vec![0i64; ranges.len()];
    loop {
        let open: Vec<usize> = (0..ranges.len())
            .filter(|&i| taken[i] < ranges[i].available)
            .collect();
        if open.is_empty() || left == 0 {
            break;
        }
        let share = (left / open.len() as i64).max(1);
        for i in open {
            let take = share.min(ranges[i].available - taken[i]).min(left);
            taken[i] += take;
            left -= take;
        }
    }
    for (range, taken) in ranges.iter_mut().zip(taken) {
        range.to = range.from + taken;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(partition: i32, available: i64) -> PartitionRange {
        PartitionRange {
            partition,
            from: 10,
            to: 10 + available,
            available,
        }
    }

    #[test]
    fn a_limit_is_shared_evenly_and_small_partitions_leave_their_rest() {
        let mut ranges = vec![range(0, 100), range(1, 2), range(2, 100)];
        share_limit(&mut ranges, 20);
        let taken: Vec<i64> = ranges.iter().map(|r| r.to - r.from).collect();
        assert_eq!(taken.iter().sum::<i64>(), 20);
        assert_eq!(taken[1], 2);
        assert_eq!(taken[0], 9);
        assert_eq!(taken[2], 9);

        let mut ranges = vec![range(0, 3), range(1, 4)];
        share_limit(&mut ranges, 1000);
        assert_eq!(ranges[0].to, 13);
        assert_eq!(ranges[1].to, 14);

        let mut ranges = vec![range(0, 5), range(1, 5)];
        share_limit(&mut ranges, 0);
        assert!(ranges.iter().all(|r| r.to == r.from));
    }

    #[test]
    fn a_command_stripe_cannot_express_is_invalid_for_stripe_only() {
        let command = |amount, currency| {
            crate::payment::PaymentCommand::new("k", "acct", amount, currency, "pm_card_visa", None)
                .unwrap()
        };
        let refused_by = |gateway: GatewayKind, command: &crate::payment::PaymentCommand| {
            gateway.accepts(&command.charge_request()).err()
        };
        let kwd = command(1235, "KWD");
        assert_eq!(refused_by(GatewayKind::Charges, &kwd), None);
        assert!(refused_by(GatewayKind::Stripe, &kwd)
            .unwrap()
            .starts_with("amount_not_representable:"));
        assert_eq!(refused_by(GatewayKind::Stripe, &command(1230, "KWD")), None);
        assert_eq!(refused_by(GatewayKind::Stripe, &command(1235, "USD")), None);
    }

    #[test]
    fn a_token_with_an_earlier_holder_is_looked_up_before_any_charge() {
        let view = |state, fence, lease_left| crate::token::TokenView {
            state,
            owner: None,
            fence,
            lease_left,
            ttl: None,
            payment_id: None,
        };
        let verdict = |token: Option<crate::token::TokenView>, mode, lookup| {
            token_verdict(token.as_ref(), mode, lookup, None).0
        };
        let (implicit, uncertain) = (TokenMode::Implicit, GatewayLookup::Uncertain);
        assert_eq!(verdict(None, implicit, uncertain), WOULD_CHARGE);
        assert_eq!(
            verdict(None, implicit, GatewayLookup::Always),
            WOULD_LOOK_UP
        );
        assert_eq!(verdict(None, TokenMode::Issued, uncertain), "token_missing");
        assert_eq!(
            verdict(
                Some(view(TokenState::Pending, 0, None)),
                implicit,
                uncertain
            ),
            WOULD_CHARGE
        );
        assert_eq!(
            verdict(
                Some(view(TokenState::Pending, 2, None)),
                implicit,
                uncertain
            ),
            WOULD_LOOK_UP
        );
        assert_eq!(
            verdict(
                Some(view(
                    TokenState::Processing,
                    1,
                    Some(Duration::from_secs(5))
                )),
                implicit,
                uncertain
            ),
            "in_flight"
        );
        assert_eq!(
            verdict(
                Some(view(TokenState::Processing, 1, Some(Duration::ZERO))),
                implicit,
                uncertain
            ),
            WOULD_LOOK_UP
        );
        assert_eq!(
            verdict(
                Some(view(TokenState::Completed, 1, None)),
                implicit,
                uncertain
            ),
            "duplicate"
        );
        // A key given up on with its charge unknown: looked up whatever its token,
        // even with none (expired, or the store flushed) or a first reservation's.
        let since = Some(chrono::Utc::now());
        for token in [None, Some(view(TokenState::Pending, 0, None))] {
            let (verdict, detail) = token_verdict(token.as_ref(), implicit, uncertain, since);
            assert_eq!(verdict, WOULD_LOOK_UP);
            assert!(detail.contains("unresolved_charges"), "{detail}");
        }
        let completed = Some(view(TokenState::Completed, 1, None));
        assert_eq!(
            token_verdict(completed.as_ref(), implicit, uncertain, since).0,
            "duplicate"
        );
    }
}
