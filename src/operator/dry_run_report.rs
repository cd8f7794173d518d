//! What `replay --dry-run` reports: the verdicts, what each one means, the counts
//! and (with `--list`) every record's verdict, as text or JSON.

use std::collections::BTreeMap;

/// Every verdict, in the order the summary prints them.
pub const VERDICTS: [&str; 8] = [
    WOULD_CHARGE,
    WOULD_REFUND,
    WOULD_LOOK_UP,
    "duplicate",
    "key_reused",
    "in_flight",
    "token_missing",
    "invalid",
];
pub(super) const WOULD_CHARGE: &str = "would_charge";
pub(super) const WOULD_LOOK_UP: &str = "would_look_up";
pub(super) const WOULD_REFUND: &str = "would_refund";

/// What each verdict means, for the human summary.
fn meaning(verdict: &str) -> &'static str {
    match verdict {
        WOULD_CHARGE => "charged at the gateway",
        WOULD_LOOK_UP => "gateway asked by key first; charged (or refunded) only if it holds none",
        WOULD_REFUND => "refunded at the gateway, within what is left of its payment",
        "duplicate" => "answered from the recorded payment",
        "key_reused" => "refused: the key was used for another request",
        "in_flight" => "a live worker holds the token; retried later",
        "token_missing" => "refused unless the gateway holds its charge",
        "invalid" => "refused: not a valid command",
        _ => "",
    }
}

/// What `replay --dry-run` says one command would do.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DryRunVerdict {
    /// The record's partition.
    pub partition: i32,
    /// The record's offset.
    pub offset: i64,
    /// The command's key; `None` for a record that is not a valid command.
    pub idempotency_key: Option<String>,
    /// One of [`VERDICTS`].
    pub verdict: &'static str,
    /// Why this verdict, in words (never the payment method).
    pub detail: String,
}

/// The answer to "what would a replay do": counts per verdict (zeros included).
#[derive(Debug, Clone, serde::Serialize)]
pub struct DryRunReport {
    /// The topic examined.
    pub topic: String,
    /// `null`: from the beginning of every partition.
    pub from_offset: Option<i64>,
    /// Records between the start offsets and the end of the topic.
    pub records_in_range: u64,
    /// Records examined (fewer than `records_in_range` under `--limit`).
    pub examined: usize,
    /// Records per verdict, every verdict of [`VERDICTS`] present (zeros included).
    pub counts: BTreeMap<&'static str, usize>,
    /// Every examined record (`--list`), in partition and offset order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub records: Option<Vec<DryRunVerdict>>,
}

impl DryRunReport {
    pub(super) fn new(
        topic: &str,
        from_offset: Option<i64>,
        records_in_range: u64,
        tally: Tally,
    ) -> Self {
        Self {
            topic: topic.to_owned(),
            from_offset,
            records_in_range,
            examined: tally.examined,
            counts: tally.counts,
            records: tally.records,
        }
    }

    /// The human report: one line per record (with `--list`), then the counts.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        for v in self.records.iter().flatten() {
            let key = v.idempotency_key.as_deref().unwrap_or("-");
            let line = format!(
                "{}/{}@{} {key} {}",
                self.topic, v.partition, v.offset, v.verdict
            );
            if v.detail.is_empty() {
                out.push_str(&format!("{line}\n"));
            } else {
                out.push_str(&format!("{line} {}\n", v.detail));
            }
        }
        let from = match self.from_offset {
            Some(offset) => {
                format!("offset {offset} (or where the group is, where it has not read as far)")
            }
            None => "the beginning".to_owned(),
        };
        out.push_str(&format!(
            "dry run: replaying {} from {from} ({} records)\n",
            self.topic, self.records_in_range
        ));
        for verdict in VERDICTS {
            let count = self.counts.get(verdict).copied().unwrap_or(0);
            out.push_str(&format!(
                "  {verdict:<14}{count:>8}  {}\n",
                meaning(verdict)
            ));
        }
        if (self.examined as u64) < self.records_in_range {
            out.push_str(&format!(
                "examined {} of {} records (--limit)\n",
                self.examined, self.records_in_range
            ));
        }
        out
    }
}

/// The verdicts counted so far, and each one kept when they are to be listed.
pub(super) struct Tally {
    pub(super) examined: usize,
    pub(super) counts: BTreeMap<&'static str, usize>,
    pub(super) records: Option<Vec<DryRunVerdict>>,
}

impl Tally {
    pub(super) fn new(list: bool) -> Self {
        Self {
            examined: 0,
            counts: VERDICTS.iter().map(|v| (*v, 0)).collect(),
            records: list.then(Vec::new),
        }
    }

    pub(super) fn add(&mut self, verdict: DryRunVerdict) {
        self.examined += 1;
        *self.counts.entry(verdict.verdict).or_default() += 1;
        if let Some(records) = &mut self.records {
            records.push(verdict);
        }
    }
}
