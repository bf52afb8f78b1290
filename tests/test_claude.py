"""The inbox lane against the real Claude Code binary (2.1.328), offline, with a fake Messages API."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import drover
from tests.conftest import stays, wait_for
from tests.support.npmcache import START_S

ACTOR = "tester"


def send(session: Any, text: str, **extra: Any) -> Any:
    return drover.run("sessions.message", {"id": session.name, "text": text, **extra}, actor=ACTOR)


def test_idle_session_receives_a_drover_message(claude_lab: Any, cli: Any) -> None:
    s = claude_lab.start("idle-a")
    res = cli("--actor", ACTOR, "send", "local:idle-a", "coordinator here: rebase on master", "--json")
    assert res.code == 0, res.err
    data = res.json()["data"]
    assert (data["outcome"], data["lane"]) == ("delivered", "inbox")
    # The wait ended on Claude's own record of the message, not on the receipt timer (issue 20)
    assert (data["verified"], data["wait_ended_by"]) == (True, "record"), data
    assert data["verification"].startswith("seen in the receiver's record ") and data["state"] == "idle", data
    assert data["verification"].endswith(f"{s.session_id}.jsonl"), data
    peers = wait_for(s.peer_messages, timeout=20, what="the peer record in the transcript")
    origin = peers[-1]["origin"]
    assert origin["body"] == "coordinator here: rebase on master"
    assert origin["name"] == f"drover ({ACTOR})"
    assert origin["fromMode"] == "prompting"
    assert origin["msg_id"] == data["receiver_msg_id"]
    assert peers[-1]["isMeta"] is True
    record = next(m for m in drover.run("messages.list", {}).data["messages"] if m["id"] == data["id"])
    assert record["outcome"] == "delivered" and record["lane"] == "inbox"
    # and the model saw it
    # The fake model's request log exists only once Claude made a request (a loaded machine takes its time).
    seen = lambda: s.requests.exists() and "coordinator here: rebase on master" in s.requests.read_text()  # noqa: E731
    wait_for(seen, what="the model's request with the message")
    read = cli("read", "local:idle-a", "--role", "peer", "--json").json()["data"]
    assert [e["text"] for e in read["events"]] == ["coordinator here: rebase on master"]
    assert read["events"][0]["from"] == f"drover ({ACTOR})"


def test_busy_session_queues_and_wait_returns_on_the_idle_notice(claude_lab: Any, cli: Any) -> None:
    s = claude_lab.start("busy-a", delay=6)
    first = send(s, "start a slow turn")
    assert first.data["outcome"] == "delivered", first.data
    wait_for(lambda: s.status() == "busy", timeout=20, what="the turn to start")
    second = send(s, "arrives while busy")
    assert (second.data["outcome"], second.data["lane"]) == ("queuedBehindTurn", "inbox"), second.data
    # queued behind the turn: silence past the window Claude's receipts come in, and no record yet to show it
    assert (second.data["wait_ended_by"], second.data["verified"]) == ("busy_window", False), second.data
    res = cli("wait", "local:busy-a", "--until", "idle", "--timeout", "60", "--json")
    assert res.code == 0, res.err
    waited = res.json()["data"]
    assert waited["how"] in ("notify_when_idle", "went idle while subscribing") and waited["state"] == "idle"
    assert waited["waited_s"] > 1
    bodies = wait_for(
        lambda: [p["origin"]["body"] for p in s.peer_messages()] if len(s.peer_messages()) == 2 else None, timeout=40
    )
    assert bodies == ["start a slow turn", "arrives while busy"]


def test_hold_and_refuse_settings_come_back_as_receipts(claude_lab: Any) -> None:
    claude_lab.settings(crossSessionInbound="hold")
    s = claude_lab.start("gate-a")
    held = send(s, "please hold this")
    assert (held.data["outcome"], held.data["wait_ended_by"]) == ("held", "receipt"), held.data
    assert held.exit_code == 3
    claude_lab.settings(crossSessionInbound="refuse")
    time.sleep(2.5)  # the setting is read live, after the file watcher notices
    refused = send(s, "please refuse this")
    assert refused.data["outcome"] == "refused" and refused.data["code"] == "refused", refused.data
    assert refused.data["wait_ended_by"] == "receipt", refused.data
    assert refused.exit_code == 4
    outcomes = [(m["outcome"], m["lane"]) for m in drover.run("messages.list", {}).data["messages"]]
    assert outcomes == [("held", "inbox"), ("refused", "inbox")]


def test_duplicate_is_dropped_by_the_receiver_when_drovers_own_limit_is_off(claude_lab: Any, isolated: Path) -> None:
    fleet = isolated / "fleet.toml"
    fleet.write_text("[limits]\nduplicate_window_s = 0\n")
    s = claude_lab.start("dup-a")
    with drover.Client(fleet=fleet, actor=ACTOR) as client:
        first = client.run("sessions.message", id=s.name, text="same words")
        assert first.data["outcome"] == "delivered"
        second = client.run("sessions.message", id=s.name, text="same words")
    assert (second.data["outcome"], second.data["code"]) == ("dropped", "duplicate"), second.data
    # the first one's record in the transcript (the same words) is no evidence for the second: its receipt decides
    assert (first.data["wait_ended_by"], second.data["wait_ended_by"]) == ("record", "receipt"), second.data
    # with drover's limit on (the default), the second never leaves
    third = send(s, "same words")
    assert (third.data["outcome"], third.data["code"]) == ("refused", "duplicate")


def test_a_busy_session_still_gets_its_receipt_before_the_wait_ends(claude_lab: Any) -> None:
    """The wait for a busy session ends after the window Claude's negative receipts come in: a held one is in it."""
    s = claude_lab.start("busyhold-a", project_settings={"crossSessionInbound": "hold"}, delay=120)
    claude_lab.tmux("send-keys", "-t", s.pane, "-l", "a slow turn, typed by its person")
    wait_for(lambda: "a slow turn, typed" in s.screen(), timeout=10, what="the typed prompt")
    claude_lab.tmux("send-keys", "-t", s.pane, "Enter")
    wait_for(lambda: s.status() == "busy", timeout=30, what="the turn to start")
    held = send(s, "held while busy")
    assert (held.data["outcome"], held.data["wait_ended_by"], held.data["state"]) == ("held", "receipt", "busy"), held.data
    assert s.peer_messages() == []


def _line(record: dict[str, Any]) -> str:
    return json.dumps(record) + "\n"


def test_only_claudes_own_record_of_the_message_ends_the_wait(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hostile: lines that hold the message's words or its id but are not Claude's record of it are no evidence."""
    from drover.remote import verify

    config = isolated / "claude-config"
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(config))
    sid, ours, other = str(uuid.uuid4()), str(uuid.uuid4()), str(uuid.uuid4())
    transcript = config / "projects" / "-tmp-w0" / f"{sid}.jsonl"
    transcript.parent.mkdir(parents=True)
    transcript.write_text(_line({"type": "custom-title", "customTitle": "w0", "sessionId": sid}))
    session = {"engine": "claude", "_record": {"sessionId": sid}}
    watch = verify.PeerWatch(session, ours)
    body = "rebase on master"
    envelope = f'<cross-session-message from="uds:/tmp/cc-socks/1.sock" from-mode="prompting">\n{body}\n</cross-session-message>'
    peer = {"kind": "peer", "msg_id": ours, "body": body, "name": "drover (tester)"}
    hostile: list[dict[str, Any]] = [
        # the same words, sent earlier under another id, and taken
        {"type": "user", "message": {"role": "user", "content": envelope}, "origin": dict(peer, msg_id=other)},
        # queued behind a turn: Claude notes it, but has not delivered it
        {"type": "queue-operation", "operation": "enqueue", "content": envelope + ours, "sessionId": sid},
        # the assistant quoting the message and its id, and calling a tool with an origin-shaped input
        {"type": "assistant", "message": {"role": "assistant", "content": [{"type": "text", "text": f"{envelope} {ours}"}]}},
        {
            "type": "assistant",
            "message": {"role": "assistant", "content": [{"type": "tool_use", "name": "Bash", "input": {"origin": peer}}]},
        },
        # a tool's output and a person's own typing that hold Claude's record of it, verbatim
        {
            "type": "user",
            "message": {"role": "user", "content": [{"type": "tool_result", "content": [{"type": "text", "origin": peer}]}]},
            "origin": {"kind": "human"},
        },
        {"type": "user", "message": {"role": "user", "content": json.dumps({"origin": peer})}, "origin": {"kind": "human"}},
        # not a user record
        {"type": "system", "subtype": "informational", "message": {"role": "system", "content": body}, "origin": peer},
    ]
    with transcript.open("a") as f:
        f.write("".join(_line(r) for r in hostile))
    assert watch.seen() is None
    assert verify.find(session, {"receiver_msg_id": ours}, "inbox")["found"] is False
    # Claude's own record, caught half written, then whole
    real = _line({"type": "user", "isMeta": True, "message": {"role": "user", "content": envelope}, "origin": peer})
    with transcript.open("a") as f:
        f.write(real[:40])
    assert watch.seen() is None
    with transcript.open("a") as f:
        f.write(real[40:])
    assert watch.seen() == str(transcript)
    assert verify.find(session, {"receiver_msg_id": ours}, "inbox")["found"] is True
    # a transcript that appears only after the watch began (a session's first message) is new from its first byte
    fresh = str(uuid.uuid4())
    late = verify.PeerWatch({"engine": "claude", "_record": {"sessionId": fresh}}, ours)
    assert late.seen() is None
    (transcript.parent / f"{fresh}.jsonl").write_text(real)
    assert late.seen() == str(transcript.parent / f"{fresh}.jsonl")


def test_bypass_session_holds_plain_messages_and_takes_the_owners(claude_lab: Any, isolated: Path) -> None:
    fleet = isolated / "fleet.toml"
    fleet.write_text("[hosts.local]\nowner_relay = true\n")
    s = claude_lab.start("bypass-a", flags="--dangerously-skip-permissions")
    with drover.Client(fleet=fleet, actor=ACTOR) as client:
        owner = client.run("sessions.message", id=s.name, text="the owner's words", as_owner=True)
    assert owner.data["outcome"] == "delivered", owner.data
    assert owner.data["declared_mode"] == "bypass" and owner.data["target_permission_mode"] == "bypassPermissions"
    wait_for(lambda: s.status() == "idle" and s.peer_messages(), timeout=20, what="the owner's message to be taken")
    plain = send(s, "a plain relay")
    assert plain.data["outcome"] == "held", plain.data
    assert plain.data["declared_mode"] == "prompting"
    stays(lambda: [p["origin"]["body"] for p in s.peer_messages()] == ["the owner's words"], 1, "the held message staying held")
    # without owner_relay in the fleet, --as-owner is refused and recorded
    denied = send(s, "sneaky", as_owner=True)
    assert (denied.data["outcome"], denied.data["code"]) == ("refused", "owner_relay_off")


def test_ls_shows_claude_sessions_and_a_killed_one_disappears(claude_lab: Any, cli: Any) -> None:
    s = claude_lab.start("lister-a")
    rows = [r for r in cli("ls", "--json").json()["data"]["sessions"] if r["engine"] == "claude"]
    assert [(r["name"], r["state"], r["id"], r["pane"]) for r in rows] == [("lister-a", "idle", s.session_id, s.pane)]
    assert rows[0]["lanes"] == ["inbox", "tmux"]
    socket_path = s.record()["messagingSocketPath"]
    os.kill(s.pid, signal.SIGKILL)
    wait_for(lambda: not any(r["engine"] == "claude" for r in cli("ls", "--json").json()["data"]["sessions"]), timeout=10)
    assert Path(socket_path).exists(), "a crashed session leaves its socket: drover must not trust it"
    res = cli("send", f"local:{s.session_id}", "anyone there?", "--json")
    assert res.code == 6 and res.json()["data"]["code"] == "session_not_found"
    check = cli("fleet", "check", "--json").json()["data"]["hosts"][0]
    assert check["host"] == "local" and check["ok"]
    assert [(x["pid"], x["id"]) for x in check["stale_claude_sessions"]] == [(s.pid, s.session_id)]
    assert "is gone" in check["stale_claude_sessions"][0]["reason"]
    human = cli("fleet", "check")
    assert "stale Claude session record" in human.err


def test_guard_refuses_the_real_trust_dialog_and_a_real_permission_dialog(claude_lab: Any, cli: Any, isolated: Path) -> None:
    untrusted = claude_lab.start("trust-a", trust=False, wait=False)
    wait_for(lambda: "trust this folder" in untrusted.screen(), timeout=START_S, what="the trust dialog")
    res = cli("send", f"local:{untrusted.pane}", "1", "--json")
    assert res.code == 4
    data = res.json()["data"]
    # Not registered yet, so it may have an inbox drover cannot see: refused on doubt (issue 15)
    assert (data["outcome"], data["code"], data["session"]["engine"]) == ("refused", "lane_unknown", "claude")
    # The owner's own words may go by paste: the guard refuses them at the real trust dialog
    fleet = isolated / "fleet.toml"
    fleet.write_text("[hosts.local]\nowner_relay = true\n")
    res = cli("--fleet", str(fleet), "send", f"local:{untrusted.pane}", "1", "--as-owner", "--json")
    assert res.code == 4
    data = res.json()["data"]
    assert (data["outcome"], data["code"], data["session"]["engine"]) == ("refused", "dialog", "claude")
    stays(lambda: "trust this folder" in untrusted.screen(), 1, "the trust dialog staying unanswered")
    assert not list((claude_lab.config / "sessions").glob("*.json")), "the trust dialog was accepted"

    asker = claude_lab.start("perm-a", flags="--permission-mode default", tool_use={"command": "rm -rf ./build"})
    first = send(asker, "clean the build please")
    assert first.data["outcome"] == "delivered"
    wait_for(lambda: asker.status() == "waiting", timeout=30, what="the permission prompt")
    wait_for(lambda: "Do you want to proceed?" in asker.screen(), timeout=10)
    pasted = send(asker, "yes", via="tmux")
    assert (pasted.data["outcome"], pasted.data["code"]) == ("refused", "native_lane"), pasted.data
    # The owner's own words may go by paste (owner_relay): the guard refuses them too, Claude being at a dialog
    payload = {"id": asker.name, "text": "yes", "via": "tmux", "as_owner": True}
    with drover.Client(fleet=fleet, actor=ACTOR) as client:
        owner = client.run("sessions.message", payload)
    assert (owner.data["outcome"], owner.data["code"]) == ("refused", "waiting"), owner.data
    assert "waiting for permission prompt" in owner.data["detail"]
    # and the screen alone would have refused it too: the real dialog matches the claude profile
    screen = drover.run("guard.check", {"engine": "claude", "screen": asker.screen()})
    assert screen.data["state"] == "dialog" and screen.exit_code == 4
    queued = send(asker, "a note for after the prompt")
    assert (queued.data["outcome"], queued.data["lane"]) == ("queuedBehindTurn", "inbox")
    stays(lambda: "Do you want to proceed?" in asker.screen(), 1, "the permission dialog staying unanswered")
    st = drover.run("sessions.status", {"id": asker.name}).data["session"]
    assert st["state"] == "waiting_on_human" and st["evidence"]["claude_status"] == "waiting" and "permission" in st["reason"]
    assert st["screen_state"] == "dialog"


def test_read_filters_on_the_host(claude_lab: Any, cli: Any) -> None:
    s = claude_lab.start("reader-a", reply="noted, rebasing now")
    for text in ("first: the schema landed", "second: rebase on master", "third: tests are green"):
        assert send(s, text).data["outcome"] in ("delivered", "queuedBehindTurn")

        def arrived(text: str = text) -> bool:
            return any(p["origin"]["body"] == text for p in s.peer_messages())

        wait_for(arrived, timeout=20)
        wait_for(lambda: s.status() == "idle", timeout=20)
    wait_for(lambda: len([r for r in s.transcript() if r.get("type") == "assistant"]) >= 3, timeout=20)
    res = cli("read", "local:reader-a", "--json")
    events = res.json()["data"]["events"]
    assert [e["role"] for e in events if e["role"] in ("peer", "assistant")][:2] == ["peer", "assistant"]
    grep = cli("read", "local:reader-a", "--grep", "REBASE", "--role", "peer", "--json").json()["data"]
    assert [e["text"] for e in grep["events"]] == ["second: rebase on master"] and grep["matched"] == 1
    last = cli("read", "local:reader-a", "--role", "assistant", "--last", "2", "--json").json()["data"]
    assert [e["text"] for e in last["events"]] == ["noted, rebasing now", "noted, rebasing now"] and last["matched"] >= 3
    none = cli("read", "local:reader-a", "--since", "0s", "--json").json()["data"]
    assert none["events"] == []
    raw = cli("read", "local:reader-a", "--role", "peer", "--last", "1", "--raw", "--json").json()["data"]
    assert raw["events"][0]["origin"]["body"] == "third: tests are green"
    human = cli("read", "local:reader-a", "--role", "peer")
    assert "peer (drover (tester)): first: the schema landed" in human.out
    bad = cli("read", "local:reader-a", "--grep", "(")
    assert bad.code == 2 and "not a valid regular expression" in bad.err


@pytest.mark.parametrize("transport", ["asyncssh", "openssh"])
def test_inbox_over_ssh(claude_binary: Path, sshfleet: Any, cli: Any, monkeypatch: Any, request: Any, transport: str) -> None:
    """The inbox lane over either transport (openssh: the system ssh, as riding a master does)."""
    from tests.support.claudelab import ClaudeLab

    text = sshfleet.fleet_file.read_text()
    sshfleet.fleet_file.write_text(text.replace('ssh = "h2"\n', f'ssh = "h2"\ntransport = "{transport}"\n'))

    # A Claude session on host h2: that host's HOME and tmux server, reached through the real sshd.
    monkeypatch.setenv("TMUX_TMPDIR", sshfleet.host_env("h2")["TMUX_TMPDIR"])
    home = sshfleet.host_home("h2")
    lab = ClaudeLab(home / "claude", claude_binary, home=home)

    def cleanup() -> None:
        for path in (home / "claude", home / ".claude"):
            shutil.rmtree(path, ignore_errors=True)

    request.addfinalizer(cleanup)
    s = lab.start("remote-a")
    res = cli("--actor", ACTOR, "send", "h2:remote-a", "hello across the wire", "--json")
    assert res.code == 0, res.err
    assert (res.json()["data"]["outcome"], res.json()["data"]["lane"]) == ("delivered", "inbox")
    peers = wait_for(s.peer_messages, timeout=20)
    assert peers[-1]["origin"]["body"] == "hello across the wire"
    rows = cli("ls", "--host", "h2", "--json").json()["data"]["sessions"]
    assert [(r["name"], r["engine"], r["lanes"]) for r in rows] == [("remote-a", "claude", ["inbox", "tmux"])]
    read = cli("read", "h2:remote-a", "--role", "peer", "--json").json()["data"]
    assert [e["text"] for e in read["events"]] == ["hello across the wire"]


def test_line_over_the_inbox_limit_is_refused_before_sending(claude_lab: Any) -> None:
    s = claude_lab.start("big-a")
    # Under drover's character cap, but every quote doubles when serialised: the line would pass 1,048,576.
    text = '"' * 600_000
    doc = send(s, text)
    assert (doc.data["outcome"], doc.data["code"], doc.data["lane"]) == ("refused", "too_large", "inbox"), doc.data
    stays(lambda: s.peer_messages() == [], 1, "nothing reaching Claude")


def test_via_tmux_is_refused_and_only_the_owners_own_words_are_typed(claude_lab: Any, isolated: Path) -> None:
    s = claude_lab.start("typed-a")
    doc = send(s, "typed by drover", via="tmux")
    assert (doc.data["outcome"], doc.data["code"], doc.exit_code) == ("refused", "native_lane", 4), doc.data
    assert "reach it through its inbox: drop --via tmux" in doc.data["detail"]
    fleet = isolated / "fleet.toml"
    fleet.write_text("[hosts.local]\nowner_relay = true\n")
    payload = {"id": s.name, "text": "typed for its owner", "via": "tmux", "as_owner": True}
    with drover.Client(fleet=fleet, actor=ACTOR) as client:
        owner = client.run("sessions.message", payload)
    assert (owner.data["outcome"], owner.data["lane"], owner.data["verified"]) == ("delivered", "tmux", True), owner.data
    assert "altered" not in owner.data, owner.data["verification"]  # Claude's own <pasted_content> wrapper
    typed = [r for r in s.transcript() if r.get("type") == "user" and "typed for its owner" in json.dumps(r.get("message"))]
    assert len(typed) == 1 and "typed by drover" not in json.dumps(s.transcript())
    assert s.peer_messages() == []  # typed, not through the inbox
