/*
 * The local Kafka's offset look-up, made to scale with a long partition log.
 *
 * librdkafka's mock broker keeps each partition's log as a list of record
 * batches (up to 5 MiB) and finds the batch holding a fetch offset by walking
 * that list from its oldest batch. A consumer that keeps up fetches near the
 * newest batch, so every fetch walks the whole log: at a few hundred records a
 * second, one or two records per batch, that walk took a third of the bench
 * process's CPU time (perf, half-load phase) and the mock broker, not the
 * worker, set the latency the bench measured.
 *
 * The linker (`--wrap`, see build.rs) sends the mock's calls here instead. The
 * answer is the same batch: batches never overlap and their offsets only grow,
 * so walking from whichever end is nearer to the offset finds the one batch the
 * original walk finds. A consumer that keeps up (near the newest batch) and one
 * reading a backlog from its start (near the oldest) both look at a few batches.
 * Only the mock broker's own thread calls this, as it does the original.
 */
#include "rdkafka_int.h"
#include "rdkafka_mock_int.h"

/* Batches looked at by every look-up so far, for the test that pins the walk's
 * length (tests/it/kafka/local_kafka.rs): counted, not timed. */
static rd_atomic64_t batches_walked;

uint64_t payment_worker_mock_batches_walked(void) {
        return (uint64_t)rd_atomic64_get(&batches_walked);
}

const rd_kafka_mock_msgset_t *
__wrap_rd_kafka_mock_msgset_find(const rd_kafka_mock_partition_t *mpart,
                                 int64_t offset,
                                 rd_bool_t on_follower) {
        const rd_kafka_mock_msgset_t *mset;
        int64_t walked = 0;
        int64_t start = on_follower ? mpart->follower_start_offset
                                    : mpart->start_offset;
        int64_t end =
            on_follower ? mpart->follower_end_offset : mpart->end_offset;

        if (offset < start || offset > end)
                return NULL;

        if (offset - start <= end - offset) {
                TAILQ_FOREACH(mset, &mpart->msgsets, link) {
                        walked++;
                        if (mset->first_offset <= offset &&
                            offset <= mset->last_offset)
                                break;
                }
        } else {
                TAILQ_FOREACH_REVERSE(mset, &mpart->msgsets,
                                      rd_kafka_mock_msgset_tailq_s, link) {
                        walked++;
                        if (mset->first_offset <= offset &&
                            offset <= mset->last_offset)
                                break;
                }
        }
        rd_atomic64_add(&batches_walked, walked);
        /* NULL when the walk found no batch: the loops leave mset NULL. */
        return mset;
}
