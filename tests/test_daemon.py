"""Persistent mode: the daemon starts on first use, serves the hot commands, exits when idle, is the user's alone,
and every way it can fail leaves the caller with the direct path -- or, for a send it may have delivered, with an
honest `uncertain` and the retry that finishes it once.  Real processes throughout: `python -m drover` (the same
front as the console script), a real daemon, real tmux panes, the real OpenSSH fleet."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import drover
from drover import paths
from tests.conftest import CliResult, Tmux, drover_process, helper_pids, remote_agent, stays, wait_for
from tests.support.imports import foreign, importtime_modules
from tests.support.sshfleet import SSHD, SSHFleet

SYSTEM_PYTHON = "/usr/bin/python3"  # the venv's interpreter may live where another user cannot run it
FRONT = {"drover", "drover.front", "drover.daemon", "drover.daemon.client", "drover.paths", "drover.daemon.wire"}


@pytest.fixture
def persistent(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Persistent mode on (the suite runs with it off), in a runtime directory of this test's own; every daemon
    it started is stopped afterwards."""
    run = Path(tempfile.mkdtemp(prefix="drd-"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    monkeypatch.setenv("DROVER_DAEMON", "1")
    monkeypatch.setenv("DROVER_DAEMON_IDLE_S", "120")
    yield run
    for sock in (run / "drover").glob("*.sock") if (run / "drover").exists() else []:
        pid = _pid_of(str(sock))
        if pid:
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(run, ignore_errors=True)


def _pid_of(sock: str) -> int | None:
    from drover.daemon import client

    answer = client.control(sock, {"t": "status"}, timeout=2)
    return int(answer["pid"]) if answer else None


def sock_path() -> str:
    return paths.socket_path()


def status() -> dict[str, Any]:
    res = drover_process("daemon", "status", "--json")
    doc = json.loads(res.out)
    assert (res.code == 0) == doc["running"], res
    return dict(doc)


def running() -> dict[str, Any]:
    """Wait for the daemon the first use started, and return its status."""
    return wait_for(lambda: status() if os.path.exists(sock_path()) and status()["running"] else None, 20, what="the daemon")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_first_use_starts_a_daemon_that_serves_the_next_commands(persistent: Path, tmux: Tmux) -> None:
    pane = tmux.agent("warm")
    assert not os.path.exists(sock_path())
    # The first use runs directly and starts the daemon; capture_output with a timeout is a `$(drover ls)`: it
    # returns because the daemon holds none of our pipes.
    first = drover_process("ls", "--json", timeout=60)
    assert first.code == 0 and [s["name"] for s in first.json()["data"]["sessions"]] == ["warm"], first
    info = running()
    assert info["served"] == 0 and info["socket"] == sock_path()
    send = drover_process("send", f"{pane.address}", "through the daemon")
    assert send.code == 0 and "delivered" in send.out, send
    wait_for(pane.messages, what="the message")
    assert [m.count("through the daemon") for m in pane.messages()] == [1]
    again = status()
    assert again["pid"] == info["pid"] and again["served"] == 1
    # The record is the same in both modes: accepted (write-ahead), then the outcome.
    log = drover_process("log", "--json").json()["data"]["messages"]
    assert [(m["target"], m["outcome"]) for m in log] == [(pane.address, "delivered")]
    assert status()["served"] == 2  # log went through it too
    # stdin is sent only when the command reads it; the caller's actor is the sender.
    piped = drover_process("send", pane.address, "-", stdin="from stdin\n", env={"DROVER_ACTOR": "piper"})
    assert piped.code == 0, piped
    wait_for(lambda: len(pane.messages()) == 2, what="the piped message")
    assert 'from-name="drover (piper)"' in pane.messages()[1] and "from stdin" in pane.messages()[1]
    # A usage error is the same line and exit code as a direct run.
    bad = drover_process("send", pane.address, "")
    assert bad.code == 2 and bad.err.startswith("drover: "), bad
    assert status()["served"] == 4
    # Shell completion of a send completes; it is never sent to the daemon to run.
    words = {"_DROVER_COMPLETE": "complete_bash", "COMP_WORDS": "drover send lo", "COMP_CWORD": "2"}
    # (the sessions offered are those the daemon's `ls` above saw: no host is asked on Tab)
    assert drover_process("send", "lo", env=words).out.split() == ["local:", "local:warm"]
    assert status()["served"] == 4
    stays(lambda: len(pane.messages()) == 2, 0.5, what="nothing sent by a completion")


def test_the_hot_path_imports_only_the_standard_library(persistent: Path, tmux: Tmux) -> None:
    tmux.agent("lean")
    drover_process("ls")
    running()
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "drover", "ls", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ,
    )
    assert proc.returncode == 0 and json.loads(proc.stdout)["data"]["sessions"][0]["name"] == "lean", proc.stderr[-500:]
    outside = foreign(importtime_modules(proc.stderr), FRONT)
    assert outside == set(), outside
    assert status()["served"] >= 1


def test_idle_exit(persistent: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DROVER_DAEMON_IDLE_S", "2")
    started = drover_process("daemon", "start")
    assert started.code == 0 and "started: pid" in started.out, started
    pid = int(started.out.split("started: pid ")[1].split(",")[0])
    assert alive(pid)
    wait_for(lambda: not alive(pid), 20, what="the idle daemon to exit")
    assert not os.path.exists(sock_path())
    gone = drover_process("daemon", "status")
    assert gone.code == 5 and "no daemon" in gone.out


def test_the_idle_is_a_duration_on_the_command_line_and_in_the_variable(
    persistent: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`daemon start --idle 1m30s` reaches the daemon it starts (handed on so that its own --idle, read by the same
    grammar, takes it back), and so does `DROVER_DAEMON_IDLE_S=2m`."""
    started = drover_process("daemon", "start", "--idle", "1m30s")
    assert started.code == 0 and "started: pid" in started.out, started
    assert status()["idle_timeout_s"] == 90.0
    assert drover_process("daemon", "stop").code == 0
    wait_for(lambda: not os.path.exists(sock_path()), 20, what="the daemon to stop")
    monkeypatch.setenv("DROVER_DAEMON_IDLE_S", "2m")
    assert drover_process("daemon", "start").code == 0
    assert status()["idle_timeout_s"] == 120.0


def test_stop_and_turning_it_off(persistent: Path, tmux: Tmux, monkeypatch: pytest.MonkeyPatch, isolated: Path) -> None:
    tmux.agent("off")
    assert drover_process("daemon", "start").code == 0
    pid = status()["pid"]
    stopped = drover_process("daemon", "stop")
    assert stopped.code == 0 and f"pid {pid}" in stopped.out
    wait_for(lambda: not alive(pid), what="the stopped daemon to exit")
    # DROVER_DAEMON=0: a hot command runs directly and starts nothing.
    assert drover_process("ls", env={"DROVER_DAEMON": "0"}).code == 0
    stays(lambda: not os.path.exists(sock_path()), 1.0, what="no daemon")
    # daemon = false in the fleet file: the same.
    fleet = isolated / "fleet.toml"
    fleet.write_text("[defaults]\ndaemon = false\n", encoding="utf-8")
    monkeypatch.setenv("DROVER_FLEET", str(fleet))
    assert drover_process("ls").code == 0
    stays(lambda: not os.path.exists(paths.socket_path()), 1.0, what="no daemon")


def test_the_socket_is_the_users_alone(persistent: Path, tmux: Tmux) -> None:
    tmux.agent("mine")
    assert drover_process("daemon", "start").code == 0
    path = sock_path()
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    if os.geteuid() != 0 or not os.path.exists(SYSTEM_PYTHON):
        return  # the rest needs another user (root can be one) and an interpreter that user can run
    # Another user cannot even reach it (0700 directory) ...
    nobody = 65534
    probe = (
        "import socket,sys\ns=socket.socket(socket.AF_UNIX)\ntry:\n s.connect(sys.argv[1])\nexcept OSError as e:\n"
        " print('refused', e.errno)\n sys.exit()\n"
        "try:\n s.sendall(b'{\"t\":\"status\"}\\n'); print('answer', repr(s.recv(100)))\n"
        "except OSError:\n print('answer', repr(b''))\n"
    )

    def as_nobody() -> str:
        out = subprocess.run([SYSTEM_PYTHON, "-c", probe, path], capture_output=True, text=True, timeout=30, user=nobody, cwd="/")
        return out.stdout.strip()

    assert as_nobody().startswith("refused")
    # ... and if the modes are opened up behind its back, the daemon's own peer check still answers nothing.
    persistent.chmod(0o755)
    os.chmod(os.path.dirname(path), 0o755)
    os.chmod(path, 0o777)
    try:
        assert as_nobody() == "answer b''"
    finally:
        os.chmod(os.path.dirname(path), 0o700)
        os.chmod(path, 0o600)
    # A directory that is not ours, or not 0700, is never used: the command runs directly.
    os.chmod(os.path.dirname(path), 0o755)
    try:
        res = drover_process("ls", "--json")
        assert res.code == 0
    finally:
        os.chmod(os.path.dirname(path), 0o700)
    assert status()["served"] == 0


def test_a_stranger_directory_is_refused(persistent: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = Path(tempfile.mkdtemp(prefix="drx-"))
    link_base = Path(tempfile.mkdtemp(prefix="drl-"))
    (link_base / "drover").symlink_to(target)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(link_base))
    try:
        res = drover_process("daemon", "start")
        assert res.code == 7 and "not a directory (a symlink" in res.err, res
        assert drover_process("ls").code == 0  # runs directly
        assert list(target.iterdir()) == []
    finally:
        shutil.rmtree(target, ignore_errors=True)
        shutil.rmtree(link_base, ignore_errors=True)


def _background(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "drover", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def _finish(proc: subprocess.Popen[str], timeout: float = 60) -> CliResult:
    out, err = proc.communicate(timeout=timeout)
    return CliResult(proc.returncode, out, err)


def _wait_in_the_daemon(tmux: Tmux, name: str, timeout: str) -> tuple[int, subprocess.Popen[str], Any]:
    """An agent in a turn that runs until the test ends it (SIGUSR2 again), a daemon, and a `drover wait --until idle`
    at work in it: (the daemon's pid, the waiting client, the pane).  Not a timed turn: on a loaded machine the wait
    could start after it ended."""
    pane = tmux.agent(name)
    os.kill(pane.pid, signal.SIGUSR2)
    assert drover_process("daemon", "start").code == 0
    pid = status()["pid"]
    waiting = _background("wait", pane.address, "--until", "idle", "--timeout", timeout)
    wait_for(lambda: status()["active"] == 1, what="the wait to run in the daemon")
    return pid, waiting, pane


def test_a_daemon_killed_mid_request_falls_back_for_a_wait(persistent: Path, tmux: Tmux) -> None:
    pid, waiting, pane = _wait_in_the_daemon(tmux, "waiter", "60")
    os.kill(pid, signal.SIGKILL)
    # The client runs the wait itself (waiting changes nothing: running it again is harmless), and it ends as a
    # direct wait does, once the agent is idle again.
    stays(lambda: waiting.poll() is None, 0.5, what="the direct wait waiting for the turn")
    os.kill(pane.pid, signal.SIGUSR2)
    done = _finish(waiting)
    assert done.code == 0 and "is idle" in done.out and done.err == "", done
    assert not alive(pid)


def test_a_stopped_daemon_costs_a_wait_then_the_send_runs_directly_once(persistent: Path, tmux: Tmux) -> None:
    pane = tmux.agent("frozen")
    assert drover_process("daemon", "start").code == 0
    pid = status()["pid"]
    os.kill(pid, signal.SIGSTOP)  # it still accepts connections (the kernel does), but answers nothing
    try:
        res = drover_process("send", pane.address, "frozen daemon")
        assert res.code == 0 and "delivered" in res.out, res
    finally:
        os.kill(pid, signal.SIGCONT)
    # Continued, it finds the request too late to start: it never runs it a second time.
    stays(lambda: len(pane.messages()) == 1, 2.0, what="one copy")
    assert status()["served"] == 0


def test_a_daemon_killed_mid_send_is_never_resent(persistent: Path, tmux: Tmux, monkeypatch: pytest.MonkeyPatch) -> None:
    pane = tmux.agent("once")
    # The daemon kills itself (SIGKILL) right after the accepted event, before anything is delivered.
    monkeypatch.setenv("DROVER_FAULT", "after_accept")
    assert drover_process("daemon", "start").code == 0
    pid = status()["pid"]
    res = drover_process("send", pane.address, "exactly once")
    assert res.code == 5, res
    msg_id = res.err.split("while sending ")[1].split(":")[0]
    assert f"drover retry {msg_id}" in res.err and "never twice" in res.err
    assert not alive(pid)
    stays(lambda: pane.messages() == [], 1.0, what="nothing delivered, and nothing resent by the client")
    monkeypatch.delenv("DROVER_FAULT")
    pending = drover_process("log", "--pending", "--json", env={"DROVER_DAEMON": "0"}).json()["data"]["messages"]
    assert [m["id"] for m in pending] == [msg_id]
    retried = drover_process("retry", msg_id)
    assert retried.code == 0 and "delivered" in retried.out, retried
    wait_for(pane.messages, what="the retried message")
    stays(lambda: [m.count("exactly once") for m in pane.messages()] == [1], 1.0, what="one copy")


def test_a_daemon_killed_after_delivery_reports_it_uncertain_and_retry_finds_it(
    persistent: Path, tmux: Tmux, monkeypatch: pytest.MonkeyPatch
) -> None:
    pane = tmux.agent("landed")
    monkeypatch.setenv("DROVER_FAULT", "before_outcome")
    assert drover_process("daemon", "start").code == 0
    res = drover_process("send", pane.address, "it did arrive")
    assert res.code == 5 and "may or may not have arrived" in res.err, res
    msg_id = res.err.split("while sending ")[1].split(":")[0]
    wait_for(pane.messages, what="the delivered message")
    monkeypatch.delenv("DROVER_FAULT")
    retried = drover_process("retry", msg_id, "--json")
    assert retried.code == 0 and "arrived after all" in retried.json()["data"]["detail"], retried
    stays(lambda: len(pane.messages()) == 1, 1.0, what="no second copy")


def test_a_stale_socket_is_replaced(persistent: Path, tmux: Tmux) -> None:
    tmux.agent("stale")
    path = sock_path()
    paths.ensure_dir(os.path.dirname(path))
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(path)
    dead.close()  # the file stays, nobody listens: a daemon killed -9
    assert drover_process("ls").code == 0  # runs directly, starts a daemon that takes the socket over
    assert running()["served"] == 0
    assert drover_process("ls").code == 0
    assert status()["served"] == 1


# -- over SSH ------------------------------------------------------------------------------------------------------


def test_a_transport_in_persistent_mode_never_runs_more_helpers_than_its_bound(sshfleet: SSHFleet) -> None:
    """Sixteen requests at once through a transport bound to 2 helpers: all answered, and no more than 2 helpers
    ever started.  A helper handed back to the idle list after its slot was released let a waiting request start a
    third (CI saw 9 of 8)."""
    import asyncio

    from drover.fleet import load
    from drover.transport import ssh

    fleet, _ = load(Path(os.environ["DROVER_FLEET"]))
    started: list[int] = []
    real_start = ssh.Helper.start

    async def counted(conn: Any, command: str) -> Any:
        started.append(1)
        return await real_start(conn, command)

    async def run() -> list[Any]:
        transport = ssh.SSHTransport("h1", fleet.host("h1"), fleet.defaults, {}, helpers=2)
        try:
            answers = []
            for _ in range(3):  # rounds: a bound broken once would show in any of them
                answers += await asyncio.gather(*(transport.call("hello", {}, timeout=30) for _ in range(16)))
            assert len(transport._idle) <= 2 and transport.busy == 0
            return answers
        finally:
            await transport.close()

    ssh.Helper.start = counted  # type: ignore[method-assign]
    try:
        answers = asyncio.run(run())
    finally:
        ssh.Helper.start = real_start  # type: ignore[method-assign]
    assert len(answers) == 48 and all(isinstance(a, dict) for a in answers)
    assert 1 <= len(started) <= 2, f"{len(started)} helpers started for a bound of 2"


def test_a_wait_in_the_daemon_whose_client_was_killed_frees_its_helper(
    sshfleet: SSHFleet, persistent: Path, isolated: Path
) -> None:
    """kill -9 of a client waiting through the daemon: the daemon drops the request and closes that helper's
    channel, and the helper on the host -- blocked in the wait -- sees its caller gone and ends, instead of holding
    one of the host's 8 helpers until the wait's own timeout."""
    remote_agent(sshfleet, "h2", "lasting", isolated)
    assert drover_process("daemon", "start").code == 0
    before = set(fleet_helpers(sshfleet, "h2"))  # a fresh daemon: no helper of its own yet, so the wait starts one
    client = _background("wait", "h2:lasting", "--until", "exited", "--timeout", "120")
    try:
        wait_for(lambda: status()["active"] == 1, what="the wait to run in the daemon")
        working = wait_for(lambda: set(fleet_helpers(sshfleet, "h2")) - before, what="the wait's helper on h2")
        # Its caller is there: the wait goes on (a wait that took a live caller for gone would end here).
        stays(lambda: client.poll() is None, 0.5, what="the wait, while its client is there")
    finally:
        client.kill()
        client.communicate()
    wait_for(lambda: not working & set(fleet_helpers(sshfleet, "h2")), timeout=10, what="the helper to end")
    wait_for(lambda: status()["active"] == 0, what="the daemon to drop the request")


def test_a_trust_file_changed_mid_send_lets_the_send_finish_within_the_bound(
    sshfleet: SSHFleet, persistent: Path, isolated: Path
) -> None:
    """known_hosts touched (an `ssh newhost` appending a key) while a send to h1 is on its way through the daemon:
    the next request gets a new connection, but the send on the old one is not cut -- it finishes, `delivered`
    -- and the two connections' helpers together never pass the host's bound of 8."""
    from drover.remote.tmux_lane import PaneLock

    pane = remote_agent(sshfleet, "h1", "steady", isolated)
    assert drover_process("daemon", "start").code == 0
    assert drover_process("status", "h1:steady").code == 0
    socket = sshfleet.host_home("h1") / "t" / f"tmux-{os.getuid()}" / "default"
    lock = PaneLock(str(socket), pane.id, 1.0)  # another sender holds the pane: the send waits on the host
    assert lock.__enter__()
    peak = [0]
    try:
        sending = _background("send", "h1:steady", "through the change", "--json")
        wait_for(lambda: status()["active"] == 1, what="the send at work in the daemon")
        wait_for(lambda: drover.run("messages.list", {"limit": 1}).data["messages"], what="the send accepted, then sent")
        os.utime(sshfleet.known_hosts)  # the trust files changed: the host's link is replaced
        statuses = [_background("status", "h1:steady") for _ in range(10)]
        for proc in statuses:
            assert _finish(proc).code == 0
            peak[0] = max(peak[0], len(fleet_helpers(sshfleet, "h1")))
        assert sending.poll() is None, _finish(sending)  # still waiting for the pane
    finally:
        lock.__exit__()
    res = _finish(sending)
    assert res.code == 0 and res.json()["data"]["outcome"] == "delivered", res
    assert peak[0] <= 8, f"{peak[0]} helpers on h1"
    wait_for(lambda: pane.messages(), what="the message in the agent")
    hosts = {h["host"]: h for h in status()["hosts"]}
    assert hosts["h1"]["connects"] == 1  # the new link's own connection


def test_a_local_wait_whose_client_was_killed_leaves_no_thread_in_the_daemon(persistent: Path, tmux: Tmux) -> None:
    """The local host runs in the daemon's own process, on a thread: kill -9 of a waiting client, and that thread's
    wait ends within a slice instead of living on in the daemon until the wait's timeout (120 s here)."""
    pane = tmux.agent("stayer")
    assert drover_process("daemon", "start").code == 0
    pid = status()["pid"]

    def threads() -> int:
        return len(os.listdir(f"/proc/{pid}/task"))

    assert drover_process("status", pane.address).code == 0
    settled = threads()
    client = _background("wait", pane.address, "--until", "exited", "--timeout", "120")
    try:
        wait_for(lambda: status()["active"] == 1, what="the wait to run in the daemon")
        wait_for(lambda: threads() > settled, what="the wait's threads in the daemon")
    finally:
        client.kill()
        client.communicate()
    wait_for(lambda: status()["active"] == 0, what="the daemon to drop the request")
    wait_for(lambda: threads() <= settled, timeout=10, what="the wait's thread to end")


def fleet_helpers(fleet: SSHFleet, host: str) -> list[int]:
    """The helpers running on one host of *this* fleet (other fleets on the machine name their hosts h1 too)."""
    home = f"HOME={fleet.host_home(host)}".encode()
    found = []
    for pid in helper_pids(host):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:  # a helper that exited since it was listed is not running
            continue
        if home in environ.split(b"\0"):
            found.append(pid)
    return found


def _restart_sshd(fleet: SSHFleet) -> None:
    """The hosts restart: every sshd process (listeners and the sessions they serve, so every connection) is killed,
    then the listeners start again on the same addresses and port."""
    listeners = {p.pid for p in fleet.procs}
    sessions = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid in listeners:
                sessions.append(int(pid))
    for proc in fleet.procs:
        proc.kill()
        proc.wait(timeout=10)
    for session in sessions:
        try:
            os.kill(session, signal.SIGKILL)
        except ProcessLookupError:
            pass
    configs = sorted((fleet.root / "sshd").glob("sshd_config.*"))
    fleet.procs = [
        subprocess.Popen([SSHD, "-D", "-e", "-f", str(c)], stdout=fleet.log, stderr=subprocess.STDOUT) for c in configs
    ]
    fleet._wait_listening()


def test_one_connection_and_long_lived_helpers_then_a_restarted_host_is_reconnected(
    sshfleet: SSHFleet, persistent: Path, isolated: Path
) -> None:
    pane = remote_agent(sshfleet, "h1", "far", isolated)
    assert drover_process("daemon", "start").code == 0
    for i in range(3):
        res = drover_process("send", "h1:far", f"warm {i}")
        assert res.code == 0 and "delivered" in res.out, res
    host = {h["host"]: h for h in status()["hosts"]}["h1"]
    assert host["connected"] and host["connects"] == 1, host
    helpers = fleet_helpers(sshfleet, "h1")
    assert 1 <= len(helpers) <= 8  # kept running between requests, not one per request
    assert drover_process("status", "h1:far").code == 0
    assert fleet_helpers(sshfleet, "h1") == helpers
    # Twelve at once: all answered, over the one connection, by at most 8 helpers (the per-host bound).
    served = status()["served"]
    many = [_background("status", "h1:far", "--json") for _ in range(12)]
    results = [_finish(p) for p in many]
    assert [r.code for r in results] == [0] * 12, [r.err for r in results if r.code]
    assert all(r.json()["data"]["session"]["name"] == "far" for r in results)
    assert 1 <= len(fleet_helpers(sshfleet, "h1")) <= 8
    host = {h["host"]: h for h in status()["hosts"]}["h1"]
    assert host["connects"] == 1 and host["helpers"] <= 8, host
    assert status()["served"] == served + 12  # all twelve through the daemon
    # Ten long waits: eight run at once (eight helpers), two wait their turn within their own timeout.
    # Long enough that all ten are under way at once on a loaded machine (they start as separate processes).
    waits = [_background("wait", "h1:far", "--until", "exited", "--timeout", "12") for _ in range(10)]
    wait_for(lambda: len(fleet_helpers(sshfleet, "h1")) == 8, 30, what="eight helpers busy")
    stays(lambda: len(fleet_helpers(sshfleet, "h1")) <= 8, 1.0, what="at most eight helpers")
    assert [_finish(w).code for w in waits] == [9] * 10  # each timed out waiting, as a direct wait would
    _restart_sshd(sshfleet)
    # Noticed: h1 is shown disconnected, or forgotten altogether.
    wait_for(lambda: not {h["host"]: h for h in status()["hosts"]}.get("h1", {}).get("connected"), what="the daemon to notice")
    res = drover_process("send", "h1:far", "after the restart")
    assert res.code == 0 and "delivered" in res.out, res
    host = {h["host"]: h for h in status()["hosts"]}["h1"]
    assert host["connected"] and host["connects"] == 2, host
    wait_for(lambda: len(pane.messages()) == 4, what="four messages")
    assert [m.count("after the restart") for m in pane.messages()][-1] == 1


def test_the_daemon_refuses_what_the_front_would_not_send_it(persistent: Path, isolated: Path) -> None:
    """It never widens what a request may do: only the hot commands, only from its own environment and version."""
    from drover.daemon import client, wire

    assert drover_process("daemon", "start").code == 0
    env = paths.environment()

    def ask(**request: Any) -> dict[str, Any]:
        with client.connect(sock_path()) as sock:
            base = {"t": "run", "v": wire.VERSION, "argv": ["ls"], "cwd": str(isolated), "env": env, "tty": {}}
            sock.sendall(wire.encode({**base, **request}))
            return dict(wire.decode(sock.readline()))

    assert ask(argv=["daemon", "stop"])["t"] == "refuse"
    assert ask(argv=["fleet", "add", "box", "--ssh", "box"])["t"] == "refuse"
    assert ask(env={**env, "DROVER_HOME": str(isolated / "someone-elses")})["t"] == "refuse"
    assert ask(v=wire.VERSION + 1)["t"] == "refuse"
    assert ask()["t"] == "started"
    assert status()["served"] == 1
    assert not (isolated / "config" / "drover" / "fleet.toml").exists()


# -- the stranger-tester's findings --------------------------------------------------------------------------------


def test_the_environment_a_daemon_stands_for_includes_tz_the_locale_every_drover_variable_and_the_umask(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Local times (TZ), the locale, any DROVER_* setting and the umask change what a command does: a daemon started
    under other values must not serve it.  (The actor and the terminal travel with each request instead.)"""
    monkeypatch.setenv("TZ", "Pacific/Kiritimati")
    monkeypatch.setenv("LC_TIME", "C")
    monkeypatch.setenv("DROVER_SOMETHING_NEW", "1")
    monkeypatch.setenv("DROVER_ACTOR", "carried")
    env = paths.environment()
    assert env["TZ"] == "Pacific/Kiritimati" and env["LC_TIME"] == "C" and env["DROVER_SOMETHING_NEW"] == "1"
    assert "DROVER_ACTOR" not in env and "DROVER_DAEMON" not in env
    assert env[paths.UMASK] == f"{os.umask(0o022):04o}"
    os.umask(int(env[paths.UMASK], 8))
    first = paths.socket_path(env)
    monkeypatch.setenv("TZ", "UTC")
    assert paths.socket_path() != first  # another TZ reaches another daemon
    monkeypatch.setenv("TZ", "Pacific/Kiritimati")
    old = os.umask(0o077)
    try:
        assert paths.environment()[paths.UMASK] == "0077" and paths.socket_path() != first
    finally:
        os.umask(old)


def test_the_daemon_refuses_another_tz_or_umask(persistent: Path, isolated: Path) -> None:
    from drover.daemon import client, wire

    assert drover_process("daemon", "start").code == 0
    env = paths.environment()

    def ask(**request: Any) -> str:
        with client.connect(sock_path()) as sock:
            base = {"t": "run", "v": wire.VERSION, "argv": ["log"], "cwd": str(isolated), "env": env, "tty": {}}
            sock.sendall(wire.encode({**base, **request}))
            return str(wire.decode(sock.readline())["t"])

    assert ask(env={**env, "TZ": "Asia/Kolkata"}) == "refuse"
    assert ask(env={**env, paths.UMASK: "0077"}) == "refuse"
    assert ask(env={**env, "DROVER_FAULT": "after_accept"}) == "refuse"
    assert ask() == "started"


def test_a_umask_is_honoured_through_the_daemon(persistent: Path, isolated: Path) -> None:
    """`(umask 077; drover op fleet.add ...)`: files made for the caller get the caller's umask, never the daemon's."""
    assert drover_process("daemon", "start").code == 0
    served = status()["served"]
    proc = subprocess.run(
        ["sh", "-c", 'umask 077; exec "$0" -m drover log', sys.executable],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(isolated),
    )
    assert proc.returncode == 0, proc.stderr
    assert status()["served"] == served  # another environment: not this daemon's to serve
    for sock in (persistent / "drover").glob("*.sock"):
        pid = _pid_of(str(sock))
        if pid and pid != status()["pid"]:
            # the umask-077 caller's own daemon, if one was started for next time: it runs with that umask
            assert (Path(f"/proc/{pid}/status").read_text().split("Umask:")[1].split()[0]) == "0077"


@pytest.mark.parametrize(
    "args",
    [("ls", "--help"), ("send", "--help"), ("log", "--help"), ("op", "--help"), ("wait", "-h"), ("read", "--help")],
)
def test_a_commands_help_is_the_direct_help_byte_for_byte(persistent: Path, args: tuple[str, ...]) -> None:
    assert drover_process("daemon", "start").code == 0
    through = drover_process(*args, env={"COLUMNS": "91"})
    direct = drover_process(*args, env={"COLUMNS": "91", "DROVER_DAEMON": "0"})
    assert through.code == 0 and "Usage: drover" in through.out, through
    assert (through.code, through.out, through.err) == (direct.code, direct.out, direct.err)


def test_stdin_read_for_a_daemon_that_died_is_read_again_by_the_direct_run(persistent: Path, tmux: Tmux) -> None:
    pane = tmux.agent("piped")
    os.kill(pane.pid, signal.SIGUSR2)  # a turn that runs until the test ends it: however slow the machine, the wait waits
    assert drover_process("daemon", "start").code == 0
    pid = status()["pid"]
    request = json.dumps({"id": pane.address, "until": "idle", "timeout_s": 60})
    proc = subprocess.Popen(
        [sys.executable, "-m", "drover", "op", "sessions.wait", "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=str(Path(__file__).resolve().parents[1]),
    )
    assert proc.stdin is not None
    proc.stdin.write(request)
    proc.stdin.close()
    proc.stdin = None  # (communicate must not flush it)
    wait_for(lambda: status()["active"] == 1, what="the wait to run in the daemon")
    stays(lambda: proc.poll() is None, 0.5, what="the wait under way (its stdin read by the daemon)")
    os.kill(pid, signal.SIGKILL)
    stays(lambda: proc.poll() is None, 0.5, what="the direct run waiting in turn")
    os.kill(pane.pid, signal.SIGUSR2)  # the turn ends
    done = _finish(proc)
    # The direct run read the same request (not an empty stdin) and waited as the daemon would have.
    assert done.code == 0 and json.loads(done.out)["ok"] is True, done


def test_stdin_too_big_for_the_protocol_or_closed_runs_directly(
    persistent: Path, tmux: Tmux, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    from drover.daemon import client, wire

    pane = tmux.agent("big")
    assert drover_process("daemon", "start").code == 0
    monkeypatch.setattr(wire, "MAX_LINE", 1000)
    text = "a long text " * 200
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode()), encoding="utf-8"))
    monkeypatch.setattr(client, "SAVED", client._Saved())
    assert client.run(["send", pane.address, "-"]) is None  # run it here ...
    assert sys.stdin.read() == text  # ... with the very stdin the front read
    monkeypatch.setattr(sys, "stdin", None)
    monkeypatch.setattr(client, "SAVED", client._Saved())
    assert client.run(["send", pane.address, "-"]) is None  # closed: the direct run says so
    stays(lambda: pane.messages() == [], 1.0, what="nothing sent by the daemon")


def test_a_relative_fleet_files_daemon_false_is_honoured(
    persistent: Path, isolated: Path, tmux: Tmux, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fleet path is the caller's, resolved against the caller's working directory (the daemon runs from /)."""
    tmux.agent("rel")
    (isolated / "sub").mkdir()
    (isolated / "sub" / "f.toml").write_text("[defaults]\ndaemon = false\n", encoding="utf-8")

    def here(*args: str) -> CliResult:
        # The editable install finds drover from any directory (PYTHONPATH, part of the environment, is kept).
        proc = subprocess.run(
            [sys.executable, "-m", "drover", *args], capture_output=True, text=True, timeout=60, cwd=str(isolated), env=os.environ
        )
        return CliResult(proc.returncode, proc.stdout, proc.stderr)

    def served() -> int:
        return int(json.loads(here("daemon", "status", "--json").out)["served"])

    assert here("daemon", "start").code == 0
    assert here("ls").code == 0 and served() == 1  # (a daemon that serves this directory's commands)
    assert here("ls", "--fleet", "sub/f.toml").code == 0
    assert served() == 1  # not run by the daemon
    monkeypatch.setenv("DROVER_FLEET", "./sub/f.toml")
    assert here("daemon", "start").code == 0  # started by hand: a daemon for this environment
    assert here("ls").code == 0
    assert served() == 0


def test_an_overlong_runtime_dir_is_not_used_for_the_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/" + "x" * 90)
    path = paths.socket_path()
    assert path.startswith(f"/tmp/drover-{os.getuid()}/") and len(path.encode()) <= 107
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    assert paths.socket_path().startswith("/run/user/1000/drover/")


def test_a_stopped_daemon_is_given_up_on_mid_wait_and_said_to_be_not_answering(persistent: Path, tmux: Tmux) -> None:
    pid, waiting, _pane = _wait_in_the_daemon(tmux, "sleepy", "3")
    os.kill(pid, signal.SIGSTOP)
    try:
        # No heartbeat from the daemon: the client gives up on it and runs the wait itself, which times out as a
        # direct wait does (exit 9) -- it does not hang.
        done = _finish(waiting, timeout=60)
        assert done.code == 9, done
        said = drover_process("daemon", "status")
        assert said.code == 5 and f"a daemon (pid {pid}) is not answering" in said.out, said
        started = drover_process("daemon", "start")
        assert started.code == 5 and f"(pid {pid}) is not answering" in started.err, started
        stopping = drover_process("daemon", "stop")
        assert stopping.code == 5 and f"(pid {pid}) is not answering" in stopping.err, stopping
    finally:
        os.kill(pid, signal.SIGCONT)


def test_a_host_key_removed_from_known_hosts_is_not_trusted_through_a_pooled_connection(
    sshfleet: SSHFleet, persistent: Path, isolated: Path
) -> None:
    remote_agent(sshfleet, "h1", "keyed", isolated)
    assert drover_process("daemon", "start").code == 0
    assert drover_process("status", "h1:keyed").code == 0
    assert drover_process("status", "h1:keyed").code == 0
    host = {h["host"]: h for h in status()["hosts"]}["h1"]
    assert host["connected"] and host["connects"] == 1, host  # nothing changed: the connection is kept
    saved = sshfleet.known_hosts.read_bytes()
    try:
        sshfleet.known_hosts.write_bytes(b"")  # the user no longer trusts the host's key
        direct = drover_process("status", "h1:keyed", env={"DROVER_DAEMON": "0"})
        through = drover_process("status", "h1:keyed")
        assert direct.code != 0 and "host key" in direct.err, direct
        assert (through.code, through.err) == (direct.code, direct.err)
    finally:
        sshfleet.known_hosts.write_bytes(saved)
    again = drover_process("status", "h1:keyed")
    assert again.code == 0, again


def test_a_relative_fleet_files_daemon_idle_s_is_the_started_daemons(
    persistent: Path, isolated: Path, tmux: Tmux, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmux.agent("idle")
    monkeypatch.delenv("DROVER_DAEMON_IDLE_S")
    (isolated / "sub").mkdir()
    (isolated / "sub" / "g.toml").write_text("[defaults]\ndaemon_idle_s = 77\n", encoding="utf-8")
    run = {"capture_output": True, "text": True, "timeout": 60, "cwd": str(isolated), "env": os.environ}
    assert subprocess.run([sys.executable, "-m", "drover", "ls", "--fleet", "sub/g.toml"], **run).returncode == 0  # type: ignore[call-overload]

    def info() -> dict[str, Any] | None:
        proc = subprocess.run([sys.executable, "-m", "drover", "daemon", "status", "--json"], **run)  # type: ignore[call-overload]
        doc = json.loads(proc.stdout)
        return dict(doc) if doc["running"] else None

    started = wait_for(info, 20, what="the daemon the first use started")
    assert started["idle_timeout_s"] == 77  # the fleet file's, found from the caller's directory (the daemon runs from /)


def test_shell_completion_is_printed_by_the_caller_never_through_the_daemon(persistent: Path, isolated: Path) -> None:
    """`drover --show-completion send` names a hot command, but the script is for the caller's shell (typer looks
    for the shell this process runs in) and typer prints it where click prints, the process's stdout: the front runs
    it itself, and the daemon refuses it."""
    from drover.daemon import client, wire

    assert drover_process("daemon", "start").code == 0
    served = status()["served"]
    through = drover_process("--show-completion", "send")
    direct = drover_process("--show-completion", "send", env={"DROVER_DAEMON": "0"})
    assert through.code == 0 and "_drover_completion" in through.out, through
    assert (through.code, through.out, through.err) == (direct.code, direct.out, direct.err)
    assert status()["served"] == served
    with client.connect(sock_path()) as sock:
        request = {"t": "run", "v": wire.VERSION, "argv": ["--show-completion", "ls"], "cwd": str(isolated)}
        sock.sendall(wire.encode({**request, "env": paths.environment(), "tty": {}}))
        assert wire.decode(sock.readline())["t"] == "refuse"


def test_what_a_request_prints_reaches_its_caller_not_the_daemons_log(persistent: Path, tmux: Tmux) -> None:
    """The daemon hands each request an Environment of the caller's streams: tables, JSON, errors, usage errors
    and a command's help all reach the caller; the daemon's own stdout (its log) gets none of it."""
    pane = tmux.agent("logged")
    assert drover_process("daemon", "start").code == 0
    log = Path(sock_path()[: -len(".sock")] + ".log")
    before = log.read_text()
    for args, code in ((("ls",), 0), (("status", pane.address, "--json"), 0), (("send", "nosuch", "x"), 6), (("send",), 2)):
        res = drover_process(*args)
        assert res.code == code and (res.out or res.err), (args, res)
    assert status()["served"] == 4
    assert log.read_text() == before
