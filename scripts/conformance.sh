#!/usr/bin/env bash
# Conformance check of Steward's E2B client against a server generated from E2B's own OpenAPI spec.
#
# Stoplight Prism (`prism mock --errors`) serves shared/e2b/openapi.yml and answers 400/401/404/422
# to any request that does not match the spec (wrong path, method, query, body, header). The script
# runs EVERY `steward e2b` action against it and fails if any action fails, and checks that `list`
# terminates even though Prism hands out a next-page token on every page.
#
# Usage: scripts/conformance.sh            (needs cargo, node/npm; installs Prism into ./.cache)
# Env:   E2B_OPENAPI=path/to/openapi.yml   (default: the nearest shared/e2b/openapi.yml above the repo)
#        PRISM_PORT=4010                   (default: a free port)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"

# The spec sits at ../shared/e2b/openapi.yml from the project root; a git worktree may sit deeper.
spec="${E2B_OPENAPI:-}"
if [[ -z "$spec" ]]; then
  dir="$root"
  while [[ "$dir" != "/" ]]; do
    dir="$(dirname "$dir")"
    if [[ -f "$dir/shared/e2b/openapi.yml" ]]; then
      spec="$dir/shared/e2b/openapi.yml"
      break
    fi
  done
fi
if [[ -z "$spec" || ! -f "$spec" ]]; then
  echo "conformance: cannot find shared/e2b/openapi.yml above $root (set E2B_OPENAPI)" >&2
  exit 2
fi

cache="$root/.cache/prism"
prism="$cache/node_modules/.bin/prism"
if [[ ! -x "$prism" ]]; then
  echo "conformance: installing @stoplight/prism-cli@5 into $cache"
  npm install --silent --no-audit --no-fund --prefix "$cache" @stoplight/prism-cli@5 >/dev/null
fi

echo "conformance: building steward"
(cd "$root" && cargo build --quiet --bin steward)
steward="$root/target/debug/steward"

port="${PRISM_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}"
work="$(mktemp -d)"
prism_log="$work/prism.log"
prism_pid=""
cleanup() {
  if [[ -n "$prism_pid" ]]; then
    kill "$prism_pid" 2>/dev/null || true
    wait "$prism_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

"$prism" mock "$spec" --errors -h 127.0.0.1 -p "$port" >"$prism_log" 2>&1 &
prism_pid=$!

echo "conformance: waiting for Prism on 127.0.0.1:$port"
for _ in $(seq 1 120); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    break
  fi
  if ! kill -0 "$prism_pid" 2>/dev/null; then
    echo "conformance: Prism exited early:" >&2
    cat "$prism_log" >&2
    exit 2
  fi
  sleep 0.5
done
if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
  echo "conformance: Prism did not start listening" >&2
  cat "$prism_log" >&2
  exit 2
fi

export E2B_API_URL="http://127.0.0.1:$port"
export E2B_API_KEY="e2b_0123456789abcdef"
export E2B_PROJECT_ID="3f1b6c2e-8d4a-4c7e-9b1f-2a5d6e7f8a9b"
export RUST_LOG="${RUST_LOG:-warn}"

sandbox="i1a2b3c4d5e6f7g8h9"
snapshot="team-slug/my-snapshot:default"

failures=0
passed=0
# run NAME ARGS...: one steward e2b action with --json; stdout and stderr are kept for checks.
run() {
  local name="$1"
  shift
  if "$steward" e2b --json "$@" >"$work/$name.out" 2>"$work/$name.err"; then
    if ! python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$work/$name.out" 2>/dev/null; then
      echo "FAIL $name: output is not JSON"
      sed 's/^/    /' "$work/$name.out" | head -20
      failures=$((failures + 1))
      return
    fi
    echo "ok   $name"
    passed=$((passed + 1))
  else
    echo "FAIL $name: steward e2b $*"
    sed 's/^/    /' "$work/$name.err" | head -20
    failures=$((failures + 1))
  fi
}

run list list --state all --metadata user=abc --metadata app=prod --template base --limit 50 --max-pages 3
run list-one-page list --state running --all-pages false
run list-from-token list --state paused --page-token some-token
run get get "$sandbox"
run create create base --timeout 5m --metadata owner=conformance
run kill kill "$sandbox" --yes
run pause pause "$sandbox"
run resume resume "$sandbox" --timeout 10m
run connect connect "$sandbox" --timeout 10m
run timeout timeout "$sandbox" 15m
run refresh refresh "$sandbox" 10m
run refresh-default refresh "$sandbox"
run logs logs "$sandbox" --level warn --search error --limit 100 --cursor 1700000000000 --forward
run logs-default logs "$sandbox"
run metrics metrics "$sandbox" --since 2h
run metrics-many metrics-many "$sandbox" sbx2 sbx3
run metrics-many-all metrics-many --all --max-pages 2
run team-metrics team-metrics --since 24h
run team-metrics-max-concurrent team-metrics --since 24h --max concurrent
run team-metrics-max-start-rate team-metrics --max start-rate
run snapshot snapshot "$sandbox" --name nightly
run snapshot-unnamed snapshot "$sandbox"
run snapshots snapshots --sandbox "$sandbox" --max-pages 3
run snapshots-all snapshots --max-pages 3
run templates templates --max-pages 3
run template template "$snapshot"
run template-plain template base
run delete-template delete-template "$snapshot" --yes

# Prism invents an X-Next-Token on every page: `list` must have stopped by itself and said so.
if grep -q "^Warning: paging was stopped" "$work/list.err"; then
  echo "ok   list stopped by itself and said so: $(grep "^Warning: paging was stopped" "$work/list.err")"
  passed=$((passed + 1))
else
  echo "FAIL list did not report a stopped listing"
  sed 's/^/    /' "$work/list.err" | head -20
  failures=$((failures + 1))
fi

# Any request Prism found non-conforming shows up in its log as a violation.
# (Prism's start-up banner lists random example URLs, so match its error markers, not numbers.)
violations='Violation|\[VALIDATOR\] .*error|NO_PATH_MATCHED|UNPROCESSABLE|✖'
if grep -Eq "$violations" "$prism_log"; then
  echo "FAIL Prism reported problems with Steward's requests:"
  grep -E "$violations" "$prism_log" | sed 's/^/    /' | head -40
  failures=$((failures + 1))
fi

echo "conformance: $passed passed, $failures failed"
[[ "$failures" -eq 0 ]]
