# syntax=docker/dockerfile:1
# payment-worker images, from one build stage:
# - `runtime` (the default, last stage): the product only (`run`, `migrate`, `tokens`,
#   `produce`, `replay`, `dlq`, `audit`, `process`, `healthcheck`, `completions`,
#   `man`), on distroless: no shell, no package manager, a non-root user.
# - `devtools`: the development tools' binary (devtools/: every product command and
#   `demo`, `bench`, `gateway-sim`, `dev-kafka`), for the local stack in
#   docker-compose.yml (the gateway simulator).

# Build stage. rdkafka-sys compiles librdkafka from source with its mklove build, which
# needs a C toolchain, make and perl; TLS (and so SASL SCRAM) links OpenSSL through
# libssl-dev and pkg-config (all in this image); zstd is built from source. zlib and
# libssl are linked dynamically. `migrations/` is embedded at compile time by `sqlx::migrate!`.
# Base images are pinned by digest (the tag says which release the digest is): a
# rebuild gets the same bases until someone moves the pin on purpose. Refresh with
# `docker buildx imagetools inspect <image>:<tag>` and take the index digest.
FROM rust:1.95-bookworm@sha256:6258907abe69656e41cd992e0b705cdcfabcbbe3db374f92ed2d47121282d4a1 AS builder
# The production build carries Kafka OIDC (feature kafka-oidc): librdkafka with
# libcurl, built through CMake.
RUN apt-get update \
    && apt-get install -y --no-install-recommends cmake \
    && rm -rf /var/lib/apt/lists/*
# `--version` names the commit; the build context carries no .git.
ARG PAYMENT_WORKER_COMMIT=unknown
ENV PAYMENT_WORKER_COMMIT=${PAYMENT_WORKER_COMMIT}
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY src ./src
COPY migrations ./migrations
# The checked SQL statements compile against the committed offline cache, never a
# database (`.cargo/config.toml` says the same; that file is not copied).
COPY .sqlx ./.sqlx
ENV SQLX_OFFLINE=true
# Workspace members: cargo reads their manifests even when it builds only the product;
# the development tools' binary is built from devtools/ for the `devtools` stage.
COPY devtools ./devtools
COPY model ./model
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --features kafka-oidc --bin payment-worker \
    && cp target/release/payment-worker /usr/local/bin/payment-worker \
    && cargo build --release --locked -p payment-worker-devtools \
    && cp target/release/payment-worker-devtools /usr/local/bin/payment-worker-devtools \
    # Debug information is 114 MB of the product binary's 142 MB: the Rust code's line
    # tables (a panic's backtrace names file:line) and what the C libraries
    # (librdkafka, libcurl, mimalloc) are built with. Compressed in place, where
    # backtraces still read it, the binary takes 56 MB.
    && objcopy --compress-debug-sections=zlib /usr/local/bin/payment-worker \
    && objcopy --compress-debug-sections=zlib /usr/local/bin/payment-worker-devtools \
    # The runtime has glibc, libssl and CA certificates but no zlib, which
    # librdkafka links: carried over from here.
    && mkdir -p /runtime-libs \
    && for lib in $(ldd /usr/local/bin/payment-worker /usr/local/bin/payment-worker-devtools \
                    | awk '/libz\.so/ { print $3 }' | sort -u); do cp "$lib" /runtime-libs/; done

# The development tools' image (gateway-sim for docker-compose), its binary under the
# product's name: the compose file runs `payment-worker gateway-sim`.
FROM gcr.io/distroless/cc-debian12:nonroot@sha256:9dac0a79194e45a7da0158a9c6da57b217585af0786db3845d1f0ec1a0dd182f AS devtools
COPY --from=builder /runtime-libs/ /usr/lib/
COPY --from=builder /usr/local/bin/payment-worker-devtools /usr/local/bin/payment-worker
ENTRYPOINT ["payment-worker"]

# Runtime stage: distroless (glibc, libssl for librdkafka's TLS, CA certificates for
# HTTPS gateways and TLS to Kafka, Postgres, Redis and OTLP), the product-only
# binary, no shell: the health check is the binary's own `healthcheck` command.
FROM gcr.io/distroless/cc-debian12:nonroot@sha256:9dac0a79194e45a7da0158a9c6da57b217585af0786db3845d1f0ec1a0dd182f AS runtime
ARG PAYMENT_WORKER_COMMIT=unknown
ARG VERSION=0.2.0
ARG SOURCE=https://example.invalid/payment-worker
LABEL org.opencontainers.image.title="payment-worker" \
      org.opencontainers.image.description="Event-driven payment worker that charges each payment command exactly once" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${PAYMENT_WORKER_COMMIT}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="MIT OR Apache-2.0"
COPY --from=builder /runtime-libs/ /usr/lib/
COPY --from=builder /usr/local/bin/payment-worker /usr/local/bin/payment-worker
# distroless's `nonroot` user (65532).
USER 65532:65532
# JSON lines on stderr, one per event, with the command's trace_id and span_id: what
# log collectors expect from a container. LOG_FORMAT=text for human-readable lines.
ENV LOG_FORMAT=json
# The worker serves /healthz here; `healthcheck` reads the same setting.
ENV HEALTH_LISTEN=0.0.0.0:8081
HEALTHCHECK --interval=5s --timeout=3s --start-period=10s --retries=5 \
    CMD ["payment-worker", "healthcheck"]
ENTRYPOINT ["payment-worker"]
CMD ["run"]
