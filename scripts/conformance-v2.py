"""E2B's v2 create and connect, answered from the official SDK's generated models.

shared/e2b/openapi.yml predates `POST /v2/sandboxes` and `POST /v2/sandboxes/{id}/connect`, so
Prism cannot check them. This stand-in checks each body Steward sends against the generated
client of the pinned e2b SDK (`NewSandboxV2`, `ConnectSandboxV2`): every field must be one the
model knows, with the type its annotation gives, and the required ones present. It answers with a
`Sandbox` the model itself renders. Any other request, or a body that does not fit, is a 400 and
a line in the verdict file the conformance script reads.

Usage: python conformance-v2.py PORT_FILE VERDICT_FILE   (runs until killed)
"""

import http.server
import json
import re
import sys

from e2b.api.client.models import ConnectSandboxV2, NewSandboxV2, Sandbox

port_file, verdict_file = sys.argv[1], sys.argv[2]
problems = []


# The JSON type of each scalar or map field, as the SDK's models annotate them (nested objects are
# checked by the models' own from_dict/to_dict round trip).
TYPES = {
    "templateID": str,
    "timeout": int,
    "autoPause": bool,
    "autoPauseMemory": bool,
    "allow_internet_access": bool,
    "memory": bool,
    "metadata": dict,
    "envVars": dict,
    "volumeMounts": list,
}


def check(model, body, required):
    if not isinstance(body, dict):
        return [f"{model.__name__}: the body is not a JSON object"]
    found = []
    for name in required:
        if name not in body:
            found.append(f"{model.__name__}: required {name!r} is missing")
    if found:
        return found
    parsed = model.from_dict(body)
    if parsed.additional_properties:
        found.append(
            f"{model.__name__}: fields the SDK's model does not have: {sorted(parsed.additional_properties)}"
        )
    # What the model writes back must be what was sent: the same names, the same values.
    again = parsed.to_dict()
    for key, value in body.items():
        if key not in parsed.additional_properties and again.get(key) != value:
            found.append(f"{model.__name__}: {key!r} does not survive the model: {value!r}")
    for key, value in body.items():
        want = TYPES.get(key)
        if want is None:
            continue
        wrong = not isinstance(value, want) or (want is int and isinstance(value, bool))
        if wrong:
            found.append(f"{model.__name__}: {key!r} must be {want.__name__}, got {value!r}")
        if want is dict and isinstance(value, dict):
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
                found.append(f"{model.__name__}: {key!r} must map strings to strings")
    return found


class Handler(http.server.BaseHTTPRequestHandler):
    def answer(self, status, body):
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"null")
        except ValueError:
            body = None
        path = self.path.split("?")[0]
        found = []
        if path == "/v2/sandboxes":
            found = check(NewSandboxV2, body, ["templateID"])
            status = 201
            template = body.get("templateID", "") if isinstance(body, dict) else ""
            sandbox_id = "iconformancev2"
        elif re.fullmatch(r"/v2/sandboxes/[^/]+/connect", path):
            found = check(ConnectSandboxV2, body, [])
            status, template, sandbox_id = 200, "base", path.split("/")[3]
        else:
            found = [f"POST {path}: not a v2 route this check serves"]
        if not self.headers.get("X-API-Key"):
            found.append(f"POST {path}: no X-API-Key header")
        problems.extend(found)
        with open(verdict_file, "a") as out:
            for line in found or [f"ok POST {path}"]:
                out.write(line + "\n")
        if found:
            self.answer(400, {"code": 400, "message": "; ".join(found)})
            return
        reply = Sandbox(
            template_id=template,
            sandbox_id=sandbox_id,
            client_id="6532622b",
            envd_version="0.6.4",
            envd_access_token="conformance-envd-token",
            domain=None,
        ).to_dict()
        self.answer(status, reply)

    def do_GET(self):
        self.answer(404, {"code": 404, "message": "Not found"})

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
with open(port_file, "w") as out:
    out.write(str(server.server_address[1]))
server.serve_forever()
