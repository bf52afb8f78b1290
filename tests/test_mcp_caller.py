"""Who the MCP server speaks for (drover/mcp/caller.py): a Claude session above it, proved by ancestry and by its
registry's session id, names every message; a claim that does not hold falls back and says so; the session's
messaging token is gone from the server's environment before anything runs.

The Claude session here is a process with Claude Code's own registry record for it (as tests/test_identity.py
makes one) that starts the server as its child, as Claude Code starts an MCP server; the real binary doing the
same is the end-to-end suite's part."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from drover.self_session import machine_name
from tests.conftest import Pane, Tmux, wait_for
from tests.test_mcp_server import DROVER, SLOW, TOKEN, agent_target, run, served

SESSION = "0e0e0e0e-1111-2222-3333-444455556666"
# A stand-in for Claude Code: writes its registry record (its own pid, its start time, its name), then runs the
# command it was given as its child, with its stdin and stdout -- the MCP server's pipes.
FAKE_CLAUDE = """
import json, os, subprocess, sys
from drover.remote import procs
folder = os.path.join(os.environ["CLAUDE_CONFIG_DIR"], "sessions")
os.makedirs(folder, exist_ok=True)
pid = os.getpid()
record = {"pid": pid, "sessionId": os.environ["FAKE_SESSION_ID"], "procStart": procs.proc_start(pid),
          "name": "webapp-f8", "cwd": os.getcwd()}
with open(os.path.join(folder, "%d.json" % pid), "w") as f:
    json.dump(record, f)
args = sys.argv[1:]
if args[0] == "--dangerously-skip-permissions":  # the caller runs in bypass mode, as its command line says
    args = args[1:]
sys.exit(subprocess.call(args))
"""


def fake_claude(tmp: Path) -> tuple[list[str], dict[str, str]]:
    script = tmp / "fake_claude.py"
    script.write_text(FAKE_CLAUDE, encoding="utf-8")
    env = {"CLAUDE_CONFIG_DIR": str(tmp / "claude-config"), "FAKE_SESSION_ID": SESSION}
    return [sys.executable, str(script), "--dangerously-skip-permissions", DROVER, "mcp", "serve"], env


def the_fake_claude_pid(tmp: Path) -> int:
    records = list((tmp / "claude-config" / "sessions").glob("*.json"))
    assert len(records) == 1, records
    return int(json.loads(records[0].read_text())["pid"])


def test_the_claude_session_above_the_server_names_every_message_and_declares_prompting(isolated: Path, tmux: Tmux) -> None:
    from drover.remote import claude

    pane: Pane = tmux.agent("mcp-callee")
    command, env = fake_claude(isolated)
    env |= {
        "CLAUDE_CODE_SESSION_ID": SESSION,
        "CLAUDECODE": "1",
        "CLAUDE_CODE_MESSAGING_TOKEN": TOKEN,
        "DROVER_ACTOR": "not-me@box",  # the person's default: the proved caller wins over it
    }
    me = f"webapp-f8@{machine_name()}"

    async def body() -> None:
        async with served(isolated, env=env, command=command) as s:
            assert claude._argv_mode(the_fake_claude_pid(isolated)) == "bypassPermissions"  # the caller is in bypass
            bad, doc, _ = await s.call("drover_send", {"target": agent_target(pane), "text": "from a Claude session"})
            assert not bad and doc["data"]["actor"] == me, doc
            wait_for(lambda: pane.messages(), what="the message")
            got = pane.messages()[-1]
            assert f'from-name="drover ({me}) @ {machine_name()}:{SESSION}"' in got, got
            assert 'from-mode="prompting"' in got  # a bypass caller's message is information, never authority
            bad, doc, _ = await s.call("drover_log", {"sender": me})
            assert not bad and len(doc["data"]["messages"]) == 1, doc
            assert f"caller {me} (claude session {SESSION}" in s.stderr()
            record = (isolated / "home" / "truth.jsonl").read_text(encoding="utf-8")
            assert TOKEN not in record and TOKEN not in s.stderr() and TOKEN not in json.dumps(doc)

    run(body)


def test_a_claim_of_another_claude_session_falls_back_and_says_so(isolated: Path, tmux: Tmux) -> None:
    pane = tmux.agent("mcp-claim")
    command, env = fake_claude(isolated)
    other = "0e0e0e0e-9999-2222-3333-444455556666"  # a real session's id, perhaps: not the one above the server
    env |= {"CLAUDE_CODE_SESSION_ID": other, "CLAUDECODE": "1", "DROVER_ACTOR": "person@box"}

    async def body() -> None:
        async with served(isolated, env=env, command=command) as s:
            bad, doc, _ = await s.call("drover_send", {"target": agent_target(pane), "text": "who am I?"})
            assert not bad and doc["data"]["actor"] == "person@box", doc
            err = s.stderr()
            assert "no agent session proved" in err and f"{other!r} is not this process's session" in err, err

    run(body)


def test_scrub_takes_the_token_and_only_it() -> None:
    from drover.mcp.caller import scrub

    env = {"CLAUDE_CODE_MESSAGING_TOKEN": TOKEN, "CLAUDE_CODE_SESSION_ID": SESSION, "PATH": "/bin"}
    assert scrub(env) == ["CLAUDE_CODE_MESSAGING_TOKEN"]
    assert env == {"CLAUDE_CODE_SESSION_ID": SESSION, "PATH": "/bin"}
    assert scrub(env) == []


CHILD_ENV = """
import dataclasses, subprocess, sys
from drover.ops import REGISTRY
spec = REGISTRY["sessions.list"]
async def shows_env(ctx, req):
    subprocess.run(["env"])  # a child of the server: its stdout is the server's stderr
    return await spec.handler(ctx, req)
REGISTRY["sessions.list"] = dataclasses.replace(spec, handler=shows_env)
from drover.cli.main import main
sys.exit(main(["mcp", "serve"]))
"""


@SLOW
def test_no_child_of_the_server_inherits_the_token(isolated: Path) -> None:
    env = {"CLAUDE_CODE_MESSAGING_TOKEN": TOKEN, "DROVER_MARKER": "seen-in-child"}

    async def body() -> Any:
        async with served(isolated, env=env, command=[sys.executable, "-c", CHILD_ENV]) as s:
            bad, _doc, _ = await s.call("drover_list", {"state": False})
            assert not bad
            err = s.stderr()
            assert "DROVER_MARKER=seen-in-child" in err  # the child's environment was shown
            assert TOKEN not in err and "CLAUDE_CODE_MESSAGING_TOKEN" not in err

    run(body)


def proved(monkeypatch: Any, session: Any, how: str = "its process is an ancestor of this one", parent: bool = False) -> None:
    """identify()'s decision on what self_session found (the finding itself: the tests above, by real ancestry)."""
    from drover import self_session
    from drover.mcp import caller

    async def find(_ctx: Any, _env: Any = None) -> tuple[Any, str]:
        return session, how

    monkeypatch.setattr(self_session, "find", find)
    monkeypatch.setattr(caller, "_codex_parent", lambda: parent)


def a_session(engine: str, id: str, name: str) -> Any:
    from drover.self_session import SelfSession

    return SelfSession(host="local", machine="box-a", id=id, name=name, identity=f"{engine}:{id}", engine=engine, pin=id)


def test_codex_as_the_parent_is_a_claim_and_its_session_found_above_is_the_caller(monkeypatch: Any) -> None:
    from drover.mcp.caller import identify

    proved(monkeypatch, a_session("codex", "default/%4", "api-codex"), parent=True)
    got = run(lambda: identify(None, {"PATH": "/bin"}))
    assert (got.actor, got.engine, got.session_id) == ("api-codex@box-a", "codex", "default/%4")
    proved(monkeypatch, a_session("codex", "default/%4", "api-codex"), parent=False)
    got = run(lambda: identify(None, {"PATH": "/bin", "CODEX_THREAD_ID": "0199-thread"}))
    assert got.actor == "api-codex@box-a"  # the thread's claim, Codex not the parent (its app-server started it)


def test_no_claim_or_a_claim_the_ancestry_does_not_bear_out_is_nobodys(monkeypatch: Any) -> None:
    from drover.mcp.caller import identify

    proved(monkeypatch, a_session("codex", "default/%4", "api-codex"), parent=False)
    got = run(lambda: identify(None, {"DROVER_ACTOR": "person@box"}))  # below an agent, not started by one
    assert (got.actor, got.engine) == ("person@box", None) and "parent is not Codex" in got.how
    proved(monkeypatch, a_session("claude", SESSION, "webapp-f8"), parent=True)
    got = run(lambda: identify(None, {}))  # a Claude above, but no Claude claims it
    assert got.actor is None and "is not set" in got.how
    proved(monkeypatch, a_session("shell", "default/%2", "work"), parent=True)
    got = run(lambda: identify(None, {}, starter_actor="starter@box"))
    assert got.actor == "starter@box" and "runs shell" in got.how
    proved(monkeypatch, None, "no session on this machine has a process that is an ancestor of this one")
    got = run(lambda: identify(None, {"CLAUDE_CODE_SESSION_ID": SESSION}))
    assert got.actor is None and "is set, but no session" in got.how
