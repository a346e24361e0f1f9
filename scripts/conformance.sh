#!/usr/bin/env bash
# Conformance check of Steward's E2B client against a server generated from E2B's own OpenAPI spec.
#
# Stoplight Prism (`prism mock --errors`) serves shared/e2b/openapi.yml and answers 400/401/404/422
# to any request that does not match the spec (wrong path, method, query, body, header). The script
# runs EVERY `steward e2b` action against it and fails if any action fails, and checks that `list`
# terminates even though Prism hands out a next-page token on every page.
#
# The spec predates E2B's v2 create and connect (`POST /v2/sandboxes`, `POST /v2/sandboxes/{id}/
# connect`), which Steward tries first: Prism answers them 405/404 as an E2B without v2 would, so
# Steward's fallback to the v1 routes is what Prism checks, and those two probes are the only
# "no route" lines allowed in its log. The v2 bodies are checked instead against the official SDK's
# generated models (scripts/conformance-v2.py, e2b as pinned in tests/vendor/e2b/requirements-2.63.txt,
# installed into ./.cache/e2b-sdk with pip).
#
# Usage: scripts/conformance.sh            (needs cargo, node/npm, python3 with venv; installs
#                                          Prism and the e2b SDK into ./.cache)
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
v2_pid=""
cleanup() {
  local pid
  for pid in "$prism_pid" "$v2_pid"; do
    if [[ -n "$pid" ]]; then
      kill "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
    fi
  done
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

# Steward tried the v2 create and connect first; the spec has no v2, so Prism answered them as an
# E2B without v2 would (405 and 404), and the v1 requests above are the fallback.
v2_probe='post /v2/sandboxes(/[^/ ]+/connect)? ✖ .*(NO_METHOD_MATCHED|NO_PATH_MATCHED)'
for label in 'POST /v2/sandboxes' 'POST /v2/sandboxes/{id}/connect'; do
  route="${label/POST/post}"
  route="${route/\{id\}/[^/ ]+}"
  if grep -Eq "$route ✖ .*(NO_METHOD_MATCHED|NO_PATH_MATCHED)" "$prism_log"; then
    echo "ok   $label was tried first; the spec lacks it, so Steward fell back to v1"
    passed=$((passed + 1))
  else
    echo "FAIL $label was never tried: Steward did not ask for E2B's v2 route first"
    failures=$((failures + 1))
  fi
done

# Any other request Prism found non-conforming shows up in its log as a violation.
# (Prism's start-up banner lists random example URLs, so match its error markers, not numbers.)
violations='Violation|\[VALIDATOR\] .*error|NO_PATH_MATCHED|NO_METHOD_MATCHED|UNPROCESSABLE|✖'
if grep -E "$violations" "$prism_log" | grep -Evq "$v2_probe"; then
  echo "FAIL Prism reported problems with Steward's requests:"
  grep -E "$violations" "$prism_log" | grep -Ev "$v2_probe" | sed 's/^/    /' | head -40
  failures=$((failures + 1))
fi

# The v2 bodies, against the official SDK's generated models (NewSandboxV2, ConnectSandboxV2).
sdk="$root/.cache/e2b-sdk"
requirements="$root/tests/vendor/e2b/requirements-2.63.txt"
if [[ ! -x "$sdk/bin/python" ]] || ! cmp -s "$requirements" "$sdk/requirements.txt"; then
  echo "conformance: installing the e2b SDK ($requirements) into $sdk"
  rm -rf "$sdk"
  python3 -m venv "$sdk"
  "$sdk/bin/pip" install -q --disable-pip-version-check -r "$requirements"
  cp "$requirements" "$sdk/requirements.txt"
fi
"$sdk/bin/python" "$here/conformance-v2.py" "$work/v2.port" "$work/v2.verdict" >"$work/v2.log" 2>&1 &
v2_pid=$!
for _ in $(seq 1 100); do
  [[ -s "$work/v2.port" ]] && break
  if ! kill -0 "$v2_pid" 2>/dev/null; then
    echo "conformance: the v2 check exited early:" >&2
    cat "$work/v2.log" >&2
    exit 2
  fi
  sleep 0.1
done
export E2B_API_URL="http://127.0.0.1:$(cat "$work/v2.port")"
run v2-create create base --timeout 5m --metadata owner=conformance --metadata "team=a b&c=d"
run v2-connect connect "$sandbox" --timeout 10m
if grep -qv '^ok ' "$work/v2.verdict" 2>/dev/null; then
  echo "FAIL Steward's v2 requests do not fit the SDK's models:"
  grep -v '^ok ' "$work/v2.verdict" | sed 's/^/    /' | head -20
  failures=$((failures + 1))
elif [[ "$(grep -c '^ok ' "$work/v2.verdict" 2>/dev/null)" -ne 2 ]]; then
  echo "FAIL the v2 check did not see Steward's v2 create and connect"
  failures=$((failures + 1))
else
  echo "ok   v2 create and connect bodies fit e2b's NewSandboxV2 and ConnectSandboxV2"
  passed=$((passed + 1))
fi

echo "conformance: $passed passed, $failures failed"
[[ "$failures" -eq 0 ]]
