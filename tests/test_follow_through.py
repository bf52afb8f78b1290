"""The record follows what happened, also for drover's own runs (issue 18, item 6).

A send the daemon runs for a client that is killed mid-send is not cut off: the daemon lets it run to its end and
records the host's real outcome (only Ctrl-C by a client that is there interrupts).  A `drover nudge run` killed
between its record and its delivery leaves a message the next run finishes, exactly once, also when two runs
start at once.  Real daemons, real tmux panes, real processes killed with SIGKILL at a known step (the fault
points of drover/remote/faults.py hold a send there: no races)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from drover import paths
from tests.conftest import ROOT, Tmux, drover_process, remote_agent, stays, wait_for
from tests.test_daemon import _background, _finish, persistent, sock_path, status  # noqa: F401 - persistent: a fixture
from tests.test_nudge import entry, make_busy, records, write_fleet

DIRECT = {"DROVER_DAEMON": "0", "DROVER_FAULT": "", "DROVER_FAULT_GATE": ""}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def _held(gate: Path) -> bool:
    return Path(f"{gate}.held").exists()


def _daemon_log() -> str:
    try:
        return Path(paths.daemon_log(sock_path())).read_text(encoding="utf-8")
    except FileNotFoundError:
        return ""


def _messages() -> list[dict[str, Any]]:
    return list(drover_process("log", "--json", env=DIRECT).json()["data"]["messages"])


def _hold_in_the_daemon(monkeypatch: pytest.MonkeyPatch, gate: Path, step: str) -> None:
    # The daemon must share these with its clients (every DROVER_ variable is part of the environment it stands for).
    monkeypatch.setenv("DROVER_FAULT", f"hold:{step}")
    monkeypatch.setenv("DROVER_FAULT_GATE", str(gate))
    assert drover_process("daemon", "start").code == 0


# -- the daemon: a client gone mid-send ---------------------------------------------------------------------------


@pytest.mark.parametrize("step", ["after_accept", "after_paste"])
def test_a_client_killed_mid_send_leaves_the_daemon_to_finish_and_record_it(
    persistent: Path,  # noqa: F811
    tmux: Tmux,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    step: str,
) -> None:
    """kill -9 of `drover send` while the daemon holds its send after the accepted event (nothing delivered yet) or
    after the paste (Enter still to come): the send goes on to its end, the record says `delivered` (not
    failed/indeterminate), `drover verify` agrees, and neither a retry nor anything else sends it twice."""
    pane = tmux.agent("orphaned")
    gate = tmp_path / "gate"
    _hold_in_the_daemon(monkeypatch, gate, step)
    client = _background("send", pane.address, "finished without its client")
    wait_for(lambda: _held(gate), what=f"the send held at {step} in the daemon")
    assert status()["active"] == 1
    client.kill()  # SIGKILL: no Ctrl-C, no goodbye; the connection just ends
    client.communicate()
    wait_for(lambda: "a client went away mid-send (drover send)" in _daemon_log(), what="the daemon to see its client gone")
    gate.touch()
    wait_for(lambda: status()["active"] == 0, what="the send to finish in the daemon")
    wait_for(pane.messages, what="the message")
    [m] = _messages()
    assert (m["outcome"], m.get("code"), m.get("indeterminate")) == ("delivered", None, None), m
    verify = drover_process("verify", m["id"], "--json", env=DIRECT).json()["data"]["messages"]
    assert [(v["id"], v["verified"]) for v in verify] == [(m["id"], True)], verify
    again = drover_process("retry", m["id"], "--json", env=DIRECT)
    assert again.code == 0 and "nothing to do" in again.json()["data"]["detail"], again
    stays(lambda: [t.count("finished without its client") for t in pane.messages()] == [1], 1.0, what="one copy")


def test_a_client_killed_before_its_message_is_recorded_cancels_the_send(
    persistent: Path,  # noqa: F811
    tmux: Tmux,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Killed while the daemon holds the send just before its accepted event: nothing is on its way, so the command
    is cancelled there -- nothing recorded, nothing delivered, not even once the send is let go."""
    pane = tmux.agent("never")
    gate = tmp_path / "gate"
    _hold_in_the_daemon(monkeypatch, gate, "before_accept")
    client = _background("send", pane.address, "never recorded")
    wait_for(lambda: _held(gate), what="the send held before its accepted event")
    client.kill()
    client.communicate()
    wait_for(lambda: "its command is cancelled" in _daemon_log(), what="the daemon to see its client gone")
    gate.touch()
    wait_for(lambda: status()["active"] == 0, what="the cancelled send to end")
    assert _messages() == []
    assert "mid-send" not in _daemon_log()
    stays(lambda: pane.messages() == [], 1.0, what="nothing delivered")


def test_a_broadcast_whose_client_is_killed_finishes_every_send_it_began(
    persistent: Path,  # noqa: F811
    tmux: Tmux,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """`drover op sessions.broadcast` through the daemon, its client killed while the first of its sends is held
    after its accepted event: every session still gets the message once, each recorded `delivered`."""
    panes = [tmux.agent("wide-a"), tmux.agent("wide-b")]
    gate = tmp_path / "gate"
    _hold_in_the_daemon(monkeypatch, gate, "after_accept")
    client = _background("op", "sessions.broadcast", json.dumps({"text": "to all of you", "name": "wide-*"}))
    wait_for(lambda: _held(gate), what="the first send of the broadcast held in the daemon")
    client.kill()
    client.communicate()
    wait_for(lambda: "a client went away mid-send (drover op)" in _daemon_log(), what="the daemon to see its client gone")
    gate.touch()
    wait_for(lambda: status()["active"] == 0, what="the broadcast to finish in the daemon")
    for pane in panes:
        wait_for(pane.messages, what="the broadcast in each pane")
    assert sorted((m["target"], m["outcome"]) for m in _messages()) == sorted((p.address, "delivered") for p in panes)
    stays(lambda: all(len(p.messages()) == 1 for p in panes), 1.0, what="one copy each")


def test_a_retry_through_the_daemon_whose_client_is_killed_is_finished_too(
    persistent: Path,  # noqa: F811
    tmux: Tmux,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """`drover op messages.retry` is a send on its way too: its client killed after the paste, the retry still
    presses Enter and records `delivered`."""
    pane = tmux.agent("retried")
    first = drover_process("send", pane.address, "pending, then retried", env={**DIRECT, "DROVER_FAULT": "after_accept"})
    assert first.code == -signal.SIGKILL, first
    [pending] = _messages()
    assert pending["pending"] is True
    gate = tmp_path / "gate"
    _hold_in_the_daemon(monkeypatch, gate, "after_paste")
    client = _background("op", "messages.retry", json.dumps({"id": pending["id"]}))
    wait_for(lambda: _held(gate), what="the retry held after its paste in the daemon")
    client.kill()
    client.communicate()
    wait_for(lambda: "a client went away mid-send (drover op)" in _daemon_log(), what="the daemon to see its client gone")
    gate.touch()
    wait_for(lambda: status()["active"] == 0, what="the retry to finish in the daemon")
    wait_for(pane.messages, what="the retried message")
    [m] = _messages()
    assert (m["outcome"], m.get("indeterminate"), m["pending"]) == ("delivered", None, False), m
    stays(lambda: [t.count("pending, then retried") for t in pane.messages()] == [1], 1.0, what="one copy")


def test_ctrl_c_of_a_client_that_is_there_still_interrupts_its_send(
    persistent: Path,  # noqa: F811
    tmux: Tmux,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    pane = tmux.agent("stopped")
    gate = tmp_path / "gate"
    _hold_in_the_daemon(monkeypatch, gate, "after_accept")
    client = _background("send", pane.address, "never mind")
    wait_for(lambda: _held(gate), what="the send held in the daemon")
    client.send_signal(signal.SIGINT)
    res = _finish(client)
    assert res.code == 130 and "interrupted" in res.err, res
    gate.touch()
    wait_for(lambda: status()["active"] == 0, what="the interrupted send to end in the daemon")
    [m] = _messages()
    assert (m["outcome"], m["code"], m["indeterminate"]) == ("failed", "interrupted", True), m
    assert "a client went away" not in _daemon_log()
    # Interrupted as a direct run is: it may or may not have arrived (the helper may have had it already), and
    # `drover retry` finds out, exactly once.
    retried = drover_process("retry", m["id"], "--json", env=DIRECT)
    assert retried.code == 0 and retried.json()["data"]["outcome"] == "delivered", retried
    wait_for(pane.messages, what="the message, once")
    stays(lambda: [t.count("never mind") for t in pane.messages()] == [1], 1.0, what="one copy")


def test_over_ssh_one_of_two_clients_killed_leaves_both_sends_to_finish(
    sshfleet: Any,
    persistent: Path,  # noqa: F811
    isolated: Path,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Two sends at once through the daemon's pooled SSH connection to h1, both held after their accepted events;
    one client is killed, the other stays: both messages arrive once, both are recorded `delivered`, and the client
    that stayed hears its own outcome."""
    pane = remote_agent(sshfleet, "h1", "pair", isolated)
    gate = tmp_path / "gate"
    _hold_in_the_daemon(monkeypatch, gate, "after_accept")
    staying = _background("send", "h1:pair", "from the client that stays", "--json")
    wait_for(lambda: _held(gate), what="the first send held in the daemon")
    Path(f"{gate}.held").unlink()
    leaving = _background("send", "h1:pair", "from the client that is killed")
    wait_for(lambda: _held(gate) and status()["active"] == 2, what="both sends held in the daemon")
    leaving.kill()
    leaving.communicate()
    wait_for(lambda: "a client went away mid-send" in _daemon_log(), what="the daemon to see one client gone")
    assert staying.poll() is None
    gate.touch()
    res = _finish(staying)
    assert res.code == 0 and res.json()["data"]["outcome"] == "delivered", res
    wait_for(lambda: status()["active"] == 0, what="both sends to finish")
    wait_for(lambda: len(pane.messages()) == 2, what="both messages on h1")
    rows = {m["text"]: m for m in drover_process("log", "--json", env=DIRECT).json()["data"]["messages"]}
    assert {t: (m["outcome"], m.get("indeterminate")) for t, m in rows.items()} == {
        "from the client that stays": ("delivered", None),
        "from the client that is killed": ("delivered", None),
    }, rows
    stays(lambda: sorted(t.count("from the client") for t in pane.messages()) == [1, 1], 1.0, what="one copy each")


def test_a_library_call_cancelled_through_the_daemon_interrupts_its_send(
    persistent: Path,  # noqa: F811
    tmux: Tmux,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """The library's cancellation (a script's Ctrl-C) is an interrupt the daemon hears, not a caller that died."""
    import asyncio

    import drover

    pane = tmux.agent("scripted")
    gate = tmp_path / "gate"
    _hold_in_the_daemon(monkeypatch, gate, "after_accept")

    async def cancelled() -> None:
        async with drover.AsyncClient() as client:
            task = asyncio.ensure_future(client.run("sessions.message", {"host": "local", "id": pane.address, "text": "hm"}))
            while not _held(gate):
                await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(asyncio.wait_for(cancelled(), 120))
    gate.touch()
    wait_for(lambda: status()["active"] == 0, what="the interrupted send to end in the daemon")
    [m] = _messages()
    assert (m["outcome"], m["code"]) == ("failed", "interrupted"), m
    assert "a client went away" not in _daemon_log()


# -- nudge run: killed between its record and its delivery --------------------------------------------------------


def _nudge_run(env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "drover", "nudge", "run", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=str(ROOT),
        env={**os.environ, **(env or {})},
    )


def _killed_after_accept(isolated: Path) -> str:
    """A real `nudge run` SIGKILLed at the fault point between the message's accepted event and its delivery:
    the message's id, pending."""
    killed = _nudge_run({"DROVER_FAULT": "after_accept"})
    out, err = killed.communicate(timeout=120)
    assert killed.returncode == -signal.SIGKILL, (out, err)
    assert [e["phase"] for e in records(isolated, "nudge_run")] == ["start"]
    [accepted] = records(isolated, "accepted")
    assert records(isolated, "outcome") == []
    return str(accepted["id"])


def test_a_nudge_run_killed_before_delivering_is_finished_by_the_next_run_once(
    tmux: Tmux, isolated: Path, monkeypatch: pytest.MonkeyPatch, cli: Any
) -> None:
    pane = tmux.agent("cron-target")
    write_fleet(isolated, monkeypatch, entry("local:cron-target", "the hourly check-in", retry="1s"))
    msg_id = _killed_after_accept(isolated)
    assert pane.messages() == []
    shown = cli("nudge", "run", "--dry-run", "--json").json()["data"]["entries"][0]
    assert shown["due"] is False and shown["pending"] == msg_id and "left unfinished by a run killed" in shown["why"], shown
    assert cli("nudge", "run", "--dry-run").out.startswith(f"pending  local:cron-target → local:cron-target: {msg_id}")
    again = cli("nudge", "run")
    assert again.code == 0, again.err
    assert again.out.startswith("nudge local:cron-target: delivered → local:cron-target") and msg_id in again.out, again.out
    wait_for(pane.messages, what="the finished nudge")
    [m] = cli("log", "--json").json()["data"]["messages"]
    assert (m["id"], m["outcome"]) == (msg_id, "delivered")
    # Finished: later runs find it sent and send nothing, nor look for it again.
    assert cli("nudge", "run").out == ""
    assert [e["phase"] for e in records(isolated, "nudge_run")] == ["start", "done"]
    stays(lambda: [t.count("the hourly check-in") for t in pane.messages()] == [1], 1.0, what="exactly one copy")
    assert len(records(isolated, "accepted")) == 1


def test_a_half_sent_nudge_whose_session_is_busy_stays_pending_for_the_run_after(
    tmux: Tmux, isolated: Path, monkeypatch: pytest.MonkeyPatch, cli: Any
) -> None:
    pane = tmux.agent("busy-later")
    write_fleet(isolated, monkeypatch, entry("local:busy-later", "when you are free", retry="1s"))
    msg_id = _killed_after_accept(isolated)
    make_busy(pane)
    busy = cli("nudge", "run", "--json")
    assert busy.code == 0, busy.err  # the nudge's kind of refusal: tried again, not a failure for cron to mail
    row = busy.json()["data"]["entries"][0]
    assert (row["id"], row["code"], row["sent"]) == (msg_id, "busy", False), row
    assert [e["phase"] for e in records(isolated, "nudge_run")] == ["start"]  # still the dead run's, unfinished
    os.kill(pane.pid, signal.SIGUSR2)  # the turn ends
    wait_for(lambda: "esc to interrupt" not in pane.screen(), what="the agent idle again")
    done = cli("nudge", "run", "--json")
    assert done.code == 0 and done.json()["data"]["sent"] == 1, done.out
    wait_for(pane.messages, what="the finished nudge")
    assert cli("nudge", "run").out == ""
    stays(lambda: [t.count("when you are free") for t in pane.messages()] == [1], 1.0, what="exactly one copy")
    assert [r["id"] for r in records(isolated, "accepted")] == [msg_id]


def test_a_half_sent_nudge_whose_session_is_gone_is_closed_not_chased(
    tmux: Tmux, isolated: Path, monkeypatch: pytest.MonkeyPatch, cli: Any
) -> None:
    pane = tmux.agent("vanished")
    write_fleet(isolated, monkeypatch, entry("local:vanished", "too late", retry="1s"))
    msg_id = _killed_after_accept(isolated)
    subprocess.run(["tmux", "-L", "default", "kill-pane", "-t", pane.id], capture_output=True, timeout=10)
    gone = cli("nudge", "run", "--json")
    assert gone.code == 6, gone.out  # a target error, as a nudge to a session that is not there
    row = gone.json()["data"]["entries"][0]
    assert (row["id"], row["outcome"], row["sent"]) == (msg_id, "failed", False), row
    runs = records(isolated, "nudge_run")
    assert [(e["phase"], e.get("sent")) for e in runs] == [("start", None), ("done", False)]
    # Closed: the next runs treat the entry as tried (its own refusals from here), never look for the message again.
    later = cli("nudge", "run", "--dry-run", "--json").json()["data"]["entries"][0]
    assert "pending" not in later, later
    assert [m["id"] for m in cli("log", "--pending", "--json").json()["data"]["messages"]] == [msg_id]


def test_a_half_sent_nudge_is_never_finished_into_a_new_session_under_the_old_name_and_pane(
    tmux: Tmux, isolated: Path, monkeypatch: pytest.MonkeyPatch, cli: Any
) -> None:
    """The tmux server restarted between the killed run and the next: a new agent named the same, in a pane with the
    same id (%0 on a new server).  The message was for the old session: it is closed, never pasted into the new one."""
    old = tmux.agent("reused")
    write_fleet(isolated, monkeypatch, entry("local:reused", "for the old one only", retry="1h"))
    msg_id = _killed_after_accept(isolated)
    [accepted] = records(isolated, "accepted")
    server = subprocess.run(["tmux", "-L", "default", "display", "-p", "#{pid}"], capture_output=True, text=True, timeout=10)
    subprocess.run(["tmux", "-L", "default", "kill-server"], capture_output=True, timeout=10)
    # A new server started while the old one is still exiting dies at once ("server exited unexpectedly").
    wait_for(lambda: not alive(int(server.stdout)) and not alive(old.pid), what="the old tmux server and its agent gone")
    new = tmux.agent("reused")
    assert new.id == old.id, (new.id, old.id)  # the same pane id, another session
    res = cli("nudge", "run", "--json")
    row = res.json()["data"]["entries"][0]
    assert (row["id"], row["code"], row["sent"]) == (msg_id, "session_exited", False), row
    assert accepted["options"]["pin"].endswith(new.id)
    assert [(e["phase"], e.get("sent")) for e in records(isolated, "nudge_run")] == [("start", None), ("done", False)]
    stays(lambda: new.messages() == [], 1.0, what="nothing pasted into the new session")
    assert len(records(isolated, "accepted")) == 1


def test_a_nudge_that_did_arrive_before_its_run_was_killed_is_not_sent_again(
    tmux: Tmux, isolated: Path, monkeypatch: pytest.MonkeyPatch, cli: Any
) -> None:
    """Killed after the delivery, before its outcome: the next run finds the message in the receiver's own record
    (as `drover retry` does), records it delivered, and sends nothing."""
    pane = tmux.agent("arrived")
    write_fleet(isolated, monkeypatch, entry("local:arrived", "already there", retry="1s"))
    killed = _nudge_run({"DROVER_FAULT": "before_outcome"})
    killed.communicate(timeout=120)
    assert killed.returncode == -signal.SIGKILL
    wait_for(pane.messages, what="the message the killed run delivered")
    again = cli("nudge", "run", "--json")
    assert again.code == 0, again.err
    row = again.json()["data"]["entries"][0]
    assert row["outcome"] == "delivered" and "arrived after all" in row["detail"], row
    [m] = cli("log", "--json").json()["data"]["messages"]
    assert m["outcome"] == "delivered" and m["verified"] is True
    stays(lambda: len(pane.messages()) == 1, 1.0, what="no second copy")


def test_two_runs_at_once_after_a_killed_run_finish_its_nudge_once(
    tmux: Tmux, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pane = tmux.agent("raced")
    write_fleet(isolated, monkeypatch, entry("local:raced", "one of two runs sends this", retry="1s"))
    msg_id = _killed_after_accept(isolated)
    runs = [_nudge_run() for _ in range(2)]
    outs = [p.communicate(timeout=180) for p in runs]
    assert [p.returncode for p in runs] == [0, 0], outs
    sent = sorted(json.loads(out)["data"]["sent"] for out, _err in outs)
    assert sent == [0, 1], outs  # one run finished it; the other waited for the lock, then found it done
    wait_for(pane.messages, what="the finished nudge")
    stays(lambda: [t.count("one of two runs") for t in pane.messages()] == [1], 1.0, what="exactly one copy")
    assert [r["id"] for r in records(isolated, "accepted")] == [msg_id]
    assert [e["phase"] for e in records(isolated, "nudge_run")] == ["start", "done"]
