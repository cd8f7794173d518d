//! The audit report: one count and a few examples per kind of violation, printed as
//! a table or as JSON.

use std::fmt::Write as _;

use super::repair::{RepairAction, TokenRepair};

/// Examples kept per finding; the count covers all of them.
pub const MAX_EXAMPLES: usize = 5;

/// One offending idempotency key and what is wrong with it. Never carries a payment
/// method or anything else from the command beyond its key.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Example {
    /// The key the finding is about.
    pub idempotency_key: String,
    /// What was found for it (statuses, transaction ids; never the payment method).
    pub detail: String,
}

/// One kind of finding: how many, and the first few by key.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Finding {
    /// Keys found, all of them.
    pub count: usize,
    /// The first [`MAX_EXAMPLES`] of them.
    pub examples: Vec<Example>,
}

impl Finding {
    /// Counts one more key, and keeps it as an example while there is room.
    pub fn push(&mut self, key: &str, detail: impl Into<String>) {
        self.count += 1;
        if self.examples.len() < MAX_EXAMPLES {
            self.examples.push(Example {
                idempotency_key: key.to_owned(),
                detail: detail.into(),
            });
        }
    }

    /// The keys of the examples kept.
    pub fn keys(&self) -> Vec<&str> {
        self.examples
            .iter()
            .map(|e| e.idempotency_key.as_str())
            .collect()
    }
}

/// Everything one `audit` run found, violation by violation.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct AuditReport {
    /// Only idempotency keys starting with this were audited.
    pub key_prefix: Option<String>,
    /// Ledger entries read (within the key prefix).
    pub ledger_entries: usize,
    /// Payment rows read (within the key prefix).
    pub payment_rows: usize,
    /// Gateway refunds read (their own key within the key prefix).
    pub refund_entries: usize,
    /// Refund rows read (their own key within the key prefix).
    pub refund_rows: usize,
    /// I1: ledger entries per key > 1.
    pub double_charges: Finding,
    /// I7: a ledger entry whose key has no payment row at all.
    pub charges_without_row: Finding,
    /// I7: a final row (succeeded / declined) whose key has no ledger entry.
    pub rows_without_charge: Finding,
    /// I7: a final row whose status or transaction id matches none of its key's entries.
    pub rows_disagreeing: Finding,
    /// I4: tokens in `processing` whose lease has run out and whose key has no final
    /// payment row (found before any repair): stuck and unsafe, a violation.
    pub stuck_tokens: Finding,
    /// Of `stuck_tokens`, how many `--repair` settled.
    pub stuck_tokens_repaired: usize,
    /// Warning: tokens left `processing` past their lease whose payment row is final;
    /// the next delivery of the key (or `--repair`) completes them.
    pub lease_left_tokens: Finding,
    /// Size and age of the token store's own table (Postgres token store only).
    pub token_table: Option<crate::token::Housekeeping>,
    /// True when the token store listed as many stuck tokens as were asked for.
    pub stuck_tokens_truncated: bool,
    /// I2/I6: a `completed` tombstone for a charged key without a payment row.
    pub tombstones_without_row: Finding,
    /// I2/I4: committed rows still `processing` longer than a lease.
    pub stale_processing_rows: Finding,
    /// Commands dead-lettered `retries_exhausted` while an earlier attempt may have
    /// charged (`x-charge-unknown: true`) and not booked since, each with what the
    /// ledger holds for its key. Listed so they are never forgotten; not counted as
    /// violations themselves (a charge without its row already is one, under I7).
    pub unresolved_charges: Finding,
    /// Warning: charges a two-phase gateway made ready and nobody confirmed, older
    /// than the lease plus `--orphan-margin` (Stripe: PaymentIntents awaiting their
    /// confirm). They charge nothing; `--repair` cancels those whose payment is not
    /// in progress.
    pub orphaned_charges: Finding,
    /// Of `orphaned_charges`, how many `--repair` cancelled.
    pub orphans_cancelled: usize,
    /// R1: a gateway refund no refund row records (no row, a row still
    /// `processing`, or a row with another status, id, amount or charge).
    pub refunds_unbooked: Finding,
    /// R1: a final refund row (refunded / declined) whose gateway refund is missing
    /// or differs in id, status, amount, currency or charge.
    pub refund_rows_unbacked: Finding,
    /// R2: a charge whose approved gateway refunds, or a payment whose refunded and
    /// reserved rows, add up to more than it charged.
    pub refunds_past_charge: Finding,
    /// R3: refund rows `processing` longer than a lease (after `--repair`): their
    /// outcome is unknown and their amount stays reserved until one is recorded.
    pub stuck_refunds: Finding,
    /// Of the stuck refunds found, how many `--repair` recorded from the gateway.
    pub stuck_refunds_repaired: usize,
    /// What `--repair` did to each stuck token and orphaned charge (empty without it).
    pub repairs: Vec<TokenRepair>,
    /// Tokens whose state was corrected (the token-inconsistency count).
    pub token_inconsistencies_repaired: usize,
}

impl AuditReport {
    /// Stuck tokens that are still a problem after the repairs.
    pub fn unresolved_stuck_tokens(&self) -> usize {
        self.stuck_tokens
            .count
            .saturating_sub(self.stuck_tokens_repaired)
    }

    /// Findings that need no operator: they settle on their own.
    pub fn warnings(&self) -> usize {
        self.lease_left_tokens.count
            + self
                .orphaned_charges
                .count
                .saturating_sub(self.orphans_cancelled)
    }

    /// Invariant violations left after the repairs; zero means the books are clean.
    pub fn violations(&self) -> usize {
        self.double_charges.count
            + self.charges_without_row.count
            + self.rows_without_charge.count
            + self.rows_disagreeing.count
            + self.unresolved_stuck_tokens()
            + self.tombstones_without_row.count
            + self.stale_processing_rows.count
            + self.refunds_unbooked.count
            + self.refund_rows_unbacked.count
            + self.refunds_past_charge.count
            + self.stuck_refunds.count
    }

    /// No violation found (warnings such as lease-left tokens do not count).
    pub fn is_clean(&self) -> bool {
        self.violations() == 0
    }

    fn sections(&self) -> [(&'static str, &Finding); 12] {
        [
            ("keys charged more than once (I1)", &self.double_charges),
            (
                "charges without a payment row (I7)",
                &self.charges_without_row,
            ),
            (
                "payment rows without a charge (I7)",
                &self.rows_without_charge,
            ),
            (
                "rows disagreeing with the ledger (I7)",
                &self.rows_disagreeing,
            ),
            (
                "tokens stuck past lease, no final row (I4)",
                &self.stuck_tokens,
            ),
            (
                "completed tombstones without a row (I2)",
                &self.tombstones_without_row,
            ),
            (
                "rows processing longer than a lease (I2)",
                &self.stale_processing_rows,
            ),
            (
                "gateway refunds without their row (R1)",
                &self.refunds_unbooked,
            ),
            (
                "refund rows without their refund (R1)",
                &self.refund_rows_unbacked,
            ),
            (
                "refunded past the amount charged (R2)",
                &self.refunds_past_charge,
            ),
            ("refunds processing past a lease (R3)", &self.stuck_refunds),
            (
                "dead-lettered with the charge unknown",
                &self.unresolved_charges,
            ),
        ]
    }

    /// The human-readable table `audit` prints by default.
    pub fn to_table(&self) -> String {
        let mut out = String::new();
        self.write_header(&mut out);
        self.write_sections(&mut out);
        self.write_warnings(&mut out);
        self.write_token_table(&mut out);
        self.write_repairs(&mut out);
        self.write_result(&mut out);
        out
    }

    /// What was audited, and the columns.
    fn write_header(&self, out: &mut String) {
        let scope = match &self.key_prefix {
            Some(prefix) => format!("keys starting with {prefix:?}"),
            None => "all keys".to_owned(),
        };
        let _ = writeln!(
            out,
            "audit of {scope}: {} ledger entries, {} payment rows, {} gateway refunds, {} refund rows",
            self.ledger_entries, self.payment_rows, self.refund_entries, self.refund_rows
        );
        let _ = writeln!(out, "{:<44} {:>7}  examples", "check", "count");
    }

    /// One line per check with its count, then its examples.
    fn write_sections(&self, out: &mut String) {
        for (title, finding) in self.sections() {
            let _ = writeln!(out, "{title:<44} {:>7}", finding.count);
            write_examples(out, finding);
        }
        if self.stuck_tokens_truncated {
            let _ = writeln!(out, "(stuck tokens: the listing was truncated)");
        }
    }

    /// The findings that settle on their own, with their examples.
    fn write_warnings(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "warning: {:<35} {:>7}",
            "tokens lease-left with a final row", self.lease_left_tokens.count
        );
        write_examples(out, &self.lease_left_tokens);
        let _ = writeln!(
            out,
            "warning: {:<35} {:>7}",
            "orphaned unconfirmed charges", self.orphaned_charges.count
        );
        write_examples(out, &self.orphaned_charges);
    }

    /// The token table's size and oldest expired row, when the store has one.
    fn write_token_table(&self, out: &mut String) {
        if let Some(table) = &self.token_table {
            let oldest = table.oldest_expired_for.map_or_else(
                || "none".to_owned(),
                |d| {
                    format!(
                        "expired {} ago",
                        humantime::format_duration(whole_seconds(d))
                    )
                },
            );
            let _ = writeln!(
                out,
                "token table: {} rows ({} expired, waiting for the purge), {} KiB; oldest expired row: {oldest}",
                table.rows,
                table.expired_rows,
                table.table_bytes / 1024
            );
        }
    }

    /// What `--repair` did, key by key, and its totals.
    fn write_repairs(&self, out: &mut String) {
        if !self.repairs.is_empty() {
            let _ = writeln!(out, "repairs:");
            for repair in &self.repairs {
                let _ = writeln!(
                    out,
                    "  {}: {} ({})",
                    repair.idempotency_key,
                    repair.action.describe(),
                    repair.detail
                );
            }
            let _ = writeln!(
                out,
                "token inconsistencies repaired: {}, orphaned charges cancelled: {}, stuck refunds recorded: {}",
                self.token_inconsistencies_repaired, self.orphans_cancelled, self.stuck_refunds_repaired
            );
        }
    }

    /// The verdict: clean or how many violations, and how many warnings.
    fn write_result(&self, out: &mut String) {
        let repaired_note = if self.repairs.iter().any(|r| {
            matches!(
                r.action,
                RepairAction::Completed | RepairAction::Restored | RepairAction::Recorded
            )
        }) {
            " (after repairs)"
        } else {
            ""
        };
        let warnings = match self.warnings() {
            0 => String::new(),
            n => format!(", {n} warning(s)"),
        };
        match self.violations() {
            0 => {
                let _ = writeln!(out, "result: CLEAN{repaired_note}{warnings}");
            }
            n => {
                let _ = writeln!(
                    out,
                    "result: {n} invariant violation(s){repaired_note}{warnings}"
                );
            }
        }
    }
}

/// A finding's examples, indented under the count column.
fn write_examples(out: &mut String, finding: &Finding) {
    for example in &finding.examples {
        let _ = writeln!(
            out,
            "{:<44} {:>7}  {}: {}",
            "", "", example.idempotency_key, example.detail
        );
    }
}

fn whole_seconds(d: std::time::Duration) -> std::time::Duration {
    std::time::Duration::from_secs(d.as_secs())
}
