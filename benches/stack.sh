# Sourced by slack_load.sh and slack_instructions.sh: a scratch directory, the processes a bench
# started (stopped on exit), and the backends `steward serve` talks to under load.
#
#   bench_scratch NAME        SCRATCH=/tmp/NAME.XXXXXX, removed with every process in PIDS on exit
#   free_port                 a free TCP port on 127.0.0.1
#   wait_http URL [SECONDS]   until URL answers at all (any status), default 10 s, else stop
#   start_backends BIN [CPUS] Redis (no persistence), `BIN sim e2b` and `BIN sim slack`, pinned to
#                             CPUS when given; sets REDIS_PORT, REDIS_PID, E2B_PORT, SLACK_PORT
#   serve_env PORT SECRET PREFIX   the environment `steward serve` is run with against them

bench_scratch() {
  SCRATCH="$(mktemp -d "/tmp/$1.XXXXXX")"
  PIDS=()
  trap bench_cleanup EXIT
}

bench_cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$SCRATCH"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

wait_http() {
  for _ in $(seq $((${2:-10} * 10))); do
    curl -s -o /dev/null "$1" && return 0
    sleep 0.1
  done
  echo "$(basename "$0"): $1 did not come up" >&2
  exit 1
}

start_backends() {
  local pin=()
  if [ -n "${2:-}" ]; then pin=(taskset -c "$2"); fi
  REDIS_PORT=$(free_port)
  "${pin[@]}" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' \
    --appendonly no --dir "$SCRATCH" > "$SCRATCH/redis.log" 2>&1 &
  PIDS+=($!)
  REDIS_PID=$!
  for _ in $(seq 100); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
  E2B_PORT=$(free_port)
  "${pin[@]}" "$1" sim e2b --port "$E2B_PORT" --api-key e2b_bench --sandboxes 20 > "$SCRATCH/e2b.log" 2>&1 &
  PIDS+=($!)
  SLACK_PORT=$(free_port)
  "${pin[@]}" "$1" sim slack --listen "127.0.0.1:$SLACK_PORT" > "$SCRATCH/slack.log" 2>&1 &
  PIDS+=($!)
  wait_http "http://127.0.0.1:$E2B_PORT/"
  wait_http "http://127.0.0.1:$SLACK_PORT/"
}

# No steward.toml is read when run from the scratch directory: Steward takes its embedded defaults.
serve_env() {
  export STEWARD_LISTEN="127.0.0.1:$1" SLACK_SIGNING_SECRET="$2" SLACK_BOT_TOKEN=xoxb-bench \
    SLACK_API_URL="http://127.0.0.1:$SLACK_PORT/api" E2B_API_KEY=e2b_bench \
    E2B_API_URL="http://127.0.0.1:$E2B_PORT" REDIS_URL="redis://127.0.0.1:$REDIS_PORT" \
    STEWARD_REDIS_PREFIX="$3" RUST_LOG=warn
}
