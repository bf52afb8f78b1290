"""drover wait for engines without notices (watched on the host), and transcripts of Codex rollouts."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from tests.conftest import Tmux, wait_for


def test_wait_until_idle_watches_a_busy_pane_on_the_host(tmux: Tmux, cli: Any) -> None:
    pane = tmux.agent("worker", "default", "--busy-after-message", "2")
    assert cli("send", "worker", "start").code == 0
    wait_for(lambda: "esc to interrupt" in pane.screen())
    started = time.monotonic()
    res = cli("wait", "local:worker", "--until", "idle", "--timeout", "30", "--json")
    assert res.code == 0, res.err
    data = res.json()["data"]
    assert data["reached"] and data["state"] == "idle" and data["how"] == "watched the pane on the host"
    assert time.monotonic() - started > 0.5
    assert "idle · paste" in pane.screen()


def test_wait_times_out_with_exit_9(tmux: Tmux, cli: Any) -> None:
    pane = tmux.agent("stuck")
    os.kill(pane.pid, signal.SIGUSR2)  # busy until told otherwise
    wait_for(lambda: "esc to interrupt" in pane.screen())
    res = cli("wait", "stuck", "--timeout", "1")
    assert res.code == 9
    assert "still busy" in res.err


def test_wait_until_exited(tmux: Tmux, cli: Any) -> None:
    pane = tmux.agent("leaver")
    pane.tmux("set-option", "-w", "-t", pane.id, "remain-on-exit", "on")
    os.kill(pane.pid, signal.SIGTERM)
    res = cli("wait", "leaver", "--until", "exited", "--timeout", "10", "--json")
    assert res.code == 0, res.err
    assert res.json()["data"]["state"] == "exited"


def write_rollout(codex_home: Path, rollout_id: str) -> Path:
    """A Codex rollout in the shape Codex writes ($CODEX_HOME/sessions/YYYY/MM/DD/rollout-<time>-<id>.jsonl)."""
    day = codex_home / "sessions" / "2026" / "11" / "29"
    day.mkdir(parents=True)
    path = day / f"rollout-2026-11-29T07-00-00-{rollout_id}.jsonl"
    records = [
        {"timestamp": "2026-11-29T07:00:00.000Z", "type": "session_meta", "payload": {"id": rollout_id, "cwd": "/w"}},
        {
            "timestamp": "2026-11-29T07:00:01.000Z",
            "type": "response_item",
            "payload": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix the flaky test"}]},
        },
        {
            "timestamp": "2026-11-29T07:00:02.000Z",
            "type": "response_item",
            "payload": {"type": "function_call", "name": "shell", "arguments": '{"command":["pytest","-x"]}'},
        },
        {
            "timestamp": "2026-11-29T07:00:03.000Z",
            "type": "response_item",
            "payload": {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "fixed: a race in setup"}],
            },
        },
    ]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n{torn line\n")
    return path


def test_read_a_codex_rollout_by_id(isolated: Path, cli: Any, monkeypatch: Any) -> None:
    codex = isolated / "codex"
    rid = "0199a3c2-7f1e-7d40-9b1a-5c2e8f0a4b61"
    write_rollout(codex, rid)
    monkeypatch.setenv("CODEX_HOME", str(codex))
    res = cli("read", f"local:{rid}", "--json")
    assert res.code == 0, res.err
    data = res.json()["data"]
    assert data["engine"] == "codex"
    assert [(e["role"], e["text"]) for e in data["events"]] == [
        ("user", "fix the flaky test"),
        ("tool", '[tool shell: {"command":["pytest","-x"]}]'),
        ("assistant", "fixed: a race in setup"),
    ]
    only = cli("read", f"local:{rid[:13]}", "--role", "assistant", "--json").json()["data"]
    assert [e["text"] for e in only["events"]] == ["fixed: a race in setup"]
    since = cli("read", f"local:{rid}", "--since", "2026-11-29T07:00:02Z", "--json").json()["data"]
    assert [e["role"] for e in since["events"]] == ["tool", "assistant"]


def test_read_without_a_transcript_is_a_clear_error(tmux: Tmux, cli: Any) -> None:
    tmux.start("notranscript", "bash --norc --noprofile")  # a shell keeps none (the demo agent's log is its own)
    res = cli("read", "notranscript")
    assert res.code == 6
    assert "no transcript for" in res.err


def test_claude_registry_damage_is_tolerated(tmux: Tmux, isolated: Path, cli: Any, monkeypatch: Any) -> None:
    """Records drover cannot parse are skipped with a warning; stale ones are ignored and reported; no crash."""
    sessions = isolated / "claude" / "sessions"
    sessions.mkdir(parents=True)
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(sessions.parent))
    (sessions / "111.json").write_text("{not json")
    (sessions / "222.json").write_text(json.dumps({"pid": "not-an-int"}))
    dead = {
        "pid": 999999,
        "sessionId": "dead-beef",
        "procStart": "1",
        "messagingSocketPath": "/nonexistent.sock",
        "status": "idle",
    }
    (sessions / "999999.json").write_text(json.dumps(dead))
    (sessions / "333.unknown-file").write_text("ignored")
    tmux.agent("alive")
    res = cli("ls", "--json")
    assert res.code == 0, res.err
    data = res.json()["data"]
    assert [s["name"] for s in data["sessions"]] == ["alive"]
    warnings = " ".join(w["message"] for w in data["warnings"])
    assert "111.json" in warnings and "222.json" in warnings
    human = cli("ls")
    assert "warning: local: skipped Claude session record" in human.err
    check = cli("fleet", "check", "--json").json()["data"]["hosts"][0]
    # Another suite's Claude sessions on the machine may leave stale records of their own: this test's is the one asked of.
    stale = [s["id"] for s in check["stale_claude_sessions"]]
    assert stale.count("dead-beef") == 1 and not {"111", "222", "333"} & set(stale), stale
    res = cli("send", "dead-beef", "hello?")
    assert res.code == 6
