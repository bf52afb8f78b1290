"""A small fake of the Anthropic Messages API, for running the real Claude Code binary offline in tests.

It answers `POST /v1/messages` (streaming or not) with a fixed text reply and logs every request body as one
JSON line. Behaviour is read from a control file on every request, so a test can change it while the session
runs: {"delay": seconds before answering, "hold": true to stall the main turn until the control file no longer says
so (bounded by "hold_max", default 300 s: a turn exactly as long as a test needs, however slow the machine),
"reply": text, "tool_use": {"command": "..."} to ask for a Bash tool call (which raises a real permission dialog),
or {"name": "mcp__drover__drover_send", "input": {...}} to call that tool (see _named_tool), "status": 529 to answer
the main turn with that HTTP error (Anthropic's "overloaded": Claude Code retries it)}.

    python fake_anthropic.py --port 8765 --log requests.jsonl --control control.json
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Handler(BaseHTTPRequestHandler):
    server_version = "fake-anthropic/1"
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

    def _record(self, body: Any) -> None:
        with open(self.log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"t": time.time(), "path": self.path, "body": body}) + "\n")

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.end_headers()

    def do_GET(self) -> None:
        self._record(None)
        self._json(200, {})

    def _json(self, status: int, data: Any) -> None:
        raw = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _stall(self, control: dict[str, Any]) -> None:
        """Wait `delay` seconds, and on while the control file says `hold` (re-read: the test lets go by rewriting it)."""
        deadline = time.monotonic() + float(control.get("delay", 0))
        hold_until = time.monotonic() + float(control.get("hold_max", 300))
        while True:
            now = time.monotonic()
            if now >= deadline and not (self._control().get("hold") and now < hold_until):
                return
            time.sleep(0.1)

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {"raw": raw.decode("utf-8", "replace")}
        self._record(body)
        if "count_tokens" in self.path:
            self._json(200, {"input_tokens": 10})
            return
        if not self.path.startswith("/v1/messages"):
            self._json(404, {"type": "error", "error": {"type": "not_found_error", "message": self.path}})
            return
        control = self._control()
        # Claude Code's side requests (titles, summaries) are small: only the main turn waits.
        if body.get("tools"):
            if control.get("status"):
                error = {"type": "overloaded_error", "message": "Overloaded"}
                self._json(int(control["status"]), {"type": "error", "error": error})
                return
            self._stall(control)
        content = self._content(body, control)
        message = {
            "id": f"msg_{uuid.uuid4().hex[:24]}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "claude-fake"),
            "content": content,
            "stop_reason": "tool_use" if any(c["type"] == "tool_use" for c in content) else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 5},
        }
        if body.get("stream"):
            self._stream(message)
        else:
            self._json(200, message)

    @staticmethod
    def _content(body: dict[str, Any], control: dict[str, Any]) -> list[dict[str, Any]]:
        tool = control.get("tool_use")
        last = (body.get("messages") or [{}])[-1]
        answered_tool = isinstance(last.get("content"), list) and any(
            isinstance(b, dict) and b.get("type") == "tool_result" for b in last["content"]
        )
        if tool and body.get("tools") and tool.get("name"):
            return Handler._named_tool(body, tool, answered_tool, str(control.get("reply", "Done.")))
        if tool and body.get("tools") and not answered_tool:
            return [
                {
                    "type": "tool_use",
                    "id": f"toolu_{uuid.uuid4().hex[:20]}",
                    "name": "Bash",
                    "input": {"command": tool.get("command", "rm -rf build"), "description": "clean the build"},
                }
            ]
        return [{"type": "text", "text": str(control.get("reply", "Understood."))}]

    @staticmethod
    def _named_tool(body: dict[str, Any], tool: dict[str, Any], answered: bool, reply: str) -> list[dict[str, Any]]:
        """A model's loop around one named tool, as a real model runs it.  Claude Code 2.1 defers MCP tools: the
        request lists only their names (in a system message) and offers ToolSearch, so the model first loads the
        tool with ToolSearch "select:NAME", then calls it; once that call's result is back the turn ends with the
        reply text (control's "reply").  A tool neither offered nor deferred is answered with a text saying so,
        for the test to see."""
        name = str(tool["name"])
        offered = [t.get("name") for t in body["tools"] if isinstance(t, dict) and not t.get("defer_loading")]
        last_call = Handler._answered_call(body) if answered else None
        if last_call == name:
            return [{"type": "text", "text": reply}]
        block = {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:20]}"}
        if name in offered or last_call == "ToolSearch":
            return [dict(block, name=name, input=dict(tool.get("input") or {}))]
        if "ToolSearch" in offered and name in json.dumps(body.get("messages")):
            return [dict(block, name="ToolSearch", input={"query": f"select:{name}", "max_results": 1})]
        return [{"type": "text", "text": f"fake-anthropic: no tool {name} offered, only {offered}"}]

    @staticmethod
    def _answered_call(body: dict[str, Any]) -> str | None:
        """The name of the tool whose result the last message carries (its tool_use is in the message before)."""
        messages = body.get("messages") or []
        ids = {b.get("tool_use_id") for b in messages[-1]["content"] if isinstance(b, dict)}
        for message in reversed(messages[:-1]):
            content = message.get("content") if isinstance(message, dict) else None
            for b in content if isinstance(content, list) else []:
                if isinstance(b, dict) and b.get("type") == "tool_use" and b.get("id") in ids:
                    return str(b.get("name"))
        return None

    def _stream(self, message: dict[str, Any]) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.end_headers()

        def event(name: str, data: dict[str, Any]) -> None:
            self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
            self.wfile.flush()

        start = dict(message, content=[], stop_reason=None)
        event("message_start", {"type": "message_start", "message": start})
        for i, block in enumerate(message["content"]):
            if block["type"] == "text":
                event(
                    "content_block_start",
                    {"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}},
                )
                delta = {"type": "text_delta", "text": block["text"]}
            else:
                head = dict(block, input={})
                event("content_block_start", {"type": "content_block_start", "index": i, "content_block": head})
                delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            event("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta})
            event("content_block_stop", {"type": "content_block_stop", "index": i})
        event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": 5},
            },
        )
        event("message_stop", {"type": "message_stop"})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--control", required=True)
    args = parser.parse_args()
    Handler.log_path = args.log
    Handler.control_path = args.control
    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
