#!/usr/bin/env bash
# Instructions per Slack request of `steward serve`, counted by callgrind while the shared harness's
# signed requests (wrk, 32 connections) are sent to it: a figure that does not move with the
# hypervisor's steal or the other core's load, to compare two builds where req/s moves ±20 % run to run.
#
#   benches/slack_instructions.sh KIND [SECONDS]     KIND: command (/sandbox help) or action (a click)
#
# Starts its own Redis (free port, no persistence) and the two simulators, runs `steward serve`
# (STEWARD_BIN, default target/release/steward) under `valgrind --tool=callgrind`, sends one warm-up
# pass over the 1,000 signed bodies (for `action` the first pass meets no case; later passes are
# Slack's redeliveries, as in `slack_load.sh`), zeroes the counters, sends SECONDS (default 10) of load,
# dumps, and prints one line: requests, instructions per request, and of those the SHA-256 compression
# (under valgrind the CPU's SHA extensions are not used, so the signature's hashing costs about ten times
# its real share: read `other_per_req`, the rest). User space only; the kernel's share is not counted.
# The click's figure includes its Redis batch, whose size follows the load, so compare runs whose
# request counts are close. Needs valgrind, wrk, redis-server, python3.
set -euo pipefail

KIND="${1:?usage: benches/slack_instructions.sh command|action [SECONDS]}"
SECS="${2:-10}"
STEWARD_BIN="${STEWARD_BIN:-target/release/steward}"
BENCH_DIR="${BENCH_DIR:-/work/shared/bench}"
SECRET="${SIGNING_SECRET:-8f742231b10e8888abcd99yyyzzz85a5}"
case "$KIND" in command|action) ;; *) echo "slack_instructions: KIND must be command or action" >&2; exit 2 ;; esac
for tool in valgrind callgrind_control callgrind_annotate wrk redis-server redis-cli python3; do
  command -v "$tool" >/dev/null || { echo "slack_instructions: $tool not found" >&2; exit 2; }
done
[ -x "$STEWARD_BIN" ] || { echo "slack_instructions: $STEWARD_BIN not found (cargo build --release)" >&2; exit 2; }
STEWARD_BIN="$(cd "$(dirname "$STEWARD_BIN")" && pwd)/$(basename "$STEWARD_BIN")"

# shellcheck source=benches/stack.sh
. "$(dirname "${BASH_SOURCE[0]}")/stack.sh"
bench_scratch slack-instructions
start_backends "$STEWARD_BIN"

PORT=$(free_port)
(
  cd "$SCRATCH"
  serve_env "$PORT" "$SECRET" "instructions-$$"
  exec valgrind --tool=callgrind --callgrind-out-file="$SCRATCH/callgrind.out" "$STEWARD_BIN" serve
) > "$SCRATCH/steward.log" 2>&1 &
PIDS+=($!)
VALGRIND_PID=$!
wait_http "http://127.0.0.1:$PORT/healthz" 60

case "$KIND" in
  command) URL="http://127.0.0.1:$PORT/slack/commands" ;;
  action) URL="http://127.0.0.1:$PORT/slack/interactions" ;;
esac
SIGNING_SECRET="$SECRET" ACTION_ID=case_pause CASE_ID_PREFIX=case_ \
  python3 "$BENCH_DIR/slack_sign.py" wrk-data "$URL" "$KIND" 1000 "$SCRATCH/data.lua" > /dev/null 2>&1
wrk -t 1 -c 8 -d 3s -s "$BENCH_DIR/bench.lua" "$URL" -- "$SCRATCH/data.lua" > /dev/null
callgrind_control -z "$VALGRIND_PID" > /dev/null 2>&1
result=$(wrk -t 1 -c 32 -d "${SECS}s" -s "$BENCH_DIR/bench.lua" "$URL" -- "$SCRATCH/data.lua" | grep '^RESULT')
callgrind_control -d "$VALGRIND_PID" > /dev/null 2>&1
dump=""
for _ in $(seq 100); do
  dump=$(ls -t "$SCRATCH"/callgrind.out.* 2>/dev/null | head -n 1 || true)
  [ -n "$dump" ] && [ -s "$dump" ] && break
  sleep 0.1
done
[ -n "$dump" ] || { echo "slack_instructions: callgrind wrote no dump" >&2; exit 1; }
requests=$(echo "$result" | tr ' ' '\n' | sed -n 's/^requests=//p')
errors=$(echo "$result" | tr ' ' '\n' | sed -n 's/^err_status=//p')
total=$(callgrind_annotate "$dump" 2>/dev/null | awk '/PROGRAM TOTALS/ && !n++ { gsub(",", "", $1); print $1 }')
sha=$(callgrind_annotate --inclusive=yes "$dump" 2>/dev/null \
  | awk '/sha2::sha256::compress256/ && !n++ { gsub(",", "", $1); print $1 }')
sha=${sha:-0}
[ "${requests:-0}" -gt 0 ] || { echo "slack_instructions: wrk sent no requests" >&2; exit 1; }
echo "kind=$KIND requests=$requests err_status=$errors instructions_per_req=$((total / requests))" \
  "sha256_per_req=$((sha / requests)) other_per_req=$(((total - sha) / requests))"
