"""drover board: who is waiting on a human across the fleet -- dialogs on real screens, Claude's own `waiting`,
messages held for approval -- oldest first."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import drover
from drover.truth import TruthFile
from tests.conftest import Tmux, remote_agent, wait_for
from tests.support.npmcache import START_S
from tests.support.sshfleet import SSHFleet, free_port


def claude_record(isolated: Path, tmux: Tmux, monkeypatch: Any, name: str, **fields: Any) -> dict[str, Any]:
    """A Claude registry record naming a live process (a `sleep` in a pane), as Claude Code writes one."""
    sessions = isolated / "claude" / "sessions"
    sessions.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(sessions.parent))
    holder = tmux.start(f"holder-{name}", "sleep 600")
    pid = int(holder.tmux("display-message", "-p", "-t", holder.id, "#{pane_pid}").strip())
    start = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    record = {"pid": pid, "sessionId": f"{name}-0000-1111-2222-333344445555", "procStart": start, "name": name, **fields}
    (sessions / f"{pid}.json").write_text(json.dumps(record))
    return record


def held(truth: TruthFile, host: str, target: str, text: str, then: str | None = None) -> str:
    msg_id, _ = truth.accept(actor="alice@ws", host=host, target=target, text=text, options={})
    truth.outcome(msg_id, {"outcome": "held", "lane": "inbox", "detail": "held for the receiver's human (mode-mismatch)"})
    if then:
        truth.outcome(msg_id, {"outcome": then, "lane": "inbox", "detail": "released by its human"})
    return msg_id


def test_board_lists_dialogs_and_claudes_waiting_oldest_first_not_drafts(
    tmux: Tmux, isolated: Path, monkeypatch: Any, cli: Any
) -> None:
    idle = tmux.agent("idle-one")
    asking = tmux.agent("asking")
    drafting = tmux.agent("drafting")
    os.kill(asking.pid, signal.SIGUSR1)
    wait_for(lambda: "Do you want to proceed?" in asking.screen(), what="the dialog")
    drafting.tmux("send-keys", "-t", drafting.id, "-l", "my own words")
    wait_for(lambda: "my own words" in drafting.screen(), what="the draft")
    claude_record(
        isolated,
        tmux,
        monkeypatch,
        "reviewer",
        status="waiting",
        waitingFor="permission prompt",
        statusUpdatedAt=1_700_000_000_000,
    )
    claude_record(isolated, tmux, monkeypatch, "worker", status="busy", statusUpdatedAt=1_700_000_000_000)
    res = cli("board", "--json")
    assert res.code == 0, res.err
    data = res.json()["data"]
    waiting = data["waiting"]
    assert [(w["name"], w["screen_state"], w["reason"]) for w in waiting] == [
        ("reviewer", "waiting", "Claude is waiting: permission prompt"),
        ("asking", "dialog", "dialog on screen: 'Do you want to proceed?'"),
    ]
    assert waiting[0]["since"] == 1_700_000_000 and waiting[0]["since_source"] == "claude"
    assert waiting[1]["since_source"] == "pane_activity" and abs(waiting[1]["since"] - time.time()) < 120
    # The state's one vocabulary, with when the session last did anything (the demo agent's log: its dialog drawn).
    assert {w["state"] for w in waiting} == {"waiting_on_human"}
    assert waiting[1]["evidence"]["progress"]["entry"] == "dialog_drawn" and waiting[1]["last_progress"] > 0
    assert waiting[1]["id"] == asking.id and waiting[1]["engine"] == "demo" and waiting[1]["host"] == "local"
    assert idle.id not in json.dumps(waiting) and drafting.id not in json.dumps(waiting)
    assert data["held"] == [] and data["hosts"] == [{"host": "local", "ok": True, "sessions": 7, "waiting": 2}]
    human = cli("board")
    assert human.code == 0
    lines = human.out.splitlines()
    assert lines[0].strip() == "waiting on a human"
    assert "reviewer" in lines[2] and "permission prompt" in lines[2] and "asking" in lines[3] and "proceed" in lines[3]


def test_a_claude_record_with_no_times_is_on_the_board_since_first_seen(tmux: Tmux, isolated: Path, monkeypatch: Any) -> None:
    """No time the state began is known: the board says when it first saw it, and the next look says the same."""
    claude_record(isolated, tmux, monkeypatch, "timeless", status="waiting")
    seen_file = isolated / "home" / "board-seen.json"
    seen_file.parent.mkdir(mode=0o700, exist_ok=True)
    seen_file.write_text("{not json")  # a damaged memory is no memory, not a crash
    before = time.time()
    doc = drover.run("board", {})
    assert doc.exit_code == 0, doc.errors
    (row,) = doc.data["waiting"]
    assert (row["name"], row["reason"], row["since_source"]) == ("timeless", "Claude is waiting: for its human", "first_seen")
    assert before <= row["since"] <= time.time()
    assert oct(seen_file.stat().st_mode & 0o777) == "0o600"
    again = drover.run("board", {}).data["waiting"]
    assert [(w["name"], w["since"]) for w in again] == [("timeless", row["since"])]
    # A symlink in its place is never followed (nor written through).
    target = isolated / "elsewhere.json"
    target.write_text(json.dumps({"x": 1}))
    seen_file.unlink()
    seen_file.symlink_to(target)
    assert drover.run("board", {}).data["waiting"][0]["since"] >= row["since"]
    assert json.loads(target.read_text()) == {"x": 1}


def test_held_messages_oldest_first_and_only_while_still_held(isolated: Path, cli: Any) -> None:
    truth = TruthFile()
    first = held(truth, "local", "webapp-f8", "please review the migration")
    held(truth, "local", "api", "released later", then="delivered")
    held(truth, "local", "api", "denied later", then="refused")
    second = held(truth, "local", "docs", "and the docs")
    elsewhere = held(truth, "far-away", "x", "on a host the fleet no longer knows")
    doc = drover.run("board", {})
    assert [h["id"] for h in doc.data["held"]] == [first, second]
    assert doc.data["held"][0] == {**doc.data["held"][0], "host": "local", "target": "webapp-f8", "actor": "alice@ws"}
    assert "mode-mismatch" in doc.data["held"][0]["detail"]
    assert elsewhere not in json.dumps(doc.data)
    human = cli("board")
    assert "held for approval" in human.out and first in human.out and "local:webapp-f8" in human.out
    assert cli("board", "--held-since", "soon").code == 2
    res = cli("board", "--held-since", "1h", "--json")
    assert [h["id"] for h in res.json()["data"]["held"]] == [first, second]


def test_an_empty_board_says_nobody_is_waiting(tmux: Tmux, cli: Any) -> None:
    tmux.agent("calm")
    res = cli("board")
    assert res.code == 0 and "nobody is waiting on a human (1 host(s) asked)" in res.out


def test_board_across_the_ssh_fleet_with_a_host_down(sshfleet: SSHFleet, isolated: Path, cli: Any) -> None:
    extra = f'[hosts.closed]\nssh = "127.0.0.1"\nport = {free_port()}\nconnect_timeout = 2.0\n'
    sshfleet.fleet_file.write_text(sshfleet.fleet_toml(extra), encoding="utf-8")  # type: ignore[attr-defined]
    for host in sshfleet.names:
        remote_agent(sshfleet, host, f"agent-{host}", isolated)
    stuck = remote_agent(sshfleet, "h2", "stuck", isolated)
    os.kill(stuck.pid, signal.SIGUSR1)
    wait_for(lambda: "proceed" in sshfleet.tmux("h2", "capture-pane", "-p", "-t", stuck.id).stdout, what="the dialog on h2")
    res = cli("board", "--json")
    assert res.code == 8, res.out  # some hosts answered, one did not
    doc = res.json()
    assert [(w["host"], w["name"], w["screen_state"]) for w in doc["data"]["waiting"]] == [("h2", "stuck", "dialog")]
    hosts = {h["host"]: h for h in doc["data"]["hosts"]}
    assert hosts["closed"]["ok"] is False and hosts["closed"]["error"]["code"] == "connection_refused"
    assert hosts["h2"] == {"host": "h2", "ok": True, "sessions": 2, "waiting": 1}
    assert [e["host"] for e in doc["errors"]] == ["closed"]
    human = cli("board", "--host", "h1", "--host", "h2")
    assert human.code == 0 and "stuck" in human.out and "agent-h1" not in human.out


def test_a_real_claude_at_its_trust_dialog_is_on_the_board(claude_lab: Any) -> None:
    """The real Claude Code, started in a folder it has never trusted: it has no registry record yet, only its
    screen -- which is what the board reads."""
    session = claude_lab.start("untrusting", trust=False, wait=False)
    wait_for(lambda: "trust" in session.screen(), timeout=START_S, what="the trust dialog")
    doc = drover.run("board", {})
    assert doc.exit_code == 0, doc.errors
    rows = [w for w in doc.data["waiting"] if w["id"] == session.pane]
    assert len(rows) == 1, doc.data
    assert (
        rows[0]["engine"] == "claude"
        and rows[0]["state"] == "waiting_on_human"
        and rows[0]["screen_state"] == "dialog"
        and rows[0]["since_source"] == "pane_activity"
    )
    assert rows[0]["reason"].startswith("dialog on screen: ")


def test_a_real_claude_at_a_permission_prompt_is_on_the_board_and_a_broadcast_skips_it(claude_lab: Any, cli: Any) -> None:
    """Claude's own `waiting` (its registry), with what for and since when; the same look makes a broadcast skip
    it while an idle Claude beside it gets the message in its inbox."""
    asker = claude_lab.start("perm-board", flags="--permission-mode default", tool_use={"command": "rm -rf ./build"})
    calm = claude_lab.start("calm-board")
    first = drover.run("sessions.message", {"id": asker.name, "text": "clean the build please"}, actor="tester")
    assert first.data["outcome"] == "delivered", first.data
    wait_for(lambda: asker.status() == "waiting", timeout=30, what="the permission prompt")
    doc = drover.run("board", {})
    rows = [w for w in doc.data["waiting"] if w["name"] == "perm-board"]
    assert len(rows) == 1, doc.data
    assert (rows[0]["engine"], rows[0]["screen_state"], rows[0]["reason"]) == (
        "claude",
        "waiting",
        "Claude is waiting: permission prompt",
    )
    record = asker.record()
    assert record is not None and rows[0]["since"] == record["statusUpdatedAt"] // 1000 and rows[0]["since_source"] == "claude"
    assert "calm-board" not in json.dumps(doc.data["waiting"])
    res = cli("--actor", "coordinator", "broadcast", "--engine", "claude", "standup in 5", "--json")
    assert res.code == 4, res.out
    by_name = {r["session"]["name"]: r for r in res.json()["data"]["messages"]}
    assert by_name["perm-board"]["outcome"] == "skipped"
    assert by_name["perm-board"]["detail"] == "Claude is waiting: permission prompt"
    assert (by_name["calm-board"]["outcome"], by_name["calm-board"]["lane"]) == ("delivered", "inbox")
    wait_for(lambda: any("standup in 5" in str(m.get("origin", {}).get("body")) for m in calm.peer_messages()), timeout=30)
    assert not any("standup in 5" in str(m.get("origin", {}).get("body")) for m in asker.peer_messages())


def test_a_paneless_codex_thread_waiting_on_an_approval_counts_as_waiting() -> None:
    """A Codex thread no pane runs has only its app-server's word (drover/remote/codex.py); `waitingOn…` flags
    are that word for a person awaited, and milliseconds are read as such."""
    from drover.remote.attention import waiting_on_human

    thread = {"_paneless": True, "state": "waiting", "thread_flags": ["waitingOnApproval"], "since": 1_700_000_000_123}
    assert waiting_on_human(thread, {}) == ("waiting", "Codex is waiting: waitingOnApproval", 1_700_000_000, "codex")
    busy = {**thread, "state": "busy", "thread_flags": []}
    assert waiting_on_human(busy, {}) == (None, None, None, None)


def test_a_host_named_twice_is_listed_once_and_an_empty_host_list_is_nobody(tmux: Tmux, cli: Any) -> None:
    asking = tmux.agent("asking-twice")
    os.kill(asking.pid, signal.SIGUSR1)
    wait_for(lambda: "Do you want to proceed?" in asking.screen(), what="the dialog")
    data = cli("board", "-H", "local", "-H", "local", "--json").json()["data"]
    assert [w["id"] for w in data["waiting"]] == [asking.id]
    assert [h["host"] for h in data["hosts"]] == ["local"]
    empty = cli("op", "board", json.dumps({"hosts": []}))
    assert empty.code == 0, empty.out + empty.err
    assert empty.json()["data"]["waiting"] == [] and empty.json()["data"]["hosts"] == []


def test_an_unknown_tag_is_an_error_as_in_broadcast(tmux: Tmux, cli: Any) -> None:
    res = cli("board", "--tag", "no-such-tag")
    assert res.code == 6, res.out + res.err
    assert "no-such-tag" in res.err
    assert cli("broadcast", "--tag", "no-such-tag", "hi").code == 6


def test_a_board_no_host_answered_says_so(isolated: Path, cli: Any, monkeypatch: Any) -> None:
    fleet = isolated / "fleet.toml"
    ports = (free_port(), free_port())
    fleet.write_text(
        "".join(f'[hosts.down{i}]\nssh = "127.0.0.1"\nport = {p}\nconnect_timeout = 2.0\n' for i, p in enumerate(ports)),
        encoding="utf-8",
    )
    monkeypatch.setenv("DROVER_FLEET", str(fleet))
    res = cli("board", "-H", "down0", "-H", "down1")
    assert res.code == 5, res.out + res.err
    assert "no host answered (2 host(s) asked)" in res.out
    assert "nobody is waiting" not in res.out


def test_an_unsafe_truth_file_still_shows_who_waits_and_says_the_held_list_is_unknown(
    tmux: Tmux, isolated: Path, cli: Any
) -> None:
    asking = tmux.agent("asking-unsafe")
    os.kill(asking.pid, signal.SIGUSR1)
    wait_for(lambda: "Do you want to proceed?" in asking.screen(), what="the dialog")
    home = isolated / "home"
    home.mkdir(mode=0o700, exist_ok=True)
    home.chmod(0o777)  # writable by anyone: the truth file is not safe to use
    res = cli("board", "--json")
    assert res.code == 7, res.out + res.err
    doc = res.json()
    assert [w["id"] for w in doc["data"]["waiting"]] == [asking.id]
    assert doc["data"]["held"] == []
    assert any("held messages unavailable" in w["message"] for w in doc["data"]["warnings"])
    assert doc["errors"][0]["code"] == "truth_unsafe"
    human = cli("board")
    assert human.code == 7 and asking.id in human.out and "held messages unavailable" in human.err


def test_waiting_rows_order_pane_ids_as_numbers() -> None:
    from drover.ops.broadcast import natural

    assert sorted(["default/%10", "default/%9", "default/%1"], key=natural) == ["default/%1", "default/%9", "default/%10"]


def test_a_dialogs_since_does_not_move_when_its_window_shows_other_output(tmux: Tmux, cli: Any) -> None:
    """The window's activity time moves with a neighbouring pane's output; the dialog began no later than the first
    sighting, and that is what the board keeps saying while the same dialog stays."""
    asking = tmux.agent("asking-still")
    os.kill(asking.pid, signal.SIGUSR1)
    wait_for(lambda: "Do you want to proceed?" in asking.screen(), what="the dialog")
    (first,) = cli("board", "--json").json()["data"]["waiting"]
    assert first["since_source"] == "pane_activity"
    asking.tmux("split-window", "-d", "-t", asking.id, "sh -c 'sleep 1.2; echo noise; sleep 60'")

    def activity() -> int:
        return int(asking.tmux("display-message", "-p", "-t", asking.id, "#{window_activity}").strip())

    wait_for(lambda: activity() > first["since"], what="the window's activity to move on")
    (again,) = cli("board", "--json").json()["data"]["waiting"]
    assert again["id"] == asking.id and again["since"] == first["since"], (first, again)
