#!/usr/bin/env bash
# Idle memory of `steward serve` and `steward demo`: the resident set (VmRSS) of each process a
# while after it started, doing nothing.
#
#   benches/idle_rss.sh            both figures (serve after 20 s, demo after 60 s)
#   WHICH=serve benches/idle_rss.sh   only one of them (serve or demo)
#
# `steward serve` runs against the simulators, each started as its own process (`steward sim
# e2b`, `steward sim slack`), and the Redis at REDIS_URL (default redis://127.0.0.1:6379) under a
# fresh key prefix; its own RSS is what is printed. `steward demo --port 0` holds the simulators,
# Steward and the in-memory store in one process, so its figure includes all of them. Uses
# target/release/steward unless STEWARD_BIN names another build (build it with
# `cargo build --release --locked`). SERVE_WAIT / DEMO_WAIT change the waits (seconds). First it
# says how many of link/steward.order's names the build has (all of them, when the order was made
# from this tree: see build.rs and scripts/symbol-order).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${STEWARD_BIN:-target/release/steward}"
SERVE_WAIT="${SERVE_WAIT:-20}"
DEMO_WAIT="${DEMO_WAIT:-60}"
WHICH="${WHICH:-serve demo}"
REDIS="${REDIS_URL:-redis://127.0.0.1:6379}"
[ -x "$BIN" ] || { echo "$BIN is missing: cargo build --release --locked" >&2; exit 1; }
BIN="$(realpath "$BIN")"

# shellcheck source=benches/stack.sh
. benches/stack.sh
bench_scratch steward-idle-rss

# VmRSS (and its anonymous and file-backed parts), VmHWM and thread count of process $1, as one line.
status_of() {
  awk '/^VmRSS|^VmHWM|^RssAnon|^RssFile|^Threads/ {printf "%s %s %s  ", $1, $2, $3} END {print ""}' "/proc/$1/status"
}

# Whether this build was linked with link/steward.order (build.rs): without it an idle
# `steward serve` holds about twice the memory. Said, not enforced: a build without it is measured.
scripts/symbol-order check "$BIN" || true

for which in $WHICH; do
  case "$which" in
    serve)
      E2B_PORT=$(free_port)
      "$BIN" sim e2b --port "$E2B_PORT" --api-key e2b_bench --sandboxes 20 > "$SCRATCH/e2b.log" 2>&1 &
      PIDS+=($!)
      SLACK_PORT=$(free_port)
      "$BIN" sim slack --listen "127.0.0.1:$SLACK_PORT" > "$SCRATCH/slack.log" 2>&1 &
      PIDS+=($!)
      wait_http "http://127.0.0.1:$E2B_PORT/"
      wait_http "http://127.0.0.1:$SLACK_PORT/"
      PORT=$(free_port)
      (
        cd "$SCRATCH"
        REDIS_PORT=6379 serve_env "$PORT" idle-rss-secret "steward-idle-rss-$$-$RANDOM"
        export REDIS_URL="$REDIS"
        exec "$BIN" serve > "$SCRATCH/serve.log" 2>&1
      ) &
      SERVE_PID=$!
      PIDS+=("$SERVE_PID")
      wait_http "http://127.0.0.1:$PORT/healthz"
      sleep "$SERVE_WAIT"
      echo "steward serve, ${SERVE_WAIT} s after start: $(status_of "$SERVE_PID")"
      ;;
    demo)
      (
        cd "$SCRATCH"
        unset REDIS_URL
        exec "$BIN" demo --port 0 > "$SCRATCH/demo.log" 2>&1
      ) &
      DEMO_PID=$!
      PIDS+=("$DEMO_PID")
      sleep "$DEMO_WAIT"
      echo "steward demo, ${DEMO_WAIT} s after start: $(status_of "$DEMO_PID")"
      ;;
    *) echo "WHICH: serve or demo, not $which" >&2; exit 1 ;;
  esac
done
