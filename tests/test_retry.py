"""kill -9 at each step of a send, then `drover retry`: every message lands exactly once, counted in what the
receiver itself recorded (the demo agent's log, Claude Code's transcript).  `drover verify` turns a message that
was queued behind a turn into a verified one once the turn has run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import drover
from tests.conftest import ROOT, Tmux, helper_pids, stays, wait_for

STEPS = ["after_accept", "after_paste", "after_enter", "before_outcome"]


def killed_send(target: str, text: str, step: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """`drover send` in its own process, killed with SIGKILL at `step` (DROVER_FAULT, drover's test hook)."""
    return subprocess.run(
        [sys.executable, "-m", "drover", "--actor", "crasher", "send", target, text, *extra],
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        env={**os.environ, "DROVER_FAULT": step},
        timeout=180,
    )


def opened_by(pid: int, path: str) -> bool:
    """Does process `pid` hold `path` open (one of its file descriptors)?"""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == path:
                return True
        except OSError:
            continue
    return False


def alive(pid: int) -> bool:
    """Is there a process `pid`, not a zombie?"""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def only_pending() -> dict[str, Any]:
    pending = drover.run("messages.list", {"pending": True}).data["messages"]
    assert len(pending) == 1, pending
    return dict(pending[0])


@pytest.mark.parametrize("step", STEPS)
def test_kill_9_at_each_step_then_retry_lands_exactly_once(tmux: Tmux, step: str, cli: Any) -> None:
    pane = tmux.agent(f"k-{step.replace('_', '-')}")
    text = f"exactly once, killed {step}"
    proc = killed_send(pane.address, text, step)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    msg = only_pending()
    got = cli("retry", msg["id"], "--json")
    assert got.code == 0, got.out + got.err
    data = got.json()["data"]
    assert data["outcome"] == "delivered" and data["verified"] is True, data
    if step in ("after_enter", "before_outcome"):
        assert "not sent again" in data["detail"]  # it had arrived: found in the agent's record
    elif step == "after_paste":
        assert data["attempt"] == "finish"  # it sat in the input box: submitted, not pasted a second time
    wait_for(lambda: text in "".join(pane.messages()), what="the message")
    stays(lambda: sum(text in m for m in pane.messages()) == 1, 1.0, what="exactly one copy")
    again = cli("retry", msg["id"], "--json").json()["data"]
    assert "nothing to do" in again["detail"]
    stays(lambda: sum(text in m for m in pane.messages()) == 1, 0.3, what="still exactly one copy")
    assert drover.run("messages.list", {"pending": True}).data["messages"] == []


def test_kill_9_before_accept_leaves_nothing_to_retry_and_nothing_sent(tmux: Tmux) -> None:
    pane = tmux.agent("k-before")
    proc = killed_send(pane.address, "never accepted", "before_accept")
    assert proc.returncode == -signal.SIGKILL
    assert drover.run("messages.list", {}).data["messages"] == []
    stays(lambda: pane.messages() == [], what="nothing sent")


def test_retry_of_a_message_refused_before_the_paste_sends_it_once(tmux: Tmux) -> None:
    pane = tmux.agent("k-refused")
    os.kill(pane.pid, signal.SIGUSR1)  # a dialog: the guard refuses before pasting
    wait_for(lambda: "Do you want to proceed?" in pane.screen())
    first = drover.run("sessions.message", {"id": pane.address, "text": "after the dialog"}, actor="t")
    assert (first.data["outcome"], first.data["code"]) == ("refused", "dialog")
    pane.tmux("send-keys", "-t", pane.id, "Escape")  # the person answers their dialog
    wait_for(lambda: "idle · paste" in pane.screen())
    again = drover.run("messages.retry", {"id": first.data["id"]})
    assert again.data["outcome"] == "delivered", again.data
    wait_for(lambda: pane.messages() == [f"{drover_envelope('t')}\nafter the dialog\n</cross-session-message>"])


def drover_envelope(actor: str) -> str:
    return f'<cross-session-message from-name="drover ({actor})" from-mode="prompting">'


def test_retry_never_guesses_for_a_program_with_no_record(tmux: Tmux, isolated: Path) -> None:
    pane = tmux.start("plain", "env PS1='$ ' bash --norc")
    wait_for(lambda: pane.screen().rstrip().endswith("$"))
    marker = isolated / "ran-twice"
    proc = killed_send(pane.address, f"echo x >> {marker}", "before_outcome", "--raw")
    assert proc.returncode == -signal.SIGKILL
    wait_for(marker.exists, what="the command to have run once")
    msg = only_pending()
    doc = drover.run("messages.retry", {"id": msg["id"]})
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "cannot_verify"), doc.data
    stays(lambda: marker.read_text() == "x\n", what="never run a second time")


# -- the real Claude Code --------------------------------------------------------------------------------------------


def peer_bodies(s: Any) -> list[str]:
    return [p["origin"]["body"] for p in s.peer_messages()]


def typed_turns(s: Any, needle: str) -> int:
    return sum(1 for r in s.transcript() if r.get("type") == "user" and needle in json.dumps(r.get("message", {})))


@pytest.mark.parametrize("step", ["after_accept", "after_inbox_send", "before_outcome"])
def test_claude_inbox_kill_9_then_retry_lands_exactly_once(claude_lab: Any, step: str) -> None:
    s = claude_lab.start(f"ki-{step.replace('_', '-')}")
    text = f"inbox, killed {step}"
    proc = killed_send(f"local:{s.name}", text, step)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    msg = only_pending()
    if step != "after_accept":  # it went out: let its turn run (a retry while the session is busy says so and waits)
        wait_for(lambda: text in peer_bodies(s), timeout=120, what="the message's turn")
    wait_for(lambda: s.status() == "idle", timeout=120)
    doc = drover.run("messages.retry", {"id": msg["id"]})
    assert doc.data["outcome"] == "delivered" and doc.data["verified"] is True, (doc.data.get("code"), doc.data.get("detail"))
    wait_for(lambda: text in peer_bodies(s), timeout=120, what="the peer message")
    stays(lambda: peer_bodies(s).count(text) == 1, 2, "exactly one peer record")


@pytest.mark.parametrize("step", ["after_paste", "after_enter"])
def test_claude_tmux_lane_kill_9_then_retry_lands_exactly_once(
    claude_lab: Any, step: str, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The owner's own words are the only paste a Claude with an inbox gets (owner_relay on).
    fleet = isolated / "fleet.toml"
    fleet.write_text("[hosts.local]\nowner_relay = true\n")
    monkeypatch.setenv("DROVER_FLEET", str(fleet))
    s = claude_lab.start(f"kt-{step.replace('_', '-')}")
    text = f"typed, killed {step}"
    proc = killed_send(f"local:{s.name}", text, step, "--via", "tmux", "--as-owner")
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    msg = only_pending()
    if step == "after_enter":  # Enter went: let the turn it started run (a retry while it is busy says so and waits)
        wait_for(lambda: typed_turns(s, msg["id"]) >= 1, timeout=120, what="the typed turn")
    wait_for(lambda: s.status() == "idle", timeout=120)
    doc = drover.run("messages.retry", {"id": msg["id"]})
    assert doc.data["outcome"] in ("delivered", "queuedBehindTurn"), (doc.data.get("code"), doc.data.get("detail"))
    wait_for(lambda: typed_turns(s, msg["id"]) >= 1, timeout=120, what="the typed turn")
    stays(lambda: typed_turns(s, msg["id"]) == 1, 2, "exactly one typed turn")


def test_claude_verified_when_idle_and_verified_later_when_queued(claude_lab: Any, cli: Any) -> None:
    # The first turn is held at the fake API until the second message has been queued behind it: a turn of fixed
    # length could end first on a loaded machine, and the second message would then find Claude idle.
    s = claude_lab.start("verif-a", hold=True)
    first = drover.run("sessions.message", {"id": s.name, "text": "idle: verified at once"}, actor="t")
    assert (first.data["outcome"], first.data["verified"]) == ("delivered", True), first.data
    assert "transcript" in first.data["verification"] or ".jsonl" in first.data["verification"]
    wait_for(lambda: s.status() == "busy", what="the first turn running")
    queued = drover.run("sessions.message", {"id": s.name, "text": "busy: verified after the turn"}, actor="t")
    assert (queued.data["outcome"], queued.data["verified"]) == ("queuedBehindTurn", False), queued.data
    human = cli("log", "show", queued.data["id"])
    assert "queuedBehindTurn" in human.out
    s.set_control()  # lets the held turn end: the queued message's turn follows, answered at once
    wait_for(lambda: "busy: verified after the turn" in peer_bodies(s), timeout=120, what="the queued message")
    res = cli("verify", "--json")
    assert res.code == 0, res.err
    rows = {r["id"]: r for r in res.json()["data"]["messages"]}
    assert rows[queued.data["id"]]["verified"] is True
    record = drover.run("messages.get", {"id": queued.data["id"]}).data["message"]
    assert (record["outcome"], record["verified"]) == ("delivered", True)


def test_ctrl_c_mid_send_records_interrupted_and_retry_finishes_it(tmux: Tmux, isolated: Path) -> None:
    from drover.remote.tmux_lane import PaneLock

    pane = tmux.agent("ctrlc")
    socket = Path(os.environ["TMUX_TMPDIR"]) / f"tmux-{os.getuid()}" / "default"
    hold = PaneLock(str(socket), pane.id, 0)
    with hold:  # another sender holds the pane: drover waits for it, with its request out
        proc = subprocess.Popen(
            [sys.executable, "-m", "drover", "send", pane.address, "interrupted on its way"],
            cwd=str(ROOT),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # Ctrl-C only once drover is waiting on the pane's lock (the local helper, a thread of the sender, has the
        # lock file open): the accepted event alone does not say the request is out, and a fixed moment could fall
        # before it or after drover's own bound on the wait (lock_wait_s, 20 s) on a loaded machine.
        wait_for(lambda: opened_by(proc.pid, hold.path) or proc.poll() is not None, 120, what="drover waiting on the lock")
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "interrupted" in err, (proc.returncode, out, err)
    msg = drover.run("messages.list", {}).data["messages"][0]
    assert (msg["outcome"], msg["code"], msg["indeterminate"]) == ("failed", "interrupted", True), msg
    doc = drover.run("messages.retry", {"id": msg["id"]})
    assert doc.data["outcome"] == "delivered", doc.data
    wait_for(lambda: any("interrupted on its way" in m for m in pane.messages()), 60, what="the message")
    stays(lambda: sum("interrupted on its way" in m for m in pane.messages()) == 1, what="exactly once")


def test_kill_9_of_the_sender_mid_ssh_then_retry_lands_exactly_once(sshfleet: Any, isolated: Path) -> None:
    from drover.remote.tmux_lane import PaneLock
    from tests.conftest import remote_agent

    pane = remote_agent(sshfleet, "h2", "far", isolated)
    socket = Path(sshfleet.host_env("h2")["TMUX_TMPDIR"]) / f"tmux-{os.getuid()}" / "default"
    env = {**os.environ, "HOME": str(sshfleet.client_home), "DROVER_FLEET": str(sshfleet.fleet_file)}
    others = set(helper_pids("h2"))  # an earlier test's helpers, not this send's
    with PaneLock(str(socket), pane.id, 0):  # the delivery waits on h2 for the pane, its request out
        proc = subprocess.Popen([sys.executable, "-m", "drover", "send", "h2:far", "killed mid-ssh"], cwd=str(ROOT), env=env)
        wait_for(lambda: drover.run("messages.list", {}).data["messages"], timeout=120, what="the accepted event")
        wait_for(lambda: set(helper_pids("h2")) - others, timeout=120, what="the delivering helper on h2")
        proc.kill()  # kill -9 of the sender, mid-SSH
        proc.wait(timeout=60)
    msg = drover.run("messages.list", {}).data["messages"][-1]
    assert msg["pending"] is True
    doc = drover.run("messages.retry", {"id": msg["id"]})
    assert doc.data["outcome"] in ("delivered", "queuedBehindTurn"), (doc.data.get("code"), doc.data.get("detail"))
    wait_for(lambda: any("killed mid-ssh" in m for m in pane.messages()), timeout=120)
    stays(lambda: sum("killed mid-ssh" in m for m in pane.messages()) == 1, 1.0, what="exactly one copy on h2")


# -- found by a stranger trying to break it ------------------------------------------------------------------------


def test_a_second_retry_never_sends_what_the_first_refused_to_risk(tmux: Tmux, isolated: Path) -> None:
    pane = tmux.start("plain2", "env PS1='$ ' bash --norc")
    wait_for(lambda: pane.screen().rstrip().endswith("$"))
    ran = isolated / "ran"
    proc = killed_send(pane.address, f"echo RAN >> {ran}", "after_enter", "--raw")
    assert proc.returncode == -signal.SIGKILL
    wait_for(ran.exists)
    msg = only_pending()
    for _ in range(2):
        doc = drover.run("messages.retry", {"id": msg["id"]})
        assert doc.data["code"] == "cannot_verify", doc.data
    stays(lambda: ran.read_text() == "RAN\n", what="run once, never twice")


def test_two_retries_at_once_deliver_once(tmux: Tmux) -> None:
    pane = tmux.agent("twice")
    assert killed_send(pane.address, "two retries at once", "after_accept").returncode == -signal.SIGKILL
    msg = only_pending()
    procs = [
        subprocess.Popen([sys.executable, "-m", "drover", "retry", msg["id"]], cwd=str(ROOT), stdout=subprocess.PIPE)
        for _ in range(2)
    ]
    codes = sorted(p.wait(timeout=180) for p in procs)
    assert codes == [0, 4], codes
    wait_for(lambda: any("two retries at once" in m for m in pane.messages()))
    stays(lambda: sum("two retries at once" in m for m in pane.messages()) == 1, 1.0, what="one copy")


def test_a_record_that_only_mentions_the_id_does_not_verify_it(tmux: Tmux) -> None:
    pane = tmux.agent("mention")
    assert killed_send(pane.address, "message A, never sent", "after_accept").returncode == -signal.SIGKILL
    a = only_pending()["id"]
    drover.run("sessions.message", {"id": pane.address, "text": f"FYI: {a} was lost in a crash"}, actor="t")
    rows = drover.run("messages.verify", {"ids": [a]}).data["messages"]
    assert rows[0]["verified"] is False, rows


def test_retry_does_not_submit_a_leftover_a_person_edited_or_another_message(tmux: Tmux) -> None:
    pane = tmux.agent("edited")
    assert killed_send(pane.address, "AAAA message alpha", "after_accept").returncode == -signal.SIGKILL
    a = only_pending()["id"]
    assert killed_send(pane.address, "BBBB please run the tests now", "after_paste").returncode == -signal.SIGKILL
    wait_for(lambda: "BBBB" in pane.screen() or "<cross-session-message" in pane.screen(), what="B in the input box")
    other = drover.run("messages.retry", {"id": a})
    assert (other.data["outcome"], other.data["code"]) == ("refused", "draft_in_input"), other.data
    b = next(m for m in drover.run("messages.list", {"pending": True}).data["messages"] if m["id"] != a)["id"]
    for _ in range(12):
        pane.tmux("send-keys", "-t", pane.id, "BSpace")
    pane.tmux("send-keys", "-t", pane.id, "-l", " HUMAN EDIT </cross-session-message>")
    edited = drover.run("messages.retry", {"id": b})
    assert (edited.data["outcome"], edited.data["code"]) == ("refused", "draft_in_input"), edited.data
    stays(lambda: pane.messages() == [], what="neither the edit nor the other message submitted")


def test_retry_never_redirects_to_a_session_that_replaced_the_original(tmux: Tmux) -> None:
    pane = tmux.agent("first")
    assert killed_send(pane.address, "rotate the keys", "after_enter").returncode == -signal.SIGKILL
    msg = only_pending()
    old_pid = pane.pid
    pane.tmux("kill-server")
    # The original gone for good before the newcomer starts: kill-server returns before the server and its agent
    # have exited, and a new-session racing a dying server can land in it (or fail) on a loaded machine.
    wait_for(lambda: not alive(old_pid), what="the original agent gone")
    gone = lambda: subprocess.run(["tmux", "-L", pane.server, "ls"], capture_output=True).returncode != 0  # noqa: E731
    wait_for(gone, what="its server gone")
    newcomer = tmux.agent("first")
    assert (newcomer.server, newcomer.id) == (pane.server, pane.id)  # same server name, same %0: the address replaced
    doc = drover.run("messages.retry", {"id": msg["id"]})
    assert (doc.data["outcome"], doc.data["code"], doc.exit_code) == ("refused", "session_exited", 6), doc.data
    stays(lambda: newcomer.messages() == [], what="the newcomer getting nothing")


def test_retry_does_not_undo_drovers_own_limits(tmux: Tmux) -> None:
    pane = tmux.agent("limited")
    first = drover.run("sessions.message", {"id": pane.address, "text": "please merge PR 42"}, actor="t")
    second = drover.run("sessions.message", {"id": pane.address, "text": "please merge PR 42"}, actor="t")
    assert (first.data["outcome"], second.data["code"]) == ("delivered", "duplicate")
    doc = drover.run("messages.retry", {"id": second.data["id"]})
    assert doc.data["code"] == "duplicate", doc.data
    stays(lambda: len(pane.messages()) == 1, what="one copy")


def test_a_retry_waits_for_a_sender_that_is_still_at_work(tmux: Tmux) -> None:
    from drover.remote.tmux_lane import PaneLock

    pane = tmux.agent("slowpoke")
    socket = Path(os.environ["TMUX_TMPDIR"]) / f"tmux-{os.getuid()}" / "default"
    with PaneLock(str(socket), pane.id, 0):  # the sender waits for the pane, its message accepted and pending
        sender = subprocess.Popen([sys.executable, "-m", "drover", "send", pane.address, "slow sender"], cwd=str(ROOT))
        msg = wait_for(lambda: drover.run("messages.list", {"pending": True}).data["messages"], what="the pending message")
        doc = drover.run("messages.retry", {"id": msg[0]["id"]})
        assert (doc.data["outcome"], doc.data["code"]) == ("refused", "busy"), doc.data
    assert sender.wait(timeout=180) == 0
    stays(lambda: sum("slow sender" in m for m in pane.messages()) == 1, 1.0, what="one copy")
