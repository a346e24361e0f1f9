#!/usr/bin/env bash
# The Slack request path under load, as the performance goals are measured: `steward serve`
# (release build) pinned to one core, wrk and everything else on the other, 32 connections,
# 10 s, RUST_LOG=warn, through the shared harness /work/shared/bench/bench.sh (or $BENCH_DIR).
#
#   benches/slack_load.sh [REPEAT]          (default 3; run from the repository root)
#
# Starts its own Redis (a free port, no persistence), `steward sim e2b` and `steward sim slack`
# on the load generator's core, then `steward serve` on the server core against them, runs the
# `/sandbox help` command bench and the case-click bench REPEAT times each, prints every RESULT
# line and the median of each figure, and stops everything it started.
#
# Environment: STEWARD_BIN (default target/release/steward), SERVER_CPUS (1), LOADGEN_CPUS (0),
# DURATION (10), CONNECTIONS (32), BENCH_DIR (/work/shared/bench), KINDS ("command action").
# KINDS may also name `healthz`: plain `GET /healthz` with the same pinning, connections and
# duration (wrk directly, 2 s warm-up): the harness's floor, what a request that does nothing
# costs and how its p99 spreads on this machine, to read the other figures against.
# Take figures only on an otherwise idle machine (`pgrep -c rustc` should say 0).
#
# Each run's line ends with `steal_server=` and `steal_loadgen=`: the share of each core's time
# the hypervisor took during the run (/proc/stat's steal column, warm-up included). On a
# virtual machine that time is a stall for everything on the core, so a run's tail (p99) is
# read against it; medians of the runs with the least steal are printed too.
set -euo pipefail

REPEAT="${1:-3}"
STEWARD_BIN="${STEWARD_BIN:-target/release/steward}"
SERVER_CPUS="${SERVER_CPUS:-1}"
LOADGEN_CPUS="${LOADGEN_CPUS:-0}"
DURATION="${DURATION:-10}"
CONNECTIONS="${CONNECTIONS:-32}"
BENCH_DIR="${BENCH_DIR:-/work/shared/bench}"
KINDS="${KINDS:-command action}"
SECRET="${SIGNING_SECRET:-8f742231b10e8888abcd99yyyzzz85a5}"

[ -x "$STEWARD_BIN" ] || { echo "slack_load: $STEWARD_BIN not found (cargo build --release)" >&2; exit 2; }
command -v redis-server >/dev/null || { echo "slack_load: redis-server not found" >&2; exit 2; }
STEWARD_BIN="$(cd "$(dirname "$STEWARD_BIN")" && pwd)/$(basename "$STEWARD_BIN")"

busy=$(pgrep -c rustc || true)
[ "${busy:-0}" -eq 0 ] || echo "slack_load: WARNING: $busy rustc processes are running; figures will be low" >&2

# shellcheck source=benches/stack.sh
. "$(dirname "${BASH_SOURCE[0]}")/stack.sh"
bench_scratch slack-load
start_backends "$STEWARD_BIN" "$LOADGEN_CPUS"

PORT=$(free_port)
(
  cd "$SCRATCH"
  serve_env "$PORT" "$SECRET" "bench-$$"
  exec taskset -c "$SERVER_CPUS" "$STEWARD_BIN" serve
) > "$SCRATCH/steward.log" 2>&1 &
PIDS+=($!)
STEWARD_PID=$!
wait_http "http://127.0.0.1:$PORT/healthz"
echo "slack_load: $STEWARD_BIN (work tree at $(git rev-parse --short HEAD 2>/dev/null || echo '?')) pid $STEWARD_PID on cpu $SERVER_CPUS;" \
  "redis, simulators and wrk on cpu $LOADGEN_CPUS; ${DURATION}s x $CONNECTIONS connections, $REPEAT runs each"

# steal and total clock ticks of one CPU (first CPU of a list such as "1" or "0-1").
cpu_ticks() {
  awk -v c="cpu${1%%[,-]*}" '$1 == c { t = 0; for (i = 2; i <= NF; i++) t += $i; print $9, t }' /proc/stat
}
# STEAL0 TOTAL0 STEAL1 TOTAL1 -> percent, one decimal
steal_pct() { awk -v s0="$1" -v t0="$2" -v s1="$3" -v t1="$4" 'BEGIN { printf "%.1f", (t1 > t0) ? 100 * (s1 - s0) / (t1 - t0) : 0 }'; }

median() { sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
field() { tr ' ' '\n' | sed -n "s/^$1=//p"; }

steal_start() {
  read -r S_SRV T_SRV < <(cpu_ticks "$SERVER_CPUS")
  read -r S_GEN T_GEN < <(cpu_ticks "$LOADGEN_CPUS")
}
steal_end() { # -> "steal_server=P steal_loadgen=P" since steal_start
  local s_srv t_srv s_gen t_gen
  read -r s_srv t_srv < <(cpu_ticks "$SERVER_CPUS")
  read -r s_gen t_gen < <(cpu_ticks "$LOADGEN_CPUS")
  echo "steal_server=$(steal_pct "$S_SRV" "$T_SRV" "$s_srv" "$t_srv") steal_loadgen=$(steal_pct "$S_GEN" "$T_GEN" "$s_gen" "$t_gen")"
}

# One `GET /healthz` run: wrk with bench.lua's RESULT line, pinned as bench.sh pins it.
cat > "$SCRATCH/healthz.lua" <<'LUA'
function done(summary, latency, requests)
  local secs = summary.duration / 1e6
  local e = summary.errors
  io.write(string.format("RESULT rps=%.1f p50_ms=%.3f p90_ms=%.3f p99_ms=%.3f p999_ms=%.3f max_ms=%.3f mean_ms=%.3f requests=%d err_status=%d err_timeout=%d\n",
    summary.requests / secs, latency:percentile(50) / 1000, latency:percentile(90) / 1000,
    latency:percentile(99) / 1000, latency:percentile(99.9) / 1000, latency.max / 1000,
    latency.mean / 1000, summary.requests, e.status, e.timeout))
end
LUA
healthz_run() { # URL NAME
  taskset -c "$LOADGEN_CPUS" wrk -t 1 -c "$CONNECTIONS" -d 2s -s "$SCRATCH/healthz.lua" "$1" > /dev/null
  steal_start
  line=$(taskset -c "$LOADGEN_CPUS" wrk -t 1 -c "$CONNECTIONS" -d "${DURATION}s" -s "$SCRATCH/healthz.lua" "$1" | grep '^RESULT')
  line="$line $(steal_end)"
  echo "healthz run ${2#*.}: $line"
  echo "$line" >> "$SCRATCH/healthz.results"
}

for kind in $KINDS; do
  case "$kind" in
    command) url="http://127.0.0.1:$PORT/slack/commands"; extra=() ;;
    action) url="http://127.0.0.1:$PORT/slack/interactions"; extra=(ACTION_ID=case_pause CASE_ID_PREFIX=case_) ;;
    healthz) url="http://127.0.0.1:$PORT/healthz"; extra=() ;;
    *) echo "slack_load: unknown kind $kind" >&2; exit 2 ;;
  esac
  : > "$SCRATCH/$kind.results"
  for run in $(seq "$REPEAT"); do
    if [ "$kind" = healthz ]; then
      healthz_run "$url" "$kind.$run"
      continue
    fi
    steal_start
    out=$(env "${extra[@]}" SIGNING_SECRET="$SECRET" LOADGEN_CPUS="$LOADGEN_CPUS" \
      WATCH_PIDS="$STEWARD_PID $REDIS_PID" "$BENCH_DIR/bench.sh" "$url" "$kind" "$DURATION" "$CONNECTIONS") || {
      echo "$out" >&2; echo "slack_load: $kind run $run failed" >&2; exit 1; }
    line="$(echo "$out" | grep '^RESULT') $(steal_end)"
    echo "$kind run $run: $line"
    echo "$line" >> "$SCRATCH/$kind.results"
  done
  for f in rps p50_ms p99_ms steal_server steal_loadgen; do
    printf '%s median %s=%s\n' "$kind" "$f" "$(field "$f" < "$SCRATCH/$kind.results" | median)"
  done
  # The runs with the least steal on both cores: the half (at least one) with the lowest sum.
  keep=$(( (REPEAT + 1) / 2 ))
  while read -r l; do
    echo "$(echo "$l" | field steal_server) $(echo "$l" | field steal_loadgen) $l"
  done < "$SCRATCH/$kind.results" | awk '{ s = $1 + $2; $1 = ""; $2 = ""; sub(/^  /, ""); print s, $0 }' \
    | sort -g | head -n "$keep" | cut -d' ' -f2- > "$SCRATCH/$kind.quiet"
  printf '%s least-steal %d of %d: median rps=%s p99_ms=%s (steal_server %s, steal_loadgen %s)\n' "$kind" "$keep" "$REPEAT" \
    "$(field rps < "$SCRATCH/$kind.quiet" | median)" "$(field p99_ms < "$SCRATCH/$kind.quiet" | median)" \
    "$(field steal_server < "$SCRATCH/$kind.quiet" | paste -sd/)" "$(field steal_loadgen < "$SCRATCH/$kind.quiet" | paste -sd/)"
done
if grep -qiE ' (ERROR|WARN) ' "$SCRATCH/steward.log"; then
  echo "slack_load: steward logged warnings or errors (first 5):"
  grep -iE ' (ERROR|WARN) ' "$SCRATCH/steward.log" | head -5
fi
