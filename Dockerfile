# syntax=docker/dockerfile:1
# payment-worker: one binary for `run`, `migrate`, `gateway-sim`, `produce`, …

# Build stage. rdkafka-sys compiles librdkafka from source with its mklove build, which
# needs only a C toolchain, make and perl (all in this image); with default features no
# SASL/SSL dev packages are required. zlib is linked dynamically (zlib1g is in every
# Debian image). `migrations/` is embedded at compile time by `sqlx::migrate!`.
FROM rust:1.95-bookworm AS builder
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY migrations ./migrations
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin payment-worker \
    && cp target/release/payment-worker /usr/local/bin/payment-worker

# Runtime stage: the binary, CA certificates (HTTPS gateways, OTLP over TLS) and curl
# for the container health checks.
FROM debian:bookworm-slim AS runtime
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin payment-worker
COPY --from=builder /usr/local/bin/payment-worker /usr/local/bin/payment-worker
USER 10001
# JSON lines on stderr, one per event, with the command's trace_id and span_id: what
# log collectors expect from a container. LOG_FORMAT=text for human-readable lines.
ENV LOG_FORMAT=json
ENTRYPOINT ["payment-worker"]
CMD ["run"]
