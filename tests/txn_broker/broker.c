/*
 * txn-broker: librdkafka's mock cluster, patched to carry out Kafka
 * transactions (mock-transactions.patch), in a process of its own for the
 * exactly-once tests.
 *
 *   txn-broker [--max-message-bytes TOPIC=BYTES] BROKERS PARTITIONS TOPIC...
 *
 * --max-message-bytes gives TOPIC a broker-side size limit, as Kafka's topic
 * setting max.message.bytes does: a record batch above it is refused with
 * MESSAGE_TOO_LARGE (the stock mock takes batches of any size).
 *
 * SIGUSR1 makes each broker answer the next EndTxn it handles LATE_END_TXN_MS
 * late: the transaction ends at once, its coordinator's answer comes after the
 * producer stopped waiting for it. Prints "txn-broker late commits armed".
 *
 * SIGUSR2 makes the next Produce request any client sends fail with
 * INVALID_RECORD, a refusal no retry can fix (a broker-side record validation,
 * as Kafka's for compacted topics or its timestamp checks). Prints "txn-broker
 * produce refusal armed".
 *
 * Prints "txn-broker bootstrap HOST:PORT,..." once the topics exist, then
 * runs until SIGTERM or SIGINT.
 */
#include <signal.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rdkafka.h"
#include "rdkafka_mock.h"
#include "rdkafka_protocol.h"

#define LATE_END_TXN_MS 30000

/* From the patch (rdkafka_mock_int.h, which is not a public header). Weak, so
 * that broker.c still links with the stock mock (to watch the tests fail without
 * the patch); --max-message-bytes is then refused. */
void rd_kafka_mock_topic_max_message_bytes(const char *topic, int32_t bytes)
    __attribute__((weak));

int main(int argc, char **argv) {
        char errstr[512];
        rd_kafka_conf_t *conf;
        rd_kafka_t *rk;
        rd_kafka_mock_cluster_t *mcluster;
        sigset_t stop;
        int signal_number, brokers, partitions, i;
        const char *program = argv[0];

        if (argc > 2 && !strcmp(argv[1], "--max-message-bytes")) {
                char *equals = strrchr(argv[2], '=');
                char *end    = NULL;
                long bytes   = equals ? strtol(equals + 1, &end, 10) : 0;
                if (!equals || equals == argv[2] || *end != '\0' ||
                    bytes < 1 || bytes > INT32_MAX) {
                        fprintf(stderr,
                                "--max-message-bytes takes TOPIC=BYTES\n");
                        return 2;
                }
                if (!rd_kafka_mock_topic_max_message_bytes) {
                        fprintf(stderr, "--max-message-bytes needs the mock "
                                        "built with mock-transactions.patch\n");
                        return 2;
                }
                *equals = '\0';
                rd_kafka_mock_topic_max_message_bytes(argv[2],
                                                      (int32_t)bytes);
                argc -= 2;
                argv += 2;
        }
        if (argc < 4) {
                fprintf(stderr,
                        "usage: %s [--max-message-bytes TOPIC=BYTES] BROKERS "
                        "PARTITIONS TOPIC...\n",
                        program);
                return 2;
        }
        brokers    = atoi(argv[1]);
        partitions = atoi(argv[2]);
        if (partitions < 1) {
                fprintf(stderr, "PARTITIONS must be a positive number\n");
                return 2;
        }

        /* Block the stop and control signals before librdkafka starts its
         * threads, so that only sigwait() below receives them. */
        sigemptyset(&stop);
        sigaddset(&stop, SIGTERM);
        sigaddset(&stop, SIGINT);
        sigaddset(&stop, SIGUSR1);
        sigaddset(&stop, SIGUSR2);
        pthread_sigmask(SIG_BLOCK, &stop, NULL);

        conf = rd_kafka_conf_new();
        if (rd_kafka_conf_set(conf, "test.mock.num.brokers", argv[1], errstr,
                              sizeof(errstr)) != RD_KAFKA_CONF_OK) {
                fprintf(stderr, "BROKERS: %s\n", errstr);
                return 2;
        }
        rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
        if (!rk) {
                fprintf(stderr, "starting the mock cluster: %s\n", errstr);
                return 1;
        }
        mcluster = rd_kafka_handle_mock_cluster(rk);
        /* The stock 3 s before a group's first rebalance would dominate the
         * tests' time. */
        rd_kafka_mock_group_initial_rebalance_delay_ms(mcluster, 0);
        for (i = 3; i < argc; i++) {
                rd_kafka_resp_err_t err = rd_kafka_mock_topic_create(
                    mcluster, argv[i], partitions, 1);
                if (err) {
                        fprintf(stderr, "creating topic %s: %s\n", argv[i],
                                rd_kafka_err2str(err));
                        return 1;
                }
        }

        printf("txn-broker bootstrap %s\n",
               rd_kafka_mock_cluster_bootstraps(mcluster));
        fflush(stdout);

        for (;;) {
                sigwait(&stop, &signal_number);
                if (signal_number == SIGUSR2) {
                        rd_kafka_mock_push_request_errors(
                            mcluster, RD_KAFKAP_Produce, 1,
                            RD_KAFKA_RESP_ERR_INVALID_RECORD);
                        printf("txn-broker produce refusal armed\n");
                        fflush(stdout);
                        continue;
                }
                if (signal_number != SIGUSR1)
                        break;
                /* Mock brokers are numbered from 1. */
                for (i = 1; i <= brokers; i++)
                        rd_kafka_mock_broker_push_request_error_rtts(
                            mcluster, i, RD_KAFKAP_EndTxn, 1,
                            RD_KAFKA_RESP_ERR_NO_ERROR, LATE_END_TXN_MS);
                printf("txn-broker late commits armed\n");
                fflush(stdout);
        }
        rd_kafka_destroy(rk);
        return 0;
}
