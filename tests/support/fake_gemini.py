"""A small fake of the Gemini API (generativelanguage v1beta), for running the real gemini-cli offline in tests.

It answers `POST /v1beta/models/MODEL:streamGenerateContent?alt=sse` (server-sent events), `:generateContent`
and `:countTokens`, and logs every request as one JSON line. Behaviour is read from a control file on every
request, so a test can change it while the session runs:

    {"delay": seconds the main turn waits before answering (the TUI shows it busy meanwhile),
     "hold": true to stall the main turn until the control file no longer says so (bounded by "hold_max", default
             300 s): a turn that lasts exactly as long as a test needs it, however slow the machine,
     "reply": the text of the answer,
     "shell": "a command" to answer the main turn with a run_shell_command function call instead (gemini-cli then
              asks its user to approve the command: a real approval dialog)}

The main turn is a request that offers tools; gemini-cli's side requests (the model router, the next-speaker
check, ...) offer none and ask for JSON, and get a plausible JSON answer at once.

    python fake_gemini.py --port 8766 --log requests.jsonl --control control.json
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL_VERSION = "gemini-fake-001"


class Handler(BaseHTTPRequestHandler):
    server_version = "fake-gemini/1"
    protocol_version = "HTTP/1.1"
    log_path = ""
    control_path = ""

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _control(self) -> dict[str, Any]:
        try:
            with open(self.control_path, encoding="utf-8") as f:
                return dict(json.load(f))
        except (OSError, ValueError):
            return {}

    def _record(self, method: str, body: Any) -> None:
        if not self.log_path:
            return
        with open(self.log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"t": time.time(), "method": method, "path": self.path, "body": body}) + "\n")

    def _json(self, status: int, data: Any) -> None:
        raw = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json; charset=UTF-8")
        self.send_header("content-length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:
        self._record("GET", None)
        if "/models" in self.path:
            self._json(200, {"models": [{"name": "models/gemini-2.5-pro"}, {"name": "models/gemini-2.5-flash"}]})
            return
        self._json(404, {"error": {"code": 404, "message": f"no such path {self.path}", "status": "NOT_FOUND"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {"raw": raw.decode("utf-8", "replace")}
        self._record("POST", body)
        path = self.path.split("?", 1)[0]
        if path.endswith(":countTokens"):
            self._json(200, {"totalTokens": 10})
            return
        if path.endswith(":embedContent") or path.endswith(":batchEmbedContents"):
            self._json(200, {"embedding": {"values": [0.0] * 8}})
            return
        if not (path.endswith(":generateContent") or path.endswith(":streamGenerateContent")):
            self._json(404, {"error": {"code": 404, "message": f"no such path {self.path}", "status": "NOT_FOUND"}})
            return
        control = self._control()
        main_turn = bool(body.get("tools"))
        if main_turn:
            self._stall(control)
        response = {
            "candidates": [
                {"content": {"role": "model", "parts": self._parts(body, control)}, "finishReason": "STOP", "index": 0}
            ],
            "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15},
            "modelVersion": MODEL_VERSION,
        }
        if path.endswith(":streamGenerateContent"):
            self._stream(response)
        else:
            self._json(200, response)

    def _stall(self, control: dict[str, Any]) -> None:
        """Wait `delay` seconds, and on while the control file says `hold` (re-read: the test lets go by rewriting it)."""
        deadline = time.monotonic() + float(control.get("delay", 0))
        hold_until = time.monotonic() + float(control.get("hold_max", 300))
        while True:
            now = time.monotonic()
            if now >= deadline and not (self._control().get("hold") and now < hold_until):
                return
            time.sleep(0.1)

    @staticmethod
    def _parts(body: dict[str, Any], control: dict[str, Any]) -> list[dict[str, Any]]:
        config = body.get("generationConfig") or body.get("config") or {}
        if not body.get("tools") and config.get("responseMimeType") == "application/json":
            return [{"text": json.dumps(side_answer(config))}]
        contents = body.get("contents") or [{}]
        last_parts = contents[-1].get("parts") or []
        answered_call = any(isinstance(p, dict) and "functionResponse" in p for p in last_parts)
        command = control.get("shell")
        if command and body.get("tools") and not answered_call:
            return [
                {
                    "functionCall": {
                        "name": "run_shell_command",
                        "args": {"command": str(command), "description": "clean the build"},
                    }
                }
            ]
        return [{"text": str(control.get("reply", "Understood."))}]

    def _stream(self, response: dict[str, Any]) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.end_headers()
        self.wfile.write(f"data: {json.dumps(response)}\r\n\r\n".encode())
        self.wfile.flush()
        self.close_connection = True


def side_answer(config: dict[str, Any]) -> dict[str, Any]:
    """A JSON answer that fits the schema of a side request (router, next-speaker check, ...)."""
    schema = config.get("responseJsonSchema") or config.get("responseSchema") or {}
    props = schema.get("properties") or {}
    out: dict[str, Any] = {}
    for key, spec in props.items():
        kind = str(spec.get("type", "string")).lower()
        if spec.get("enum"):
            out[key] = spec["enum"][0]
        elif kind == "boolean":
            out[key] = False
        elif kind in ("number", "integer"):
            out[key] = 0
        elif kind == "array":
            out[key] = []
        elif kind == "object":
            out[key] = {}
        else:
            out[key] = "fake"
    if "next_speaker" in props:
        out["next_speaker"] = "user"
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", default="")
    parser.add_argument("--control", required=True)
    parser.add_argument("--watch-pid", type=int, default=0, help="exit when this process is gone")
    args = parser.parse_args()
    Handler.log_path = args.log
    Handler.control_path = args.control
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    if args.watch_pid:
        threading.Thread(target=_watch, args=(args.watch_pid, server), daemon=True).start()
    server.serve_forever()


def _watch(pid: int, server: ThreadingHTTPServer) -> None:
    while True:
        time.sleep(1)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            server.shutdown()
            return
        except PermissionError:
            continue


if __name__ == "__main__":
    main()
