#!/usr/bin/env bash
# E2B lifecycle webhook intake under load, measured as the Slack request path is: `steward serve`
# (release build) pinned to one core, wrk, Redis and the simulators on the other, keep-alive
# connections, RUST_LOG=warn.
#
#   benches/e2b_webhook_load.sh [REPEAT]          (default 3; run from the repository root)
#
# Every request is a distinct `sandbox.lifecycle.killed` event, signed as E2B signs
# (`e2b-signature` v1) for sandboxes without a case, so each is checked (size cap, signature),
# parsed, deduplicated in Redis and answered; the work after the answer (the case lookup) is
# part of the server core's load. KINDS="new repeat" (default): `new` sends events never seen
# before (EVENTS of them per run, more than a run sends); `repeat` sends 20,000 events again and
# again after a warm-up that sent each once, every one a duplicate. Steward's own /metrics counts how each was taken, so a run that sent more
# events than it had (they would come round again as duplicates) is reported, not hidden.
#
# Environment: STEWARD_BIN (target/release/steward), SERVER_CPUS (1), LOADGEN_CPUS (0),
# DURATION (10), CONNECTIONS (32), EVENTS (700000), KINDS ("new repeat").
# Take figures only on an otherwise idle machine (`pgrep -c rustc` should say 0).
set -euo pipefail

REPEAT="${1:-3}"
STEWARD_BIN="${STEWARD_BIN:-target/release/steward}"
SERVER_CPUS="${SERVER_CPUS:-1}"
LOADGEN_CPUS="${LOADGEN_CPUS:-0}"
DURATION="${DURATION:-10}"
CONNECTIONS="${CONNECTIONS:-32}"
EVENTS="${EVENTS:-700000}"
KINDS="${KINDS:-new repeat}"
WEBHOOK_SECRET="whsec-bench-$$"

[ -x "$STEWARD_BIN" ] || { echo "e2b_webhook_load: $STEWARD_BIN not found (cargo build --release)" >&2; exit 2; }
command -v wrk >/dev/null || { echo "e2b_webhook_load: wrk not found (apt-get install wrk)" >&2; exit 2; }
STEWARD_BIN="$(cd "$(dirname "$STEWARD_BIN")" && pwd)/$(basename "$STEWARD_BIN")"
busy=$(pgrep -c rustc || true)
[ "${busy:-0}" -eq 0 ] || echo "e2b_webhook_load: WARNING: $busy rustc processes are running; figures will be low" >&2

# shellcheck source=benches/stack.sh
. "$(dirname "${BASH_SOURCE[0]}")/stack.sh"
bench_scratch e2b-webhook-load
start_backends "$STEWARD_BIN" "$LOADGEN_CPUS"

PORT=$(free_port)
(
  cd "$SCRATCH"
  serve_env "$PORT" bench-slack-secret "bench-$$"
  export E2B_WEBHOOK_SECRET="$WEBHOOK_SECRET"
  exec taskset -c "$SERVER_CPUS" "$STEWARD_BIN" serve
) > "$SCRATCH/steward.log" 2>&1 &
PIDS+=($!)
STEWARD_PID=$!
wait_http "http://127.0.0.1:$PORT/healthz"
URL="http://127.0.0.1:$PORT/e2b/webhook"
echo "e2b_webhook_load: $STEWARD_BIN ($(git rev-parse --short HEAD 2>/dev/null || echo '?')) pid $STEWARD_PID on cpu $SERVER_CPUS;" \
  "redis, simulators and wrk on cpu $LOADGEN_CPUS; ${DURATION}s x $CONNECTIONS connections, $REPEAT runs each"

# EVENTS signed events named after $1 as a Lua file wrk's script loads: the body is built in Lua
# from the event's number (init, not per request), the signature comes precomputed.
make_events() { # NAME FILE
  python3 - "$1" "$2" "$EVENTS" "$WEBHOOK_SECRET" <<'PY'
import base64, hashlib, sys
name, path, n, secret = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].encode()
head = '{"version":"v1","id":"'
mid = '","type":"sandbox.lifecycle.killed","eventData":{"sandbox_metadata":{"owner":"bench"}},"sandboxBuildId":"b","sandboxExecutionId":"x","sandboxId":"i'
tail = '","sandboxTeamId":"t","sandboxTemplateId":"base","timestamp":"2026-12-07T10:00:00Z"}'
with open(path, "w") as f:
    f.write('return {name="%s", head=[[%s]], mid=[[%s]], tail=[[%s]], sigs={\n' % (name, head, mid, tail))
    for i in range(n):
        body = f"{head}{name}-{i}{mid}{name}{i:07d}{tail}".encode()
        sig = base64.urlsafe_b64encode(hashlib.sha256(secret + body).digest()).rstrip(b"=").decode()
        f.write('"%s",\n' % sig)
    f.write("}}\n")
PY
}

cat > "$SCRATCH/events.lua" <<'LUA'
local reqs, n, i = {}, 0, 0
function init(args)
  local d = dofile(args[1])
  for k, sig in ipairs(d.sigs) do
    local body = d.head .. d.name .. "-" .. (k - 1) .. d.mid .. d.name .. string.format("%07d", k - 1) .. d.tail
    reqs[k] = wrk.format("POST", "/e2b/webhook", {
      ["Content-Type"] = "application/json",
      ["e2b-signature-version"] = "v1",
      ["e2b-signature"] = sig,
    }, body)
  end
  n = #reqs
end
function request()
  i = i + 1
  if i > n then i = 1 end
  return reqs[i]
end
function done(summary, latency, requests)
  local secs = summary.duration / 1e6
  local e = summary.errors
  io.write(string.format("RESULT rps=%.1f p50_ms=%.3f p90_ms=%.3f p99_ms=%.3f p999_ms=%.3f max_ms=%.3f requests=%d err_status=%d err_timeout=%d err_read=%d\n",
    summary.requests / secs, latency:percentile(50) / 1000, latency:percentile(90) / 1000,
    latency:percentile(99) / 1000, latency:percentile(99.9) / 1000, latency.max / 1000,
    summary.requests, e.status, e.timeout, e.read))
end
LUA

# Steward's own count of events by outcome: "new duplicate" (new = every handled outcome).
taken() {
  curl -s "http://127.0.0.1:$PORT/metrics" | awk '
    /^steward_e2b_events_total\{/ { if ($0 ~ /outcome="duplicate"/) d += $NF; else if ($0 !~ /outcome="refused"/) n += $NF }
    END { printf "%d %d\n", n, d }'
}

median() { sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
field() { tr ' ' '\n' | sed -n "s/^$1=//p"; }

for run in $(seq "$REPEAT"); do
  for kind in $KINDS; do
    if [ "$kind" = new ]; then
      # warm-up: 2 s of events of their own, so the measured run's are still all new
      make_events "r$run" "$SCRATCH/run.lua"
      make_events "w$run" "$SCRATCH/warm.lua"
    else
      # 20,000 events, every one sent in the warm-up (2 s), so the measured run only repeats
      EVENTS=20000 make_events "p$run" "$SCRATCH/run.lua"
      cp "$SCRATCH/run.lua" "$SCRATCH/warm.lua"
    fi
    taskset -c "$LOADGEN_CPUS" wrk -t 1 -c "$CONNECTIONS" -d 2s -s "$SCRATCH/events.lua" "$URL" -- "$SCRATCH/warm.lua" > /dev/null
    read -r n0 d0 < <(taken)
    line=$(taskset -c "$LOADGEN_CPUS" wrk -t 1 -c "$CONNECTIONS" -d "${DURATION}s" -s "$SCRATCH/events.lua" "$URL" -- "$SCRATCH/run.lua" | grep '^RESULT')
    read -r n1 d1 < <(taken)
    line="$line new=$((n1 - n0)) duplicate=$((d1 - d0))"
    echo "$kind run $run: $line"
    echo "$line" >> "$SCRATCH/$kind.results"
  done
done
for kind in $KINDS; do
  for f in rps p50_ms p99_ms new duplicate; do
    printf '%s median %s=%s\n' "$kind" "$f" "$(field "$f" < "$SCRATCH/$kind.results" | median)"
  done
done
if grep -qiE ' (ERROR|WARN) ' "$SCRATCH/steward.log"; then
  echo "e2b_webhook_load: steward logged warnings or errors (first 5):"
  grep -iE ' (ERROR|WARN) ' "$SCRATCH/steward.log" | head -5
fi
