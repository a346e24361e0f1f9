"""E2B's own Python SDK (`e2b`) against `steward sim e2b`.

Each test gets a fresh simulator (`$STEWARD_BIN sim e2b --port 0 --envd-port 0 --exec local`),
empty (`--sandboxes 0`) and asking for an API key, which the SDK reaches as a user reaches a
self-hosted E2B: `E2B_API_URL` for the API, `E2B_SANDBOX_URL` for envd (the SDK then names the
sandbox in `E2b-Sandbox-Id`/`E2b-Sandbox-Port` headers), both as the simulator prints them.
The same tests run under every SDK version `tests/vendor/run` installs (requirements-*.txt).
"""

import importlib.metadata
import json
import os
import pathlib
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

# tests/vendor/run sets STEWARD_BIN; run by hand, the debug build of this checkout is used.
STEWARD_BIN = os.environ.get("STEWARD_BIN") or str(
    pathlib.Path(__file__).resolve().parent.parent.parent.parent / "target" / "debug" / "steward"
)

API_KEY = "e2b_vendor_suite_0123456789abcdef"
SDK_VERSION = tuple(int(p) for p in importlib.metadata.version("e2b").split(".")[:2])
# e2b 2.51 and later create and connect through the v2 routes; 2.50 is the last on v1.
ROUTE = "v2" if SDK_VERSION >= (2, 51) else "v1"

# How long a test waits for something the simulator does in the background.
WAIT_SECS = 10


def wait_until(what, check, timeout=WAIT_SECS):
    """Polls `check` until it returns something true; fails naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Sim:
    """A running `steward sim e2b`."""

    def __init__(self, extra_args=()):
        args = [
            STEWARD_BIN, "sim", "e2b", "--port", "0", "--envd-port", "0",
            "--sandboxes", "0", "--exec", "local", "--api-key", API_KEY, *extra_args,
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        said = {}
        for _ in range(3):
            line = self.proc.stdout.readline()
            if "=" in line and not line.startswith("E2B simulator"):
                key, _, value = line.strip().partition("=")
                said[key] = value
        if "E2B_API_URL" not in said or "E2B_SANDBOX_URL" not in said:
            self.proc.kill()
            raise RuntimeError(f"steward sim e2b did not start: {said!r}")
        self.api_url = said["E2B_API_URL"]
        self.sandbox_url = said["E2B_SANDBOX_URL"]
        # The rest of what it says is read and dropped, so it never blocks on a full pipe.
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    def request(self, method, path, body=None, headers=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.api_url + path, data=data, method=method,
            headers={"Content-Type": "application/json", **(headers or {})},
        )
        try:
            with urllib.request.urlopen(req, timeout=WAIT_SECS) as resp:
                raw = resp.read()
                return resp.status, (json.loads(raw) if raw.strip() else None)
        except urllib.error.HTTPError as e:
            raw = e.read()
            return e.code, (json.loads(raw) if raw.strip() else None)

    def calls(self):
        """API calls the simulator counted, by op and (for create and connect) by route."""
        return self.request("GET", "/_sim/calls")[1]["calls"]

    def seed(self, **body):
        status, seeded = self.request("POST", "/_sim/sandboxes", body)
        assert status == 201, seeded
        return seeded

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=WAIT_SECS)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def start_sim(monkeypatch):
    """Starts simulators (with extra arguments) that are stopped after the test; the SDK is
    pointed at the last one started."""
    started = []

    def start(*extra_args):
        sim = Sim(extra_args)
        started.append(sim)
        monkeypatch.setenv("E2B_API_KEY", API_KEY)
        monkeypatch.setenv("E2B_API_URL", sim.api_url)
        monkeypatch.setenv("E2B_SANDBOX_URL", sim.sandbox_url)
        monkeypatch.delenv("E2B_DOMAIN", raising=False)
        monkeypatch.delenv("E2B_DEBUG", raising=False)
        return sim

    yield start
    for sim in started:
        sim.stop()


@pytest.fixture
def sim(start_sim):
    return start_sim()


@pytest.fixture
def sandbox(sim):
    """A sandbox created through the SDK, killed after the test."""
    from e2b import Sandbox

    sbx = Sandbox.create(timeout=300)
    yield sbx
    try:
        sbx.kill()
    except Exception:
        pass
