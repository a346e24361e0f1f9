# Steward's container image: `steward serve` as a non-root user on a small Debian base.
#
#   docker build -t steward .            (or: podman build --format docker -t steward .)
#   docker run --stop-timeout 30 -p 3000:3000 --env-file deploy/.env steward
#
# --stop-timeout 30: after SIGTERM Steward takes up to 20 s to let replies reach Slack, and the
# engines' default 10 s would SIGKILL it midway.
#
# Two stages. The first compiles; its dependency layer is built from the manifests alone (with
# empty sources), so it is reused until Cargo.toml or Cargo.lock change and an edit to src/
# recompiles only Steward itself. The second holds the binary and CA certificates, nothing else:
# the message templates are compiled into the binary, so the image needs no files beside it.
#
# The base images are arguments so a machine without a registry can build from local copies.
ARG RUST_IMAGE=docker.io/library/rust:1.95-slim-bookworm
ARG RUNTIME_IMAGE=docker.io/library/debian:bookworm-slim

FROM ${RUST_IMAGE} AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /build
# The release profile exactly as Cargo.toml has it: any change to it (CARGO_PROFILE_RELEASE_*)
# changes every function's symbol name, and the linker could no longer find the ones
# link/steward.order lays out together (build.rs). Debug info is stripped after the build instead.
ENV CARGO_TERM_COLOR=never

# The dependency layer: every target the manifest declares gets an empty stand-in.
COPY Cargo.toml Cargo.lock build.rs ./
COPY link ./link
RUN mkdir -p src benches \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs \
    && grep -A1 '^\[\[bench\]\]' Cargo.toml | sed -n 's/^name = "\(.*\)"$/\1/p' \
       | while read -r bench; do echo 'fn main() {}' > "benches/${bench}.rs"; done \
    && cargo build --release --locked --bin steward \
    && rm -rf src

# Steward itself. COPY keeps the files' old mtimes, which Cargo could take for "older than the
# stand-in build": touch them so it always rebuilds the crate.
COPY src ./src
COPY templates ./templates
RUN touch src/main.rs src/lib.rs \
    && cargo build --release --locked --bin steward \
    && mkdir -p /out \
    && strip --strip-debug -o /out/steward target/release/steward

FROM ${RUNTIME_IMAGE}
# CA certificates for HTTPS to Slack, E2B and GitHub (Steward trusts the system's roots beside
# the ones compiled into it, so a CA added to this image is trusted too); a system user with a
# fixed uid, no shell, no home. Package versions follow the base image's security updates rather
# than a pin. The package lists and caches go explicitly: the official image's apt hook removes
# them, a base without it (a local debootstrap) kept 90 MB of them in this layer.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
    && useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin steward
COPY --from=build /out/steward /usr/local/bin/steward

USER 10001:10001
# `steward serve` reads ./steward.toml when STEWARD_CONFIG is unset: mount the policy here.
WORKDIR /etc/steward
# Inside a container the listener must face the container's network, not its loopback.
ENV STEWARD_LISTEN=0.0.0.0:3000 \
    STEWARD_LOG_FORMAT=json
EXPOSE 3000
# Liveness only (GET /healthz through the binary itself, so no curl is needed); readiness, which
# includes Redis, is /readyz for an orchestrator's probe.
HEALTHCHECK --interval=15s --timeout=5s --start-period=10s --retries=3 \
    CMD ["steward", "healthcheck"]
ENTRYPOINT ["steward"]
CMD ["serve"]
