#!/usr/bin/env bash
# Benchmark: the real `steward sweep --dry-run` process against `steward sim e2b` run as a separate
# process, as an operator runs it: wall time, peak resident memory (VmHWM, from /usr/bin/time -v's
# "Maximum resident set size") of the sweep process alone, and the report's own pages and E2B calls.
#
# Run: benches/sweep_rss.sh            (sizes 10000 and 100000, 20 ms latency, 3 runs each)
#      SIZES="10000" RUNS=2 LATENCY_MS=20 JSON=1 benches/sweep_rss.sh
# JSON=1 measures `steward sweep --dry-run --json` (the whole report on stdout, sent to /dev/null);
# otherwise the text summary. Needs Redis at REDIS_URL (default 127.0.0.1:6379): a dry run reads
# Leave marks and open cases under a fresh key prefix, so it finds none.
#
# The floors beside the wall time: the single-stream floor is every page of the fleet one after
# the other (total pages x latency); the two-stream floor is the longer of the running and the
# paused listing, each read from one end (max(pages per state) x latency); the both-ends floor is
# that listing read from both ends at once, the second end starting after the first page
# (max(ceil((pages per state + 1) / 2)) x latency), which is how the sweep lists now. The ratio
# the issue names is against the single-stream floor (x1).
set -euo pipefail

SIZES=${SIZES:-"10000 100000"}
SIZES=${SIZES//,/ }
RUNS=${RUNS:-3}
LATENCY_MS=${LATENCY_MS:-20}
JSON=${JSON:-0}
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${STEWARD_BIN:-$ROOT/target/release/steward}

if [[ -z ${STEWARD_BIN:-} ]]; then
  (cd "$ROOT" && cargo build --release --locked --bin steward >&2)
fi
[[ -x /usr/bin/time ]] || { echo "needs /usr/bin/time (apt-get install time)" >&2; exit 1; }

work=$(mktemp -d)
sim_pid=
cleanup() {
  if [[ -n $sim_pid ]]; then kill "$sim_pid" 2>/dev/null || true; wait "$sim_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

flags=(sweep --dry-run)
[[ $JSON == 1 ]] && flags+=(--json)
printf 'steward %s: %s ms simulated E2B latency, simulator in its own process\n' "${flags[*]}" "$LATENCY_MS"
printf '%8s %4s %8s %8s %8s %8s %7s %7s %7s %7s %8s %8s %9s\n' \
  fleet run wall 1-floor 2-floor ends-flr x1 x2 xends pages running paused "peak MiB"
for n in $SIZES; do
  "$BIN" sim e2b --sandboxes "$n" --latency-ms "$LATENCY_MS" --api-key e2b_bench >"$work/sim.out" 2>"$work/sim.err" &
  sim_pid=$!
  for _ in $(seq 1 600); do
    grep -q '^E2B_API_URL=' "$work/sim.out" 2>/dev/null && break
    kill -0 "$sim_pid" 2>/dev/null || { cat "$work/sim.err" >&2; exit 1; }
    sleep 0.1
  done
  url=$(sed -n 's/^E2B_API_URL=//p' "$work/sim.out")
  team=$(sed -n 's/.*(team \([^,]*\),.*/\1/p' "$work/sim.out")
  for run in $(seq 1 "$RUNS"); do
    (cd "$work" && env -i PATH="$PATH" \
      E2B_API_URL="$url" E2B_API_KEY=e2b_bench E2B_PROJECT_ID="$team" \
      REDIS_URL="$REDIS_URL" STEWARD_REDIS_PREFIX="bench-sweep-rss-$$-$n-$run" \
      SLACK_API_URL=http://127.0.0.1:9/api RUST_LOG=error \
      /usr/bin/time -v -o "$work/time" "$BIN" "${flags[@]}" >"$work/out" 2>"$work/err") \
      || { cat "$work/err" >&2; exit 1; }
    wall=$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$work/time" \
      | awk -F: '{ s = 0; for (i = 1; i <= NF; i++) s = s * 60 + $i; print s }')
    kib=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$work/time")
    if [[ $JSON == 1 ]]; then
      read -r pages running paused < <(python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
print(r["pages"], r["fleet"]["running"], r["fleet"]["paused"])' "$work/out")
    else
      line=$(grep '^Fleet:' "$work/out")
      running=$(sed -n 's/.*(\([0-9]*\) running.*/\1/p' <<<"$line")
      paused=$(sed -n 's/.* \([0-9]*\) paused).*/\1/p' <<<"$line")
      pages=$(sed -n 's/.* in \([0-9]*\) page(s).*/\1/p' <<<"$line")
    fi
    # Pages per state at 100 a page (the sweep asks for the largest page E2B allows).
    rp=$(( (running + 99) / 100 )); pp=$(( (paused + 99) / 100 ))
    one=$(( (running + paused + 99) / 100 )); two=$(( rp > pp ? rp : pp ))
    re=$(( (rp + 2) / 2 )); pe=$(( (pp + 2) / 2 )); ends=$(( re > pe ? re : pe ))
    awk -v n="$n" -v run="$run" -v wall="$wall" -v one="$one" -v two="$two" -v ends="$ends" \
      -v lat="$LATENCY_MS" -v pages="$pages" -v r="$running" -v p="$paused" -v kib="$kib" 'BEGIN {
        f1 = one * lat / 1000; f2 = two * lat / 1000; fe = ends * lat / 1000;
        printf "%8d %4d %7.2fs %7.2fs %7.2fs %7.2fs %7.2f %7.2f %7.2f %7d %8d %8d %9.1f\n",
          n, run, wall, f1, f2, fe, wall / f1, wall / f2, wall / fe, pages, r, p, kib / 1024 }'
  done
  kill "$sim_pid"; wait "$sim_pid" 2>/dev/null || true; sim_pid=
done
echo "1-floor = ceil(fleet / 100) x latency (one stream); 2-floor = max(running pages, paused pages) x latency;"
echo "ends-flr = max(ceil((pages of a state + 1) / 2)) x latency (each state from both ends); x1, x2, xends = wall / floor"
