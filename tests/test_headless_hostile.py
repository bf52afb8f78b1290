"""What a stranger found in headless sessions (docs/lanes.md), each shown on drover's real holder
(drover/remote/headless_holder.py) running a stand-in engine (tests/support/fake_stream_engine.py) that emits
Claude Code's stream events: a quoted uuid is no acknowledgement, `queued` alone is not verified, a line lost with
its claude's memory is sent again by the next holder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from drover.remote import headless, headless_spawn
from drover.remote import protocol as P
from drover.remote.protocol import HelperError
from tests.conftest import drover_process, wait_for

HOLDER = Path(headless.__file__).with_name("headless_holder.py")
ENGINE = Path(__file__).resolve().parent / "support" / "fake_stream_engine.py"


@pytest.fixture
def folder() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="drhh-"))  # short: a unix socket path is at most 108 bytes
    os.chmod(path, 0o700)
    yield path
    info = headless._json(str(path / "holder.json")) or {}
    for pid in (info.get("pid"), info.get("child_pid")):
        if pid is not None and headless._alive(pid):
            os.kill(int(pid), signal.SIGKILL)
    subprocess.run(["rm", "-rf", str(path)], check=False)


def start_holder(folder: Path, mode: str, procs: list[subprocess.Popen[bytes]], **more: Any) -> dict[str, Any]:
    spec = {"argv": [sys.executable, str(ENGINE), mode], "cwd": str(folder), "session_id": "s-1", "name": "x", **more}
    (folder / "spec.json").write_text(json.dumps(spec))
    (folder / "holder.json").unlink(missing_ok=True)
    (folder / "exit.json").unlink(missing_ok=True)
    procs.append(subprocess.Popen([sys.executable, str(HOLDER), str(folder)], stdin=subprocess.DEVNULL))
    info: dict[str, Any] = wait_for(
        lambda: (folder / "sock").exists() and headless._json(str(folder / "holder.json")), what="the holder's socket"
    )
    assert info["pid"] == procs[-1].pid
    return info


def session(folder: Path) -> dict[str, Any]:
    return {"_headless": str(folder), "engine": "claude", "name": "x"}


def write_stream(folder: Path, events: list[dict[str, Any]]) -> None:
    (folder / "stream.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


def test_a_message_quoting_another_messages_uuid_does_not_verify_that_one(folder: Path) -> None:
    theirs = headless.line_uuid("msg_other")
    mine = headless.line_uuid("msg_quoting")
    quoting = {"role": "user", "content": f"did {theirs} arrive?"}
    write_stream(
        folder,
        [
            {"type": "command_lifecycle", "command_uuid": mine, "state": "started"},
            {"type": "user", "isReplay": True, "uuid": mine, "message": quoting},
            {"type": "assistant", "message": {"content": [{"type": "text", "text": f"I see {theirs}"}]}},
            {"type": "drover_sent", "uuid": mine, "ack": "started", "text": theirs},
        ],
    )
    assert headless.seen(session(folder), {"msg_id": "msg_other"})["found"] is False
    assert headless.seen(session(folder), {"msg_id": "msg_quoting"})["found"] is True
    # Codex's marker: only its own uuid field counts.
    write_stream(folder, [{"type": "drover_sent", "uuid": theirs, "ack": "steered"}])
    assert headless.seen(session(folder), {"msg_id": "msg_other"})["found"] is True


def test_queued_alone_is_not_verified_but_started_is(folder: Path) -> None:
    uid = headless.line_uuid("msg_q")
    write_stream(folder, [{"type": "command_lifecycle", "command_uuid": uid, "state": "queued"}])
    got = headless.seen(session(folder), {"msg_id": "msg_q"})
    assert got["found"] is False and "queued" in got["how"], got
    write_stream(
        folder,
        [
            {"type": "command_lifecycle", "command_uuid": uid, "state": "queued"},
            {"type": "command_lifecycle", "command_uuid": uid, "state": "started"},
        ],
    )
    assert headless.seen(session(folder), {"msg_id": "msg_q"})["found"] is True


def test_a_send_taken_while_busy_is_queued_unverified_and_a_lost_one_is_sent_again(folder: Path) -> None:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        first = start_holder(folder, "queue", procs)
        wait_for(lambda: headless.ask(str(folder), {"op": "state"})["busy"], what="the stand-in's endless turn")
        got = headless.deliver(session(folder), "hello", {"msg_id": "msg_lost"})
        # The stand-in never starts it (a busy claude's queue): after the holder's wait, queued and unverified.
        assert (got["outcome"], got["verified"]) == (P.QUEUED, False), got
        assert headless.seen(session(folder), {"msg_id": "msg_lost"})["found"] is False
        # claude dies before its turn runs it; the holder is gone too.
        os.kill(first["child_pid"], signal.SIGKILL)
        os.kill(first["pid"], signal.SIGKILL)
        procs[-1].wait(timeout=60)
        # The next holder (a resume) finds it queued, never started: it writes it once more.
        start_holder(folder, "run", procs)
        again = headless.deliver(session(folder), "hello", {"msg_id": "msg_lost"})
        assert (again["outcome"], again["verified"], again.get("detail")) == (P.DELIVERED, True, None), again
        uid = headless.line_uuid("msg_lost")
        assert headless.acks(str(folder / "stream.jsonl"), uid).count("started") == 1
        # ... and once only: a third send of it is "already", not written again.
        third = headless.deliver(session(folder), "hello", {"msg_id": "msg_lost"})
        assert "already" in third.get("detail", ""), third
        assert headless.acks(str(folder / "stream.jsonl"), uid).count("queued") == 2
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture
def home_folder(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A session folder where spawn looks for it: under a short drover home of this test's own."""
    home = Path(tempfile.mkdtemp(prefix="drhh-"))
    monkeypatch.setenv("DROVER_HOME", str(home))
    path = Path(headless.root()) / "x"
    path.mkdir(parents=True, mode=0o700)
    os.chmod(path.parent, 0o700)
    yield path
    info = headless._json(str(path / "holder.json")) or {}
    for pid in (info.get("pid"), info.get("child_pid")):
        if pid is not None and headless._alive(pid):
            os.kill(int(pid), signal.SIGKILL)
    subprocess.run(["rm", "-rf", str(home)], check=False)


def test_a_holder_killed_mid_turn_is_not_exited_while_claude_runs_and_resume_waits(home_folder: Path) -> None:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        info = start_holder(home_folder, "queue", procs)
        wait_for(lambda: headless.ask(str(home_folder), {"op": "state"})["busy"], what="the stand-in's endless turn")
        os.kill(info["pid"], signal.SIGKILL)
        procs[-1].wait(timeout=60)
        warnings: list[str] = []
        mid = headless.session_at(str(home_folder), warnings)
        assert mid is not None and (mid["state"], mid["dead"]) == ("unknown", False), mid
        assert str(info["child_pid"]) in mid["reason"], mid
        with pytest.raises(HelperError) as refused:
            headless_spawn.spawn({"resume": "x"}, {})
        assert refused.value.code == P.NAME_TAKEN and "still runs" in refused.value.message, refused.value.message
        assert not (home_folder / "sock").exists() or headless._json(str(home_folder / "holder.json")) == info
        # Once claude has ended, it is exited.
        os.kill(info["child_pid"], signal.SIGKILL)
        wait_for(lambda: not headless._alive(info["child_pid"]), what="the stand-in gone")
        gone = headless.session_at(str(home_folder), warnings)
        assert gone is not None and (gone["state"], gone["dead"]) == ("gone", True), gone
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_second_resume_while_one_is_under_way_is_refused(home_folder: Path) -> None:
    spec = {"argv": ["true"], "cwd": str(home_folder), "session_id": "s-1", "name": "x", "engine": "claude"}
    (home_folder / "spec.json").write_text(json.dumps(spec))
    first = headless_spawn._lock(str(home_folder), "x")  # the first resume, still starting its holder
    try:
        with pytest.raises(HelperError) as refused:
            headless_spawn.spawn({"resume": "x"}, {})
        assert refused.value.code == P.NAME_TAKEN and "under way" in refused.value.message, refused.value.message
        assert not (home_folder / "holder.py").exists()  # nothing was started
    finally:
        first.close()


def test_a_tmux_session_and_a_headless_one_of_one_name_are_ambiguous_and_spawn_refuses_it(
    tmux: Any, cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = Path(tempfile.mkdtemp(prefix="drhh-"))  # short: spawn checks the socket path's length first
    monkeypatch.setenv("DROVER_HOME", str(home))
    try:
        tmux.start("twin", "sleep 600")
        with pytest.raises(HelperError) as refused:
            headless_spawn.spawn({"name": "twin", "engine": "claude", "cwd": str(home)}, {})
        assert refused.value.code == P.NAME_TAKEN and "twin" in refused.value.message, refused.value.message
        assert not (Path(headless.root()) / "twin").exists()
        # One already there (made before the tmux session, or by hand): both are candidates, neither is picked.
        folder = Path(headless.root()) / "twin"
        folder.mkdir(mode=0o700)
        spec = {"argv": ["true"], "cwd": str(home), "session_id": "5e55-1d", "name": "twin", "engine": "claude"}
        (folder / "spec.json").write_text(json.dumps(spec))
        res = cli("send", "local:twin", "for which one?", "--json")
        assert res.code != 0, res.out
        err = res.json()["errors"][0]
        assert err["code"] == P.AMBIGUOUS_SESSION, err
        assert "5e55-1d" in err["message"] and "%" in err["message"], err["message"]
        assert cli("status", "local:headless/twin", "--json").code == 0  # its own name still reaches it
    finally:
        subprocess.run(["rm", "-rf", str(home)], check=False)


def test_a_million_non_ascii_characters_arrive_and_a_too_big_request_is_one_clear_failure(folder: Path) -> None:
    from drover.remote import headless_holder

    assert headless.REQUEST_MAX == headless_holder.REQUEST_MAX
    procs: list[subprocess.Popen[bytes]] = []
    try:
        start_holder(folder, "run", procs)
        got = headless.deliver(session(folder), "é" * 1_000_001, {"msg_id": "msg_big"})
        assert (got["outcome"], got["verified"]) == (P.DELIVERED, True), {k: got[k] for k in ("outcome", "detail") if k in got}
        over = headless.deliver(session(folder), "x" * (headless.REQUEST_MAX + 1), {"msg_id": "msg_over"})
        assert (over["outcome"], over["code"]) == (P.FAILED, P.TOO_LARGE), over
        assert "\n" not in over["detail"] and "nothing was sent" in over["detail"], over["detail"]
        # The holder's own bound, for a client that does not check first: an answer, not a broken pipe.
        import socket as socketlib

        conn = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
        conn.settimeout(60)
        conn.connect(str(folder / "sock"))
        try:
            conn.sendall(b'{"op": "send", "text": "' + b"y" * (headless.REQUEST_MAX + 10) + b'"}\n')
        except OSError:
            pass
        answer = json.loads(conn.makefile("rb").readline())
        conn.close()
        assert answer["code"] == "too_large", answer
        assert headless.ask(str(folder), {"op": "state"})["alive"] is True
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_retried_headless_message_is_recorded_on_the_headless_lane(home_folder: Path, cli: Any) -> None:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        start_holder(home_folder, "run", procs)
        # The sender dies after the holder took it, before its outcome (and so its lane) is recorded.
        died = drover_process("send", "local:x", "retry me", env={"DROVER_FAULT": "before_outcome"})
        assert died.code != 0
        msg = json.loads(cli("log", "--json", "-n", "1").out)["data"]["messages"][0]
        wait_for(lambda: headless.seen(session(home_folder), {"msg_id": msg["id"]})["found"], what="its line taken")
        res = cli("retry", msg["id"], "--json")
        assert res.code == 0, res.err + res.out
        data = res.json()["data"]
        assert "not sent again" in data["detail"] and data["lane"] == "headless", data
        logged = json.loads(cli("log", "--json", "-n", "1").out)["data"]["messages"][0]
        assert logged["lane"] == "headless", logged
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_copied_session_folder_is_not_a_second_session(home_folder: Path) -> None:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        start_holder(home_folder, "run", procs)
        subprocess.run(["cp", "-a", str(home_folder), str(home_folder.parent / "y")], check=True)
        warnings: list[str] = []
        found = [s for s in headless.sessions(warnings) if s["id"] == "s-1"]
        assert [(s["_headless"], s["state"]) for s in found] == [(str(home_folder), "idle")], found
        assert any("y skipped" in w and str(home_folder) in w for w in warnings), warnings
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.slow  # the holder's whole wait for a turn that never comes
def test_a_headless_spawn_whose_command_never_answers_is_not_ready(
    isolated: Path, cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = Path(tempfile.mkdtemp(prefix="drhh-"))
    monkeypatch.setenv("DROVER_HOME", str(home))
    fleet = isolated / "fleet.toml"
    command = f"sh -c 'echo this is no stream-json >&2; exec {sys.executable} {ENGINE} silent'"
    fleet.write_text(f'[spawn.claude]\ncommand = "{command}"\nready_timeout_s = 60\n', encoding="utf-8")
    monkeypatch.setenv("DROVER_FLEET", str(fleet))
    try:
        res = cli("spawn", "local", "--engine", "claude", "--headless", "--name", "mute", "--cwd", str(home),
                  "--brief", "are you there?", "--json")  # fmt: skip
        assert res.code == 9, res.out + res.err
        body = res.json()
        assert body["data"]["state"] == "unanswered", body["data"]
        err = body["errors"][0]
        assert err["code"] == P.SPAWN_TIMEOUT and "this is no stream-json" in err["message"], err
    finally:
        info = headless._json(str(home / "headless" / "mute" / "holder.json")) or {}
        for pid in (info.get("pid"), info.get("child_pid")):
            if pid is not None and headless._alive(pid):
                os.kill(int(pid), signal.SIGKILL)
        subprocess.run(["rm", "-rf", str(home)], check=False)


def test_sigterm_to_the_holder_stops_the_session_claude_too_after_a_grace(folder: Path) -> None:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        info = start_holder(folder, "queue", procs, stop_grace_s=0.5)
        wait_for(lambda: headless.ask(str(folder), {"op": "state"})["busy"], what="the stand-in's endless turn")
        os.kill(info["pid"], signal.SIGTERM)
        assert procs[-1].wait(timeout=60) == 0
        wait_for(lambda: not headless._alive(info["child_pid"]), what="the engine killed after the grace")
        assert (headless._json(str(folder / "exit.json")) or {}).get("signal") == signal.SIGKILL
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
