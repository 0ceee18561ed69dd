# syntax=docker/dockerfile:1
#
# The switchyard image: one binary for every process (`switchyard operator`, `switchyard router`,
# `switchyard standalone`, ...); the Helm chart in charts/switchyard picks the subcommand.
#
#   docker build -t <registry>/switchyard:0.1.0 .
#
# Builder: the toolchain that rust-toolchain.toml pins (1.95.0), so rustup downloads nothing.
FROM rust:1.95.0-bookworm AS builder
WORKDIR /src
COPY . .
# Cache mounts keep the registry and target between builds (BuildKit); the binary is copied
# out of the cached target so the next stage can see it.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p switchyard \
    && install -D -m 0755 target/release/switchyard /out/switchyard

# Runtime: glibc and libgcc only (TLS is rustls, no OpenSSL), no shell, no package manager,
# user 65532 (nonroot) -- the UID the chart's securityContext expects.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /out/switchyard /usr/local/bin/switchyard
USER 65532:65532
# Router client API / metrics, and operator metrics (the defaults the chart passes).
EXPOSE 8080 9090
ENTRYPOINT ["/usr/local/bin/switchyard"]
CMD ["--help"]
