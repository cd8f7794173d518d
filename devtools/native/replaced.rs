// Each librdkafka mock function the development tools replace, and the file that
// replaces it. Included by `devtools/build.rs`, which compiles the files and wraps the
// functions for its own targets, and by the root `build.rs`, which wraps them for the
// product's integration tests (a build script's link flags reach its own package only).
[
    ("rd_kafka_mock_msgset_find", "native/mock_msgset_find.c"),
    (
        "rd_kafka_mock_cgrp_classic_check_state",
        "native/mock_offset_commit.c",
    ),
]
