"""drover wait A B C --any|--all: many sessions, across hosts, one request per host, `done` from the record.

Real parts: the demo agent in real tmux panes here and on a host of the real sshd fleet; drover runs as a real
process beside them (the wait is in flight while the test changes a session), under a hard subprocess timeout.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from drover import lifecycle
from drover.truth import TruthFile
from tests.conftest import ROOT, Pane, Tmux, drover_process, remote_agent, stays, wait_for

HARD_S = 120  # a wait that never ends fails the test here (never a bound on how fast it is)
KILL_SERVER = "env -u TMUX_TMPDIR -u TMUX tmux kill-server"  # the test user's own server, not this test's


def start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "drover", "wait", *args, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=str(ROOT),
        env=dict(os.environ),
    )


def answer(proc: subprocess.Popen[str]) -> tuple[int, dict[str, Any], str]:
    out, err = proc.communicate(timeout=HARD_S)
    return proc.returncode, json.loads(out), err


def busy(pane: Pane, screen: Any = None) -> None:
    os.kill(pane.pid, signal.SIGUSR2)  # the demo agent toggles busy on SIGUSR2
    look = screen or pane.screen
    wait_for(lambda: "esc to interrupt" in look(), what=f"{pane.id} busy")


def idle_again(pane: Pane) -> None:
    os.kill(pane.pid, signal.SIGUSR2)


def rows(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{r['host']}:{r['target']}": r for r in doc["data"]["sessions"]}


class InFlight:
    """sessions.wait_many run in-process on a thread, with a seam that says when the host's watcher has looked at
    the host once (and the record watcher at the record): what a test does after that happens *while* it waits."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, payload: dict[str, Any]) -> None:
        import drover.ops.wait_many as op_side
        import drover.remote.wait_many as host_side
        from drover.ops import run

        self.looked, self.read_record = threading.Event(), threading.Event()
        discover, look = host_side.discover, op_side._look_at_record

        def discovering(*a: Any, **kw: Any) -> Any:
            try:
                return discover(*a, **kw)
            finally:
                self.looked.set()

        def looking(*a: Any, **kw: Any) -> Any:
            try:
                return look(*a, **kw)
            finally:
                self.read_record.set()

        monkeypatch.setattr(host_side, "discover", discovering)
        monkeypatch.setattr(op_side, "_look_at_record", looking)
        self.pool = ThreadPoolExecutor(1)
        self.future = self.pool.submit(run, "sessions.wait_many", payload)
        wait_for(lambda: self.looked.is_set() or self.future.done(), what="the host's watcher to look")

    def result(self) -> tuple[int, dict[str, Any]]:
        doc = self.future.result(timeout=HARD_S)
        self.pool.shutdown()
        return doc.exit_code, doc.to_dict()


def test_any_returns_the_first_to_go_idle_and_all_waits_for_every_one(tmux: Tmux, monkeypatch: pytest.MonkeyPatch) -> None:
    panes = {n: tmux.agent(n) for n in ("w1", "w2", "w3")}
    for p in panes.values():
        busy(p)
    wait = InFlight(monkeypatch, {"targets": ["w1", "w2", "w3"], "mode": "any", "until": "idle"})
    idle_again(panes["w2"])
    code, doc = wait.result()
    assert code == 0, doc
    assert doc["data"]["which"] == ["local:w2"]
    got = rows(doc)
    assert got["local:w2"]["reached"] and got["local:w2"]["state"] == "idle"
    assert not got["local:w1"]["reached"] and got["local:w1"]["state"] == "working"

    busy(panes["w2"])
    wait = InFlight(monkeypatch, {"targets": ["w1", "w2", "w3"], "mode": "all", "until": "idle"})
    idle_again(panes["w1"])
    wait_for(lambda: "idle · paste" in panes["w1"].screen())
    idle_again(panes["w2"])
    wait_for(lambda: "idle · paste" in panes["w2"].screen())
    assert not wait.future.done()  # w3 is still working: --all goes on waiting
    idle_again(panes["w3"])
    code, doc = wait.result()
    assert code == 0, doc
    assert sorted(doc["data"]["which"]) == ["local:w1", "local:w2", "local:w3"]


def test_one_killed_ends_a_wait_until_exited_and_fails_a_wait_for_all_idle(tmux: Tmux, monkeypatch: pytest.MonkeyPatch) -> None:
    panes = {n: tmux.agent(n) for n in ("w1", "w2", "w3")}
    for p in panes.values():
        busy(p)
    wait = InFlight(monkeypatch, {"targets": ["w1", "w2", "w3"], "mode": "any", "until": "exited"})
    os.kill(panes["w3"].pid, signal.SIGKILL)
    code, doc = wait.result()
    assert code == 0, doc
    assert doc["data"]["which"] == ["local:w3"] and rows(doc)["local:w3"]["state"] == "exited"

    wait = InFlight(monkeypatch, {"targets": ["w1", "w2"], "mode": "all", "until": "idle"})
    os.kill(panes["w1"].pid, signal.SIGKILL)
    # Waiting for both idle: one of them will never be, so the answer is no, at once -- exit 6 as `drover wait`'s.
    code, doc = wait.result()
    assert code == 6, doc
    assert rows(doc)["local:w1"]["state"] == "exited" and "exited while waiting" in doc["errors"][0]["message"]


def test_a_name_taken_over_while_waiting_is_not_the_session_waited_on(tmux: Tmux, monkeypatch: pytest.MonkeyPatch) -> None:
    first, other = tmux.agent("w1"), tmux.agent("w2")
    busy(first)
    busy(other)
    wait = InFlight(monkeypatch, {"targets": ["w1", "w2"], "mode": "any", "until": "idle"})
    first.tmux("kill-session", "-t", "w1")
    tmux.agent("w1")  # idle, under the name the wait was given (wait_idle: its screen says so)
    stays(lambda: not wait.future.done(), 1.0, what="the wait, not fooled by the newcomer")
    idle_again(other)
    code, doc = wait.result()
    assert code == 0, doc
    got = rows(doc)
    assert doc["data"]["which"] == ["local:w2"]
    assert got["local:w1"]["state"] == "exited" and not got["local:w1"]["reached"], doc


def _identity(pane: Pane) -> str:
    pid = pane.tmux("display-message", "-p", "-t", pane.id, "#{pane_pid}").strip()
    return f"tmux:{pane.server}/{pane.id}@{pid}"


def test_a_done_event_written_while_waiting_ends_a_wait_until_done(tmux: Tmux, monkeypatch: pytest.MonkeyPatch) -> None:
    panes = {n: tmux.agent(n) for n in ("w1", "w2", "w3")}
    truth = TruthFile()
    # An older `done` about another session of the same name must not count: the record is read by identity.
    lifecycle.record(truth, lifecycle.event("done", host="local", session={"identity": "tmux:default/%99@1", "name": "w2"}))
    wait = InFlight(monkeypatch, {"targets": ["w1", "w2", "w3"], "mode": "any", "until": "done"})
    wait_for(wait.read_record.is_set, what="the record watcher's first look")
    ev = lifecycle.event("done", host="local", session={"identity": _identity(panes["w3"]), "name": "w3"}, summary="shipped")
    lifecycle.record(truth, ev)
    code, doc = wait.result()
    assert code == 0, doc
    assert doc["data"]["which"] == ["local:w3"]
    assert rows(doc)["local:w3"]["event"]["id"] == ev["id"]
    # Written before the wait, it is the answer at once; the others have none: --all times out, exit 9.
    again = drover_process("wait", "w3", "--until", "done", "--timeout", "600", "--json", timeout=HARD_S)
    assert again.code == 0, again.err
    late = drover_process("wait", "w1", "w3", "--all", "--until", "done", "--timeout", "2", timeout=HARD_S)
    assert late.code == 9 and "still not done" in late.err


def test_across_hosts_one_request_each(sshfleet: Any, tmux: Tmux, isolated: Path) -> None:
    local = tmux.agent("w1")
    r1 = remote_agent(sshfleet, "h1", "r1", isolated)
    r2 = remote_agent(sshfleet, "h1", "r2", isolated)

    def screen_of(p: Pane) -> Any:
        return lambda: sshfleet.tmux("h1", "capture-pane", "-p", "-t", p.id).stdout

    busy(local)
    busy(r1, screen_of(r1))
    busy(r2, screen_of(r2))
    # Gone idle before the wait looked or after, the answer is the same: the only one idle.
    proc = start("local:w1", "h1:r1", "h1:r2", "--any", "--until", "idle", "--timeout", "600")
    idle_again(r2)
    code, doc, err = answer(proc)
    assert code == 0, err
    assert doc["data"]["which"] == ["h1:r2"]
    assert rows(doc)["local:w1"]["state"] == "working"

    proc = start("local:w1", "h1:r1", "h1:r2", "--all", "--until", "idle", "--timeout", "600")
    idle_again(local)
    idle_again(r1)
    code, doc, err = answer(proc)
    assert code == 0, err
    assert sorted(doc["data"]["which"]) == ["h1:r1", "h1:r2", "local:w1"]


def test_any_until_waiting_returns_the_one_that_shows_a_dialog(tmux: Tmux, monkeypatch: pytest.MonkeyPatch) -> None:
    panes = {n: tmux.agent(n) for n in ("w1", "w2")}
    wait = InFlight(monkeypatch, {"targets": ["w1", "w2"], "mode": "any", "until": "waiting"})
    os.kill(panes["w1"].pid, signal.SIGUSR1)  # the demo agent draws a permission dialog
    code, doc = wait.result()
    assert code == 0, doc
    assert doc["data"]["which"] == ["local:w1"] and rows(doc)["local:w2"]["state"] == "idle"


def test_a_target_that_names_nothing_is_an_error_before_any_waiting(tmux: Tmux) -> None:
    panes = [tmux.agent(n) for n in ("w1", "w2", "w3")]
    for p in panes:
        busy(p)
    # Busy for good: had anything been waited on, this would run into the 600 s timeout (and the hard bound).
    res = drover_process("wait", "w1", "nosuch", "w3", "--any", "--timeout", "600", timeout=HARD_S)
    assert res.code == 6
    assert "no session 'nosuch'" in res.err and len(res.err.strip().splitlines()) == 1


def test_the_same_session_named_twice_is_refused(tmux: Tmux) -> None:
    pane = tmux.agent("w1")
    tmux.agent("w2")
    twice = drover_process("wait", "w1", "w2", "w1", "--all", timeout=HARD_S)
    assert twice.code == 2 and "local:w1 is named twice" in twice.err
    # Two spellings of one pane: the same session, found by its identity after resolving.
    alias = drover_process("wait", "w1", pane.id, "--any", timeout=HARD_S)
    assert alias.code == 2 and "name the same session" in alias.err, alias.err


def test_several_sessions_need_any_or_all_and_stall_after_needs_stalled(tmux: Tmux) -> None:
    tmux.agent("w1")
    tmux.agent("w2")
    res = drover_process("wait", "w1", "w2")
    assert res.code == 2 and "say --any" in res.err
    res = drover_process("wait", "w1", "w2", "--any", "--all")
    assert res.code == 2 and "exclude each other" in res.err
    res = drover_process("wait", "w1", "w2", "--all", "--stall-after", "2m")
    assert res.code == 2 and "without until=stalled" in res.err
    assert "Traceback" not in res.err


def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("a host that stops its own sshd needs a test user's rc file (root; CI runs as root)")


def _stopped(user: str) -> list[int]:
    uid = pwd.getpwnam(user).pw_uid
    out = []
    for pid in os.listdir("/proc"):
        try:
            status = Path(f"/proc/{pid}/status").read_text() if pid.isdigit() else ""
        except OSError:
            continue
        if "\nState:\tT" in status and f"\nUid:\t{uid}\t" in status:
            out.append(int(pid))
    return out


def test_a_host_that_never_answers_is_bounded_and_the_others_answer_stands(sshfleet: Any, tmux: Tmux) -> None:
    """The host answers the resolve, then takes the wait and never answers (its sshd session stopped)."""
    _need_root()
    tmux.agent("w1")
    user = sshfleet.shell_user("bash")
    home = Path(pwd.getpwnam(user).pw_dir)
    seen = home / ".drover-seen"
    seen.unlink(missing_ok=True)
    rc = home / ".bashrc"
    rc.write_text("if [ -e ~/.drover-seen ]; then kill -STOP $PPID; fi; touch ~/.drover-seen\n")
    os.chown(rc, pwd.getpwnam(user).pw_uid, pwd.getpwnam(user).pw_gid)
    subprocess.run(["su", "-s", "/bin/sh", user, "-c", KILL_SERVER], capture_output=True, timeout=10)  # a leftover
    subprocess.run(
        ["su", "-s", "/bin/sh", user, "-c", "env -u TMUX_TMPDIR -u TMUX tmux new-session -d -s target sleep 600"],
        check=True,
        timeout=10,
    )
    toml = sshfleet.fleet_toml(f'[hosts.stuck]\nssh = "h2"\nuser = "{user}"\n')
    toml = toml.replace("connect_timeout = 5.0\nrequest_timeout = 20.0", "connect_timeout = 3.0\nrequest_timeout = 3.0")
    sshfleet.fleet_file.write_text(toml, encoding="utf-8")
    try:
        code, doc, err = answer(start("local:w1", "stuck:target", "--all", "--until", "idle", "--timeout", "3"))
        got = rows(doc)
        assert got["local:w1"]["reached"] and got["local:w1"]["state"] == "idle", doc
        assert not got["stuck:target"]["reached"] and got["stuck:target"].get("error"), doc
        assert code != 0 and any(e.get("host") == "stuck" for e in doc["errors"]), err
        # --any: the answer is here at once, whatever the stuck host does.
        seen.unlink(missing_ok=True)
        code, doc, err = answer(start("local:w1", "stuck:target", "--any", "--until", "idle", "--timeout", "600"))
        assert code == 0, err
        assert doc["data"]["which"] == ["local:w1"]
        # A host that does not even answer which session it is: bounded by its request timeout, the others stand.
        code, doc, err = answer(start("local:w1", "stuck:target", "--any", "--until", "idle", "--timeout", "600"))
        assert code == 0, err
        assert doc["data"]["which"] == ["local:w1"] and rows(doc)["stuck:target"]["error"], doc
        assert any(e.get("host") == "stuck" for e in doc["errors"])
    finally:
        rc.unlink()
        seen.unlink(missing_ok=True)
        for pid in _stopped(user):
            os.kill(pid, signal.SIGKILL)
        subprocess.run(["su", "-s", "/bin/sh", user, "-c", KILL_SERVER], capture_output=True, timeout=10)


def test_a_real_claude_among_them_goes_idle_by_its_registry(claude_lab: Any, tmux: Tmux) -> None:
    import drover

    s = claude_lab.start("claude-a", delay=6)
    demo = tmux.agent("w1")
    busy(demo)
    first = drover.run("sessions.message", {"id": s.name, "text": "start a slow turn"}, actor="tester")
    assert first.data["outcome"] == "delivered", first.data
    wait_for(lambda: s.status() == "busy", timeout=20, what="the turn to start")
    code, doc, err = answer(start(s.name, "w1", "--any", "--until", "idle", "--timeout", "600"))
    assert code == 0, err
    assert doc["data"]["which"] == [f"local:{s.name}"]
    assert rows(doc)[f"local:{s.name}"]["how"] == "Claude's registry says idle"
    assert rows(doc)["local:w1"]["state"] == "working"


def test_stalled_is_working_with_no_new_transcript_entry_and_progress_is_not_a_stall(
    tmux: Tmux, monkeypatch: pytest.MonkeyPatch
) -> None:
    quiet, moving, _idle = tmux.agent("w1"), tmux.agent("w2"), tmux.agent("w3")
    busy(quiet)
    busy(moving)
    stop = threading.Event()

    def progress() -> None:  # w2's transcript (the demo agent's log) gains an entry every 0.2 s: it is not stalled
        assert moving.log is not None
        while not stop.is_set():
            with open(moving.log, "a", encoding="utf-8") as f:
                f.write(json.dumps({"type": "tool", "t": time.time()}) + "\n")
            stop.wait(0.2)

    t = threading.Thread(target=progress)
    t.start()
    try:
        payload = {"targets": ["w2", "w3", "w1"], "mode": "any", "until": "stalled", "stall_after_s": 3}
        code, doc = InFlight(monkeypatch, payload).result()
        assert code == 0, doc
        assert doc["data"]["which"] == ["local:w1"]
        got = rows(doc)
        assert got["local:w1"]["state"] == "stalled" and got["local:w1"]["progress_evidence"] == str(quiet.log)
        assert got["local:w2"]["state"] == "working" and got["local:w3"]["state"] == "idle"
        # Without the quiet one, nothing stalls: working with progress, and idle, are neither of them stalled.
        payload = {"targets": ["w2", "w3"], "mode": "any", "until": "stalled", "stall_after_s": 3, "timeout_s": 5}
        code, doc = InFlight(monkeypatch, payload).result()
        assert code == 9, doc
        assert rows(doc)["local:w2"]["state"] == "working"
    finally:
        stop.set()
        t.join()
