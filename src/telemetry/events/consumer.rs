//! The Kafka consumer's statistics.

use opentelemetry::KeyValue;

use super::InternalEvent;
use crate::telemetry::metrics::metrics;

/// librdkafka's statistics gave a partition's lag (`payment_worker.consumer.lag`, by
/// partition). The caller reports 0 for a partition it does not fetch.
pub struct ConsumerLagMeasured {
    /// The partition (non-negative).
    pub partition: i32,
    /// Records behind the high watermark (non-negative).
    pub lag: i64,
}

impl InternalEvent for ConsumerLagMeasured {
    fn emit(self) {
        metrics().consumer_lag.record(
            self.lag,
            &[KeyValue::new("partition", i64::from(self.partition))],
        );
    }
}
