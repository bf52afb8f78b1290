"""A small fake of the OpenAI Responses API, for running the real Codex CLI offline in tests.

It answers `POST /v1/responses` with the streaming (SSE) events Codex reads and logs every request body as one
JSON line of the log. Behaviour is read from a control file on every request, so a test can change it while the
session runs:

    {"delay": seconds to stall after `response.created` (the TUI shows "Working" meanwhile),
     "hold": true to stall until the control file no longer says so (bounded by "hold_max", default 300 s),
     "reply": the assistant's text (default "Understood."; "{input}" is replaced by the last user text),
     "shell": {"command": "touch x", "escalate": true} to answer a turn with a shell tool call first
              (with escalation under approval_policy = "on-request" Codex draws its approval dialog),
     "call": {"name": "drover_send", "arguments": {...}} to answer a turn with a call of that tool first, found
              among the request's tools by name: Codex 0.169 offers an MCP server's tools in a namespace,
              {"type": "namespace", "name": "mcp__SERVER", "tools": [{"type": "function", "name": TOOL, ...}]},
              and takes the call back as a function_call carrying that "namespace"; a tool the request does not
              offer is answered with a text saying so, for the test to see}

Only turns (requests that carry tools) are delayed; Codex's small side requests are answered at once. Besides
the requests, the log gets {"event": "closed", "req": N} when Codex hangs up on request N while it is stalled
(Codex drops an in-flight request when the user steers a running turn) and {"event": "completed", "req": N}.

    python fake_responses.py --port 8766 --log requests.jsonl --control control.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import select
import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SHELL_TOOLS = ("shell_command", "shell", "exec_command", "local_shell")


class Handler(BaseHTTPRequestHandler):
    server_version = "fake-responses/1"
    log_path = ""
    control_path = ""
    counter = itertools.count(1)
    lock = threading.Lock()

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _control(self) -> dict[str, Any]:
        try:
            with open(self.control_path, encoding="utf-8") as f:
                return dict(json.load(f))
        except (OSError, ValueError):
            return {}

    def _log(self, row: dict[str, Any]) -> None:
        with self.lock, open(self.log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(dict(row, t=time.time())) + "\n")

    def _json(self, status: int, data: Any) -> None:
        raw = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:
        self._log({"req": next(self.counter), "method": "GET", "path": self.path})
        self._json(404, {"error": {"message": f"no {self.path} here", "type": "not_found"}})

    def do_POST(self) -> None:
        req = next(self.counter)
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        try:
            body: Any = json.loads(raw or b"{}")
        except ValueError:
            body = {"raw": raw.decode("utf-8", "replace"), "content-encoding": self.headers.get("content-encoding")}
        self._log({"req": req, "method": "POST", "path": self.path, "body": body})
        if not self.path.rstrip("/").endswith("/responses") or not isinstance(body, dict):
            self._json(404, {"error": {"message": f"no {self.path} here", "type": "not_found"}})
            return
        control = self._control()
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.end_headers()
        response_id = f"resp_{uuid.uuid4().hex[:24]}"
        try:
            self._event("response.created", {"response": {"id": response_id, "status": "in_progress", "output": []}})
            if body.get("tools") and not self._stall(control):
                self._log({"event": "closed", "req": req})
                return
            items = self._items(body, control)
            for index, item in enumerate(items):
                self._emit_item(index, item)
            usage = {
                "input_tokens": 100,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": 10,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 110,
            }
            self._event(
                "response.completed",
                {"response": {"id": response_id, "status": "completed", "output": items, "usage": usage}},
            )
        except (BrokenPipeError, ConnectionResetError):
            self._log({"event": "closed", "req": req})
            return
        self._log({"event": "completed", "req": req})

    def _event(self, name: str, data: dict[str, Any]) -> None:
        self.wfile.write(f"event: {name}\ndata: {json.dumps(dict(data, type=name))}\n\n".encode())
        self.wfile.flush()

    def _hung_up(self) -> bool:
        """True when the client closed its side of the connection (a readable socket with nothing to read)."""
        sock = self.connection
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return False
        try:
            return sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _stall(self, control: dict[str, Any]) -> bool:
        """Wait as the control file says; False if the client hung up meanwhile."""
        deadline = time.monotonic() + float(control.get("delay", 0))
        hold_until = time.monotonic() + float(control.get("hold_max", 300))
        while True:
            now = time.monotonic()
            holding = bool(self._control().get("hold")) and now < hold_until
            if now >= deadline and not holding:
                return True
            if self._hung_up():
                return False
            time.sleep(0.1)

    @staticmethod
    def _last_user_text(body: dict[str, Any]) -> str:
        for item in reversed(body.get("input") or []):
            if isinstance(item, dict) and item.get("role") == "user":
                for part in item.get("content") or []:
                    if isinstance(part, dict) and part.get("type") == "input_text":
                        return str(part.get("text", ""))
        return ""

    def _items(self, body: dict[str, Any], control: dict[str, Any]) -> list[dict[str, Any]]:
        inputs = [i for i in body.get("input") or [] if isinstance(i, dict)]
        answered_call = bool(inputs) and inputs[-1].get("type") in ("function_call_output", "custom_tool_call_output")
        call = control.get("call")
        if isinstance(call, dict) and call.get("name") and body.get("tools") and not answered_call:
            return [self._named_call(body, call)]
        shell = control.get("shell")
        tool = self._shell_tool(body)
        if shell and tool and not answered_call:
            return [self._shell_call(tool, dict(shell))]
        text = str(control.get("reply", "Understood.")).replace("{input}", self._last_user_text(body))
        return [
            {
                "type": "message",
                "id": f"msg_{uuid.uuid4().hex[:24]}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ]

    @staticmethod
    def _named_call(body: dict[str, Any], call: dict[str, Any]) -> dict[str, Any]:
        name = str(call["name"])
        where: dict[str, str] | None = None
        for t in body.get("tools") or []:
            if not isinstance(t, dict):
                continue
            if t.get("type") == "function" and t.get("name") == name:
                where = {}
            inner = [x.get("name") for x in t.get("tools") or [] if isinstance(x, dict)]
            if t.get("type") == "namespace" and name in inner:
                where = {"namespace": str(t.get("name"))}
        if where is None:
            offered = [t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)]
            text = f"fake-responses: no tool {name} offered, only {offered}"
            content = [{"type": "output_text", "text": text, "annotations": []}]
            message_id = f"msg_{uuid.uuid4().hex[:24]}"
            return {"type": "message", "id": message_id, "role": "assistant", "status": "completed", "content": content}
        return {
            "type": "function_call",
            "id": f"fc_{uuid.uuid4().hex[:24]}",
            "call_id": f"call_{uuid.uuid4().hex[:24]}",
            "name": name,
            **where,
            "arguments": json.dumps(call.get("arguments") or {}),
            "status": "completed",
        }

    @staticmethod
    def _shell_tool(body: dict[str, Any]) -> str | None:
        names = [t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)]
        return next((n for n in SHELL_TOOLS if n in names), None)

    @staticmethod
    def _shell_call(tool: str, shell: dict[str, Any]) -> dict[str, Any]:
        command = str(shell.get("command", "touch /tmp/codex-approval-probe"))
        args: dict[str, Any]
        if tool == "shell":
            args = {"command": ["bash", "-lc", command]}
        elif tool == "exec_command":
            args = {"cmd": command}
        else:
            args = {"command": command}
        if shell.get("escalate", True):
            args["sandbox_permissions"] = "require_escalated"
            args["justification"] = str(shell.get("justification", "Do you want to let me run this command?"))
        return {
            "type": "function_call",
            "id": f"fc_{uuid.uuid4().hex[:24]}",
            "call_id": f"call_{uuid.uuid4().hex[:24]}",
            "name": tool,
            "arguments": json.dumps(args),
            "status": "completed",
        }

    def _emit_item(self, index: int, item: dict[str, Any]) -> None:
        if item["type"] != "message":
            self._event("response.output_item.added", {"output_index": index, "item": item})
            self._event("response.output_item.done", {"output_index": index, "item": item})
            return
        text = item["content"][0]["text"]
        ref = {"item_id": item["id"], "output_index": index, "content_index": 0}
        self._event("response.output_item.added", {"output_index": index, "item": dict(item, content=[], status="in_progress")})
        self._event("response.content_part.added", dict(ref, part={"type": "output_text", "text": "", "annotations": []}))
        self._event("response.output_text.delta", dict(ref, delta=text))
        self._event("response.output_text.done", dict(ref, text=text))
        self._event("response.content_part.done", dict(ref, part=item["content"][0]))
        self._event("response.output_item.done", {"output_index": index, "item": item})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--control", required=True)
    args = parser.parse_args()
    Handler.log_path = args.log
    Handler.control_path = args.control
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
