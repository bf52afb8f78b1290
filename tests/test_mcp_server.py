"""`drover mcp serve` through the SDK's own stdio client (mcp.client.stdio + ClientSession), as a real process,
against real tmux panes running the demo agent: the tools listed with valid schemas, each one called, errors as tool
errors with drover's code, concurrency, the capped wait and its cursor, and the hostile cases."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from tests.conftest import ROOT, Pane, Tmux, wait_for

DROVER = str(Path(sys.executable).with_name("drover"))
TOOLS = {
    "drover_send",
    "drover_tmux_send",
    "drover_list",
    "drover_status",
    "drover_read",
    "drover_wait",
    "drover_events",
    "drover_broadcast",
    "drover_nudge",
    "drover_spawn",
    "drover_done",
    "drover_board",
    "drover_log",
    "drover_verify",
}
TOKEN = "tok-5ecret-d0-not-echo-7f3a"


class Served:
    """One running server and the client session talking to it."""

    def __init__(self, session: Any, errlog: Path) -> None:
        self.session = session
        self.errlog = errlog

    async def call(self, name: str, args: dict[str, Any]) -> tuple[bool, dict[str, Any], str]:
        """(is_error, the op's document, the first text block)."""
        res = await self.session.call_tool(name, args, read_timeout_seconds=120)
        texts = [c.text for c in res.content]
        doc = res.structured_content
        assert doc is not None and doc == json.loads(texts[-1]), texts  # the document, as structure and as JSON text
        return bool(res.is_error), doc, texts[0]

    def stderr(self) -> str:
        return self.errlog.read_text(encoding="utf-8", errors="replace")


@asynccontextmanager
async def served(
    tmp: Path, *args: str, env: dict[str, str] | None = None, command: list[str] | None = None
) -> AsyncIterator[Served]:
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    argv = command or [DROVER, "mcp", "serve", *args]
    params = StdioServerParameters(command=argv[0], args=argv[1:], env={**os.environ, **(env or {})}, cwd=str(ROOT))
    errlog = tmp / f"mcp-stderr-{os.getpid()}-{len(list(tmp.glob('mcp-stderr-*')))}.txt"
    with errlog.open("w", encoding="utf-8") as err:
        async with stdio_client(params, errlog=err) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            yield Served(session, errlog)


def run(body: Callable[[], Any]) -> Any:
    return asyncio.run(body())


def agent_target(pane: Pane) -> str:
    return f"local:{pane.server}/{pane.id}"


def test_the_tools_are_listed_with_plain_names_and_valid_schemas(isolated: Path) -> None:
    from jsonschema import Draft202012Validator

    async def body() -> None:
        async with served(isolated) as s:
            listed = (await s.session.list_tools()).tools
            assert {t.name for t in listed} == TOOLS
            for tool in listed:
                assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", tool.name)
                Draft202012Validator.check_schema(tool.input_schema)
                props = tool.input_schema["properties"]
                assert tool.input_schema.get("additionalProperties") is False, tool.name
                assert "actor" not in props and "as_owner" not in props, tool.name
                if tool.name in ("drover_send", "drover_tmux_send", "drover_broadcast", "drover_nudge"):
                    assert "never approves anything, never answers a dialog" in tool.description, tool.name
                    assert "owner's authority" in tool.description, tool.name
            send = next(t for t in listed if t.name == "drover_send")
            assert set(send.input_schema["properties"]) == {"target", "text", "via", "expect_engine", "raw"}
            reads = {t.name for t in listed if t.annotations.read_only_hint}
            assert reads == {f"drover_{n}" for n in ("list", "status", "read", "wait", "events", "board", "log")}

    run(body)


def test_a_send_is_delivered_verified_and_logged_with_the_actor(isolated: Path, tmux: Tmux) -> None:
    pane = tmux.agent("mcp-agent")

    async def body() -> None:
        async with served(isolated, env={"DROVER_ACTOR": "coordinator@box"}) as s:
            bad, doc, _ = await s.call("drover_send", {"target": agent_target(pane), "text": "rebase on main, please"})
            assert not bad and doc["op"] == "sessions.message" and doc["data"]["outcome"] == "delivered", doc
            msg = doc["data"]["id"]
            wait_for(lambda: any("rebase on main, please" in m for m in pane.messages()), what="the message in the agent")
            assert 'from-name="drover (coordinator@box)"' in pane.messages()[-1]
            assert 'from-mode="prompting"' in pane.messages()[-1]
            bad, doc, _ = await s.call("drover_verify", {"ids": [msg]})
            assert not bad, doc
            bad, doc, _ = await s.call("drover_log", {"sender": "coordinator@box", "text": True})
            assert not bad
            rows = doc["data"]["messages"]
            assert [r["id"] for r in rows] == [msg] and rows[0]["actor"] == "coordinator@box", rows

    run(body)
