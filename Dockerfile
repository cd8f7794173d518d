# syntax=docker/dockerfile:1
# payment-worker: one binary for `run`, `migrate`, `gateway-sim`, `produce`, …

# Build stage. rdkafka-sys compiles librdkafka from source with its mklove build, which
# needs a C toolchain, make and perl; TLS (and so SASL SCRAM) links OpenSSL through
# libssl-dev and pkg-config (all in this image); zstd is built from source. zlib and
# libssl are linked dynamically. `migrations/` is embedded at compile time by `sqlx::migrate!`.
FROM rust:1.95-bookworm AS builder
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY src ./src
COPY migrations ./migrations
# build.rs compiles native/ into the local Kafka (dev-kafka) the binary also carries.
COPY native ./native
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin payment-worker \
    && cp target/release/payment-worker /usr/local/bin/payment-worker

# Runtime stage: the binary, OpenSSL's libssl (librdkafka's TLS), CA certificates
# (HTTPS gateways, TLS to Kafka, Postgres, Redis and OTLP) and curl for the container
# health checks.
FROM debian:bookworm-slim AS runtime
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl libssl3 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin payment-worker
COPY --from=builder /usr/local/bin/payment-worker /usr/local/bin/payment-worker
USER 10001
# JSON lines on stderr, one per event, with the command's trace_id and span_id: what
# log collectors expect from a container. LOG_FORMAT=text for human-readable lines.
ENV LOG_FORMAT=json
ENTRYPOINT ["payment-worker"]
CMD ["run"]
