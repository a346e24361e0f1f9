"""Slack's own Python client (slack_sdk) against `steward sim slack`.

Each test gets a fresh simulator (`$STEWARD_BIN sim slack --listen 127.0.0.1:0`) with the
workspace every test expects: `#approvals` (C0APPROVALS), which the bot is in, `#lonely`
(C0LONELY), which it is not, only those channels (`--only-listed-channels`, as in Slack), one
pinned bot token, one app-level token, a person the page acts as and a user group. What the
simulator signs and sends to Steward goes to a small receiver started here instead
(`--steward-url`), so the tests can check those signatures with slack_sdk's verifier.
"""

import http.server
import json
import os
import pathlib
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest
from slack_sdk import WebClient

# tests/vendor/run sets STEWARD_BIN; run by hand, the debug build of this checkout is used.
STEWARD_BIN = os.environ.get("STEWARD_BIN") or str(
    pathlib.Path(__file__).resolve().parent.parent.parent.parent / "target" / "debug" / "steward"
)

BOT_TOKEN = "xoxb-vendor-suite-bot"
APP_TOKEN = "xapp-1-A0STEWARD-vendor-suite"
SIGNING_SECRET = "vendor-suite-signing-secret"
APPROVALS = "C0APPROVALS"
LONELY = "C0LONELY"
PERSON = "U0ADA"
GROUP = "S0SRE"
GROUP_MEMBERS = ["U0ADA", "U0BOB"]

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


class Receiver:
    """Stands in for Steward: records every request the simulator sends it, answers 200."""

    def __init__(self):
        self.requests = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                with receiver.lock:
                    receiver.requests.append(
                        {"path": self.path, "headers": dict(self.headers.items()), "body": body}
                    )
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def received(self, path):
        with self.lock:
            return [r for r in self.requests if r["path"] == path]

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


class Sim:
    """A running `steward sim slack`."""

    def __init__(self, extra_args=(), steward_url=None):
        args = [
            STEWARD_BIN, "sim", "slack", "--listen", "127.0.0.1:0",
            "--only-listed-channels",
            "--channel", f"approvals={APPROVALS}",
            "--channel-without-bot", f"lonely={LONELY}",
            "--person", f"{PERSON}=Ada (approver)",
            "--group", f"{GROUP}={','.join(GROUP_MEMBERS)}",
            "--bot-token", BOT_TOKEN,
            "--app-token", APP_TOKEN,
            *extra_args,
        ]
        if steward_url:
            args += ["--steward-url", steward_url]
        env = dict(os.environ, SLACK_SIGNING_SECRET=SIGNING_SECRET)
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=env)
        first = self.proc.stdout.readline()
        prefix = "Fake Slack listening on "
        if not first.startswith(prefix):
            self.proc.kill()
            raise RuntimeError(f"steward sim slack did not start: {first!r}")
        self.base_url = first[len(prefix):].strip()
        # The rest of what it says is read and dropped, so it never blocks on a full pipe.
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()
        self.api_url = f"{self.base_url}/api/"

    def request(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.base_url + path, data=data, method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=WAIT_SECS) as resp:
                raw = resp.read()
                return resp.status, (json.loads(raw) if raw.strip() else None)
        except urllib.error.HTTPError as e:
            raw = e.read()
            return e.code, (json.loads(raw) if raw.strip() else None)

    def post(self, path, body):
        return self.request("POST", path, body)

    def get(self, path):
        return self.request("GET", path)[1]

    def get_bytes(self, path):
        with urllib.request.urlopen(self.base_url + path, timeout=WAIT_SECS) as resp:
            return resp.read()

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=WAIT_SECS)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.stop()


@pytest.fixture
def start_sim(receiver):
    """Starts simulators (with extra arguments) that are stopped after the test."""
    started = []

    def start(*extra_args):
        sim = Sim(extra_args, steward_url=receiver.url)
        started.append(sim)
        return sim

    yield start
    for sim in started:
        sim.stop()


@pytest.fixture
def sim(start_sim):
    return start_sim()


@pytest.fixture
def client(sim):
    return WebClient(token=BOT_TOKEN, base_url=sim.api_url)
