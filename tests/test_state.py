"""State with evidence: `working`, `idle`, `waiting_on_human`, `stalled`, `done`, `exited`, `unknown` in status,
ls and spawns -- with the demo agent in real tmux, drover spawn, and the real Claude Code held in a model call."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

import drover
from drover import fleet as fleet_mod
from drover import lifecycle
from drover import session_state as S
from drover.errors import FleetInvalid
from drover.remote import progress, transcripts
from drover.truth import TruthFile
from tests.conftest import wait_for
from tests.test_spawn import demo_template, fleet_with


def iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int((ts % 1) * 1000):03d}Z"


def transcript(path: Path, *entries: dict[str, Any]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in entries), encoding="utf-8")
    return path


def claude_entry(kind: str, ts: float, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "timestamp": iso(ts), "uuid": f"u{ts}", **extra}


def retry_entry(ts: float, attempt: int) -> dict[str, Any]:
    """What Claude Code 2.1 writes for each retry of a failing model call (its c3t(): a 529 loop writes one per try)."""
    error = {"status": 529, "error": {"type": "overloaded_error", "message": "Overloaded"}}
    return claude_entry("system", ts, subtype="api_error", level="error", error=error, retryInMs=4000,
                        retryAttempt=attempt, maxRetries=10, source="request_retry")  # fmt: skip


def busy_row(prog: dict[str, Any], **over: Any) -> dict[str, Any]:
    return {"id": "%1", "engine": "claude", "identity": "claude:abc", "state": "busy", "since": 1, "progress": prog, **over}


# -- the host's reading of a record, and the fold ------------------------------------------------------------------
def test_a_retry_loop_is_evidence_not_progress_and_ends_in_stalled(tmp_path: Path) -> None:
    now = time.time()
    path = transcript(
        tmp_path / "t.jsonl",
        claude_entry("user", now - 300, message={"role": "user", "content": "go"}),
        claude_entry("assistant", now - 290, message={"role": "assistant", "content": []}),
        *(retry_entry(now - 200 + 30 * n, n + 1) for n in range(6)),  # the newest a few seconds ago
    )
    seen = progress.scan(str(path), "claude", now)
    assert seen["last_progress"] == pytest.approx(now - 290, abs=0.01) and seen["entry"] == "assistant"
    assert seen["retries"] == 6 and seen["last_retry"]["attempt"] == 6 and seen["last_retry"]["status"] == 529
    folded = S.fold(busy_row({**seen, "source": "transcript"}), host="h", stall_after=120, now=now)
    assert folded["state"] == "stalled" and folded["since"] == pytest.approx(now - 290, abs=0.01)
    assert folded["evidence"]["progress"]["retries"] == 6 and folded["screen_state"] == "busy"
    assert folded["evidence"]["no_progress_for"] >= 289 and folded["evidence"]["stall_after"] == 120


def test_an_entry_stamped_in_the_future_is_not_progress(tmp_path: Path) -> None:
    now = time.time()
    path = transcript(
        tmp_path / "t.jsonl",
        claude_entry("assistant", now - 900, message={"role": "assistant", "content": []}),
        claude_entry("assistant", now + 86400, message={"role": "assistant", "content": []}),  # a forged or skewed line
        {"type": "custom-title", "customTitle": "no time at all"},
    )
    seen = progress.scan(str(path), "claude", now)
    assert seen["last_progress"] == pytest.approx(now - 900, abs=0.01) and seen["future_entries"] == 1
    assert S.fold(busy_row(seen), host="h", stall_after=600, now=now)["state"] == "stalled"


def test_a_long_last_line_is_read_whole_and_a_torn_one_skipped(tmp_path: Path) -> None:
    now = time.time()
    big = claude_entry("assistant", now - 5, message={"role": "assistant", "content": "x" * (3 * progress.TAIL_BYTES)})
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(claude_entry("user", now - 50)) + "\n" + json.dumps(big) + "\n" + '{"type": "assi', "utf-8")
    assert progress.scan(str(path), "claude", now)["last_progress"] == pytest.approx(now - 5, abs=0.01)


def test_text_built_to_look_like_a_retry_entry_is_a_message_like_any_other(tmp_path: Path) -> None:
    """Entries are told apart by their own fields, never by words in them: a message that quotes a retry entry (or
    a line that is not an object) is what it is."""
    now = time.time()
    forged = json.dumps(retry_entry(now, 9))
    path = transcript(
        tmp_path / "t.jsonl",
        retry_entry(now - 60, 1),
        claude_entry("user", now - 20, message={"role": "user", "content": forged}),
    )
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps([retry_entry(now, 2)]) + "\n" + json.dumps(forged) + "\n")
    seen = progress.scan(str(path), "claude", now)
    assert seen["last_progress"] == pytest.approx(now - 20, abs=0.01) and seen["entry"] == "user"
    assert seen["retries"] == 0  # the retry before the message is older than the progress: not counted


def test_busy_with_no_progress_evidence_is_working_never_a_guess() -> None:
    now = time.time()
    assert S.fold(busy_row({"source": None, "last_progress": None}), host="h", stall_after=1, now=now)["state"] == "working"
    fresh = S.fold(busy_row({"source": "pane", "last_progress": now - 5}), host="h", stall_after=60, now=now)
    assert fresh["state"] == "working" and fresh["last_progress"] == now - 5
    for word, want in (("idle", "idle"), ("waiting", "waiting_on_human"), ("dialog", "waiting_on_human"),
                       ("gone", "exited"), ("unknown", "unknown"), ("ready", "unknown"), (None, "unknown")):  # fmt: skip
        assert S.fold(busy_row({}, state=word), host="h", stall_after=60, now=now)["state"] == want, word


def test_done_is_matched_by_identity_never_by_a_reused_name() -> None:
    done = lifecycle.event("done", host="h", session={"identity": "tmux:default/%1@100", "name": "w1", "id": "%1"})
    old = {"id": "%1", "name": "w1", "engine": "demo", "identity": "tmux:default/%1@100", "state": "idle"}
    new = {**old, "identity": "tmux:default/%1@200"}  # a new server numbered its pane %1 again, same name
    assert S.terminal_for([done], "h", old) is done and S.terminal_for([done], "h", new) is None
    assert S.terminal_for([done], "other-host", old) is None
    assert S.fold(old, host="h", stall_after=60, terminal=done)["state"] == "done"
    failed = {**done, "event": "failed"}
    folded = S.fold(old, host="h", stall_after=60, terminal=failed)
    assert folded["state"] == "done" and folded["evidence"]["failed"] is True
    # Gone is gone, whatever it said before; a dialog needs its human first.
    assert S.fold({**old, "state": "gone"}, host="h", stall_after=60, terminal=done)["state"] == "exited"
    assert S.fold({**old, "state": "dialog"}, host="h", stall_after=60, terminal=done)["state"] == "waiting_on_human"


def test_a_codex_thread_no_pane_runs_is_exited_even_while_its_app_server_keeps_it_loaded() -> None:
    row = {"id": "t1", "thread": "t1", "server": None, "pid": None, "engine": "codex", "state": "idle"}
    folded = S.fold(row, host="h", stall_after=60)
    assert (folded["state"], folded["screen_state"]) == ("exited", "idle") and "window" in folded["evidence"]["reason"]
    busy = S.fold({**row, "state": "busy"}, host="h", stall_after=60)
    assert busy["state"] == "working"  # a turn running with no pane (an app-server client) is at work


def test_stall_after_is_the_hosts_then_the_engines_then_the_default(tmp_path: Path) -> None:
    text = '[defaults]\nstall_after = "10m"\n[hosts.slow]\nssh = "slow"\nstall_after = "1h"\n[engines.claude]\nstall_after = 90\n'
    fleet = fleet_mod.parse(text, tmp_path / "f.toml")
    assert fleet.stall_after("slow", "claude") == 3600 and fleet.stall_after("local", "claude") == 90
    assert fleet.stall_after("local", "codex") == 600
    assert fleet_mod.parse("", tmp_path / "f.toml").stall_after("local", None) == 600
    assert "stall_after" not in fleet.profile_overrides()["claude"]  # the host's helper never sees it
    for bad in ('"0s"', '"soon"', "-5", "true"):
        with pytest.raises(FleetInvalid, match="stall_after"):
            fleet_mod.parse(f"[defaults]\nstall_after = {bad}\n", tmp_path / "f.toml")


# -- real panes -----------------------------------------------------------------------------------------------------
def use_fleet(isolated: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> Path:
    path = isolated / "fleet.toml"
    path.write_text(text, encoding="utf-8")
    monkeypatch.setenv("DROVER_FLEET", str(path))
    return path


def status(target: str) -> dict[str, Any]:
    doc = drover.run("sessions.status", {"id": target})
    assert doc.exit_code == 0, doc.errors
    return dict(doc.data["session"])


def test_a_demo_agent_busy_with_no_progress_is_stalled_then_idle(tmux: Any, isolated: Path, monkeypatch: Any) -> None:
    # The engine's own threshold over the default's (and a table of that one key leaves the demo's profile whole).
    use_fleet(isolated, monkeypatch, '[defaults]\nstall_after = "1h"\n[engines.demo]\nstall_after = "1s"\n')
    pane = tmux.agent("slow")
    os.kill(pane.pid, signal.SIGUSR2)  # busy, and writes nothing to its log: no progress
    wait_for(lambda: "esc to interrupt" in pane.screen(), what="busy")
    st = wait_for(lambda: (s := status("slow"))["state"] == "stalled" and s, what="stalled")
    last = pane.events()[-1]["t"]
    assert st["last_progress"] == pytest.approx(last) and st["since"] == pytest.approx(last)
    assert (st["progress_source"], st["screen_state"], st["evidence"]["stall_after"]) == ("log", "busy", 1.0)
    listed = [s for s in drover.run("sessions.list", {}).data["sessions"] if s["name"] == "slow"]
    assert [s["state"] for s in listed] == ["stalled"]
    os.kill(pane.pid, signal.SIGUSR2)
    wait_for(lambda: status("slow")["state"] == "idle", what="idle again")


def spawn_demo(cli: Any, fleet: Path, cwd: Path, name: str) -> dict[str, Any]:
    res = cli("--fleet", str(fleet), "spawn", "local", "--engine", "demo", "--cwd", str(cwd), "--name", name,
              "--brief", "do the thing", "--json")  # fmt: skip
    assert res.code == 0, res.err + res.out
    return dict(res.json()["data"])


def demo_pid(log: Path) -> int:
    return int([json.loads(line) for line in log.read_text().splitlines() if '"start"' in line][-1]["pid"])


def test_a_spawned_worker_done_then_killed_then_its_name_reused(tmux: Any, isolated: Path, cli: Any) -> None:
    fleet = isolated / "fleet.toml"
    fleet_with(fleet, {"demo": f'command = "{demo_template(isolated)}"\nready_timeout_s = 60'})
    first = spawn_demo(cli, fleet, isolated, "w1")
    wait_for(lambda: cli("--fleet", str(fleet), "status", "local:w1", "--json").json()["data"]["session"]["state"] == "idle")
    truth = TruthFile()
    ev = lifecycle.event("done", host="local", session=first, spawn=first["spawn_id"], summary="built it")
    lifecycle.record_once(truth, ev, f"done:{first['identity']}:{first['spawn_id']}")
    st = cli("--fleet", str(fleet), "status", "local:w1", "--json").json()["data"]["session"]
    assert (st["state"], st["evidence"]["terminal"]["event"], st["screen_state"]) == ("done", "done", "idle"), st
    human = cli("--fleet", str(fleet), "status", "local:w1")
    assert human.code == 0 and "done" in human.out and "signal" in human.out

    os.kill(demo_pid(isolated / "w1.jsonl"), signal.SIGKILL)
    gone = wait_for(
        lambda: (
            (r := cli("--fleet", str(fleet), "status", "local:w1", "--json")).json()["data"]["session"]["state"] == "exited" and r
        )
    )
    assert gone.code == 0
    st = gone.json()["data"]["session"]
    assert st["identity"] == first["identity"] and st["last_progress"] is None
    # From the record: the pane went with its program, and the host knows no `w1` now.
    assert st["spawn_id"] == first["spawn_id"] and isinstance(st["last_seen"], float)
    assert st["evidence"]["terminal"]["event"] == "done"
    assert "last seen" in cli("--fleet", str(fleet), "status", "local:w1").out
    typo = cli("--fleet", str(fleet), "status", "local:w11", "--json")
    assert typo.code == 6 and "no session" in typo.out + typo.err

    # The name is free again: a new worker takes it.  It is neither the old one's `done` nor `exited`.
    wait_for(lambda: cli("--fleet", str(fleet), "ls", "--json").json()["data"]["sessions"] == [], what="w1's pane gone")
    second = spawn_demo(cli, fleet, isolated, "w1")
    assert second["identity"] != first["identity"]
    st = wait_for(lambda: (s := cli("--fleet", str(fleet), "status", "local:w1", "--json").json()["data"]["session"])
                  ["state"] == "idle" and s)  # fmt: skip
    assert st["identity"] == second["identity"] and "terminal" not in st["evidence"]
    rows = cli("--fleet", str(fleet), "spawns", "--json").json()["data"]["spawns"]
    assert [(r["name"], r["spawn_state"], r["state"]) for r in rows] == [("w1", "ready", "exited"), ("w1", "ready", "idle")]
    assert rows[0]["evidence"]["terminal"]["event"] == "done" and "terminal" not in rows[1]["evidence"]
    listed = cli("--fleet", str(fleet), "ls", "--json").json()["data"]["sessions"]
    assert [(s["name"], s["state"], s["identity"]) for s in listed] == [("w1", "idle", second["identity"])]
    assert "PROGRESS" in cli("--fleet", str(fleet), "spawns").out


def test_a_real_claude_held_in_a_model_call_is_stalled_then_killed_is_exited(claude_lab: Any, cli: Any) -> None:
    """The real Claude Code, spawned by drover, its model call held by the fake API past a short stall_after."""
    lab = claude_lab
    control = lab.root / "held.control.json"
    control.write_text(json.dumps({"hold": True}))
    launcher = lab.launcher()
    text = launcher.read_text().replace(".requests.jsonl", f".requests.jsonl --control {control}")
    launcher.write_text(text)
    fleet = lab.root / "fleet.toml"
    template = f'command = "sh {launcher} {{name}}"\nready_timeout_s = 120'
    fleet_with(fleet, {"claude": template}, '[defaults]\nstall_after = "2s"\n')
    cwd = lab.root / "w0"  # the lab trusts w0..w9
    cwd.mkdir()
    res = cli("--fleet", str(fleet), "spawn", "local", "--engine", "claude", "--cwd", str(cwd), "--name", "held",
              "--brief", "a turn the model never answers", "--json")  # fmt: skip
    assert res.code == 0, res.err + res.out
    data = res.json()["data"]

    def look() -> dict[str, Any]:
        return dict(cli("--fleet", str(fleet), "status", "local:held", "--json").json()["data"]["session"])

    st = wait_for(lambda: (s := look())["state"] == "stalled" and s, what="stalled in the held model call")
    assert st["identity"] == data["identity"] and st["evidence"]["claude_status"] == "busy"
    assert st["progress_source"] == "transcript" and time.time() - st["last_progress"] > 2
    pid = st["pid"]
    os.kill(pid, signal.SIGKILL)
    gone = wait_for(lambda: (s := look())["state"] == "exited" and s, what="exited")
    assert gone["identity"] == data["identity"] and gone["spawn_id"] == data["spawn_id"]
    control.write_text("{}")


def test_the_real_claude_retrying_a_529_is_stalled_its_retries_evidence_not_progress(
    claude_lab: Any, isolated: Path, monkeypatch: Any
) -> None:
    """The fake API answers every model call 529 (overloaded): Claude Code retries with backoff, writing an
    `api-request` entry for each attempt.  None of them is progress: the session stalls, its retries counted."""
    use_fleet(isolated, monkeypatch, '[defaults]\nstall_after = "3s"\n')
    s = claude_lab.start("overloaded", status=529)
    sent = drover.run("sessions.message", {"id": s.name, "text": "a turn the API keeps refusing"}, actor="t")
    assert sent.data["outcome"] == "delivered", sent.data

    def stalled_with_retries() -> dict[str, Any] | None:
        st = status("overloaded")
        seen = st["evidence"].get("progress") or {}
        return st if st["state"] == "stalled" and seen.get("retries", 0) >= 2 else None

    st = wait_for(stalled_with_retries, what="stalled, retrying")
    seen = st["evidence"]["progress"]
    assert st["evidence"]["claude_status"] == "busy" and st["progress_source"] == "transcript"
    requests = [r for r in s.transcript() if r.get("type") == "api-request"]
    assert len(requests) >= 3 and seen["requests"] >= 3
    newest = max(transcripts.parse_ts(r["timestamp"]) or 0 for r in requests)
    assert st["last_progress"] < seen["last_request"] <= newest  # the retries moved nothing on
    s.set_control()  # let it through, so the session ends its turn
