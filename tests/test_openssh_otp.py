"""A host that wants the key *and* a one-time code at every login (keyboard-interactive through PAM): asyncssh
cannot reach it and fleet check says why; with `transport = "openssh"` one master, opened once with the code typed
at a terminal (a pseudo-terminal here, as a person would), carries every later command -- direct or through the
daemon, the paste lane and a real Claude Code's inbox lane -- with no prompt, and its end is one clear line naming
`drover connect`."""

from __future__ import annotations

import json
import os
import pty
import select
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, remote_agent, wait_for
from tests.support.sshfleet import SSHFleet
from tests.test_daemon import persistent, running  # noqa: F401 - persistent is a fixture used here

HARD_BOUND_S = 60


@pytest.fixture(scope="module")
def otp_started() -> Iterator[SSHFleet]:
    if os.geteuid() != 0:
        pytest.skip("the second-factor sshd writes a PAM service into /etc/pam.d: needs root (CI runs as root)")
    fleet = SSHFleet(1, second_factor=True).start()
    yield fleet
    fleet.stop()


@pytest.fixture
def otp(otp_started: SSHFleet, isolated: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SSHFleet]:
    """The one-host second-factor fleet, `transport = "openssh"`, with this test's client HOME."""
    fleet = otp_started
    monkeypatch.setenv("HOME", str(fleet.client_home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    path = isolated / "fleet.toml"
    fleet.fleet_file = path  # type: ignore[attr-defined]
    write_fleet(fleet, "openssh")
    monkeypatch.setenv("DROVER_FLEET", str(path))
    yield fleet
    master(fleet, "-O", "exit")
    fleet.kill_tmux()


def write_fleet(fleet: SSHFleet, transport: str) -> None:
    text = fleet.fleet_toml().replace('ssh = "h1"\n', f'ssh = "h1"\ntransport = "{transport}"\n')
    fleet.fleet_file.write_text(text, encoding="utf-8")  # type: ignore[attr-defined]


def control_path(fleet: SSHFleet) -> str:
    from drover.fleet import load
    from drover.transport.openssh_config import OpenSSHCommand

    doc, _ = load(fleet.fleet_file)  # type: ignore[attr-defined]
    return OpenSSHCommand("h1", doc.host("h1"), 5).control_path()


def master(fleet: SSHFleet, *args: str) -> subprocess.CompletedProcess[str]:
    """`ssh -O ...` on the master, as the user would."""
    config = fleet.client_home / ".ssh" / "config"
    return subprocess.run(
        ["ssh", "-F", str(config), "-o", f"ControlPath={control_path(fleet)}", *args, "h1"],
        capture_output=True,
        text=True,
        timeout=20,
        stdin=subprocess.DEVNULL,
    )


def drover(*args: str) -> tuple[int, Any, str]:
    """drover as a real process with no terminal (a cron job): a prompt would hang it, and the hard bound fail it."""
    proc = subprocess.run(
        [sys.executable, "-m", "drover", *args],
        capture_output=True,
        text=True,
        timeout=HARD_BOUND_S,
        cwd=str(ROOT),
        stdin=subprocess.DEVNULL,
    )
    out = json.loads(proc.stdout) if "--json" in args and proc.stdout.strip() else proc.stdout
    return proc.returncode, out, proc.stderr


def connect_at_a_terminal(fleet: SSHFleet, code: str = "424242", argv: list[str] | None = None) -> bytes:
    """`drover connect h1` (or `argv`) on a pseudo-terminal: the code typed when asked, once.  What the terminal
    showed."""
    argv = argv or [sys.executable, "-m", "drover", "connect", "h1"]
    pid, fd = pty.fork()
    if pid == 0:  # the child: exec at once
        os.chdir(str(ROOT))
        os.execvp(argv[0], argv)
    shown, typed = b"", False
    deadline = time.monotonic() + HARD_BOUND_S
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if not ready:
                continue
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the terminal's other side closed: drover connect has exited
                break
            if not chunk:
                break
            shown += chunk
            if b"Password:" in shown and not typed:
                os.write(fd, code.encode() + b"\n")
                typed = True
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0, shown
    assert typed, shown
    return shown


def test_fleet_check_explains_the_second_factor_and_what_opens_the_master(otp: SSHFleet) -> None:
    before = otp.otp_attempts()
    # asyncssh: the key is accepted, then a code is asked for -- said as such, with the way to reach the host.
    write_fleet(otp, "asyncssh")
    code, doc, _err = drover("fleet", "check", "--json")
    row = next(r for r in doc["data"]["hosts"] if r["host"] == "h1")
    assert code != 0 and row["auth"] is False, row
    assert row["error"]["code"] == "second_factor", row
    assert 'transport = "openssh"' in row["error"]["hint"] and "drover connect h1" in row["error"]["hint"]
    # openssh with no master: BatchMode fails at once (no prompt, no code tried), and the line names the fix.
    write_fleet(otp, "openssh")
    code, doc, err = drover("ls", "--host", "h1")
    assert code != 0
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "no OpenSSH master is up for h1" in lines[0] and "drover connect h1" in lines[0], err
    code, doc, _err = drover("fleet", "check", "--json")
    row = next(r for r in doc["data"]["hosts"] if r["host"] == "h1")
    assert row["error"]["code"] == "no_master" and row["master"] == "down", row
    words = shlex.split(row["connect"])
    assert words[-2:] == ["h1", "true"] and f"ControlPath={control_path(otp)}" in words and "-M" in words, row
    human = drover("fleet", "check")[2]
    assert "drover connect h1" in human and "ssh " in human
    assert otp.otp_attempts() == before  # nobody was asked for a code


def test_the_connect_command_fleet_check_prints_opens_the_master(otp: SSHFleet) -> None:
    """The "opens it" line, pasted at a terminal, is what `drover connect` runs: the client config's `BatchMode yes`
    (the fleet's has it) would otherwise refuse the code's prompt -- "Permission denied (keyboard-interactive)"."""
    assert "BatchMode yes" in (otp.client_home / ".ssh" / "config").read_text()
    _code, doc, _err = drover("fleet", "check", "--json")
    line = next(r for r in doc["data"]["hosts"] if r["host"] == "h1")["connect"]
    before = len(otp.otp_attempts())
    connect_at_a_terminal(otp, argv=shlex.split(line))
    assert len(otp.otp_attempts()) == before + 1
    assert master(otp, "-O", "check").returncode == 0
    code, _doc, err = drover("ls", "--host", "h1")
    assert code == 0, err


def test_one_master_carries_every_command_with_no_prompt(otp: SSHFleet, isolated: Path) -> None:
    pane = remote_agent(otp, "h1", "agent", isolated)
    before = len(otp.otp_attempts())
    shown = connect_at_a_terminal(otp)
    assert b"the master for h1 is up" in shown, shown
    assert len(otp.otp_attempts()) == before + 1  # one code, typed once
    code, doc, err = drover("ls", "--json")
    assert code == 0, err
    assert [(s["host"], s["name"]) for s in doc["data"]["sessions"]] == [("h1", "agent")]
    code, doc, err = drover("--actor", "tester", "send", "h1:agent", "through the master", "--json")
    assert code == 0 and doc["data"]["outcome"] == "delivered", (err, doc)
    wait_for(lambda: any("through the master" in m for m in pane.messages()), what="the message on h1")
    code, doc, err = drover("read", "h1:agent", "--json")
    assert code == 0, err
    code, doc, err = drover("wait", "h1:agent", "--until", "idle", "--timeout", "20", "--json")
    assert code == 0 and doc["data"]["reached"], (err, doc)
    code, doc, err = drover("--actor", "tester", "broadcast", "--all", "to all, through the master", "--json")
    assert code == 0, (err, json.dumps(doc))
    wait_for(lambda: any("to all, through the master" in m for m in pane.messages()), what="the broadcast on h1")
    code, doc, err = drover("fleet", "check", "--json")
    row = next(r for r in doc["data"]["hosts"] if r["host"] == "h1")
    assert code == 0 and row["ok"] and row["master"] == "up", row
    assert len(otp.otp_attempts()) == before + 1  # every command rode the master: no code asked again
    # The master goes away: the next command stops with one line naming the fix, and asks nobody for a code.
    assert master(otp, "-O", "exit").returncode == 0
    code, doc, err = drover("send", "h1:agent", "after the master", "--json")
    assert code != 0 and doc["errors"][0]["code"] == "no_master", doc
    code, _out, err = drover("ls", "--host", "h1")
    lines = [line for line in err.splitlines() if line.strip()]
    assert code != 0 and len(lines) == 1 and "drover connect h1" in lines[0], err
    assert len(otp.otp_attempts()) == before + 1
    # `drover connect` again: a second code, and the commands work again.
    connect_at_a_terminal(otp)
    assert drover("ls", "--host", "h1")[0] == 0


def test_the_daemon_keeps_its_helpers_on_the_master(otp: SSHFleet, isolated: Path, persistent: Path) -> None:  # noqa: F811
    pane = remote_agent(otp, "h1", "agent", isolated)
    connect_at_a_terminal(otp)
    before = len(otp.otp_attempts())
    assert drover("ls")[0] == 0  # the first use runs directly and starts the daemon
    running()
    for n in range(3):
        code, doc, err = drover("--actor", "tester", "send", "h1:agent", f"warm {n}", "--json")
        assert code == 0 and doc["data"]["outcome"] == "delivered", (err, doc)
    wait_for(lambda: sum("warm " in m for m in pane.messages()) == 3, what="the three sends")
    status = drover("daemon", "status", "--json")[1]
    link = next(h for h in status["hosts"] if h["host"] == "h1")
    assert link["connected"] and link["helpers"] >= 1 and link["connects"] == 1, link  # one ssh, kept and reused
    assert len(otp.otp_attempts()) == before
    # The master goes away: the kept helper's ssh ends with it, and the daemon's next request names the fix.
    assert master(otp, "-O", "exit").returncode == 0
    code, doc, err = wait_for(
        lambda: (r := drover("send", "h1:agent", "no master", "--json")) and r[1]["errors"] and r, what="a failed send"
    )
    assert code != 0 and doc["errors"][0]["code"] in ("no_master", "connection_lost"), doc
    code, doc, err = drover("ls", "--host", "h1", "--json")
    assert code != 0 and doc["errors"][0]["code"] == "no_master" and "drover connect h1" in doc["errors"][0]["hint"], doc
    assert len(otp.otp_attempts()) == before


def test_the_inbox_lane_rides_the_master(
    otp: SSHFleet, claude_binary: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """A real Claude Code session on the second-factor host: `send` goes through its inbox, over the master."""
    import shutil

    from tests.support.claudelab import ClaudeLab

    monkeypatch.setenv("TMUX_TMPDIR", otp.host_env("h1")["TMUX_TMPDIR"])
    home = otp.host_home("h1")
    lab = ClaudeLab(home / "claude", claude_binary, home=home)

    def cleanup() -> None:
        for path in (home / "claude", home / ".claude"):
            shutil.rmtree(path, ignore_errors=True)

    request.addfinalizer(cleanup)
    session = lab.start("remote-a")
    connect_at_a_terminal(otp)
    before = len(otp.otp_attempts())
    code, doc, err = drover("--actor", "tester", "send", "h1:remote-a", "through the inbox and the master", "--json")
    assert code == 0, err
    assert (doc["data"]["outcome"], doc["data"]["lane"]) == ("delivered", "inbox"), doc
    peers = wait_for(session.peer_messages, timeout=20)
    assert peers[-1]["origin"]["body"] == "through the inbox and the master"
    assert len(otp.otp_attempts()) == before
