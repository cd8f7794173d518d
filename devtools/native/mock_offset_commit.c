/*
 * The local Kafka's group coordinator, made to accept an offset commit while the
 * group prepares a rebalance, as Kafka's does.
 *
 * Kafka's classic group coordinator takes an OffsetCommit from a member of the
 * current generation in the states Stable and PreparingRebalance, and refuses it
 * with REBALANCE_IN_PROGRESS only in CompletingRebalance (between the JoinGroup
 * answers and the SyncGroup answers). That is what lets a member drain and commit
 * the partitions it gives up while another member is already joining: the commit
 * of an incremental revoke lands, and the next owner starts after it.
 *
 * librdkafka's mock refuses it in its JOINING state too (its PreparingRebalance).
 * A newcomer whose SyncGroup the mock answers with an empty assignment rejoins at
 * once, so a revoke served a moment later had its commit refused, and the
 * newcomer answered the drained commands a second time: the worker was tested
 * against a stricter coordinator than any it meets. Only JOINING changes, and
 * only for an OffsetCommit of a known member carrying the current generation;
 * everything else, SYNCING included, keeps the mock's answer.
 *
 * The linker (`--wrap`, see build.rs) sends the request handlers' calls here;
 * the mock's own calls inside its group code keep the original.
 */
#include "rdkafka_int.h"
#include "rdkafka_mock_int.h"

rd_kafka_resp_err_t __real_rd_kafka_mock_cgrp_classic_check_state(
    rd_kafka_mock_cgrp_classic_t *mcgrp,
    rd_kafka_mock_cgrp_classic_member_t *member,
    const rd_kafka_buf_t *request,
    int32_t generation_id);

rd_kafka_resp_err_t __wrap_rd_kafka_mock_cgrp_classic_check_state(
    rd_kafka_mock_cgrp_classic_t *mcgrp,
    rd_kafka_mock_cgrp_classic_member_t *member,
    const rd_kafka_buf_t *request,
    int32_t generation_id) {
        if (request->rkbuf_reqhdr.ApiKey == RD_KAFKAP_OffsetCommit &&
            member && generation_id == mcgrp->generation_id &&
            mcgrp->state == RD_KAFKA_MOCK_CGRP_STATE_JOINING)
                return RD_KAFKA_RESP_ERR_NO_ERROR;
        return __real_rd_kafka_mock_cgrp_classic_check_state(
            mcgrp, member, request, generation_id);
}
