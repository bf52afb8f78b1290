"""Shared fixtures: an isolated drover home and fleet, private tmux servers, and the demo agent in real panes."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.tiers import mark_slow

# With PYTHONDONTWRITEBYTECODE set (as on the machines here), pytest would rewrite and compile every test module
# anew on each run, which is most of the fast tier's time: the suite keeps its own compiled files.
sys.dont_write_bytecode = False

# A shell starts a background job (`bash scripts/test.sh &`, nohup, a CI runner's child) with SIGINT ignored, and
# an ignored signal stays ignored across exec: every drover a test starts would then ignore the Ctrl-C the tests
# send it (test_retry, test_broadcast, test_openssh_traps).  A handled signal is reset to the default at exec.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# nohup ignores SIGHUP the same way, and test_openssh_traps hangs a drover up.  A handler that does nothing keeps
# the suite itself running through a hang-up, as nohup meant, while its children get the default again at exec.
if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
    signal.signal(signal.SIGHUP, lambda *_: None)

ROOT = Path(__file__).resolve().parents[1]
SCREENS = Path(__file__).resolve().parent / "screens"


ID_ATTR = re.compile(r' from-session="msg_[0-9a-f]+"')


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The slow tier: tests that start tmux, sshd, an agent or drover as a process, or wait on the clock
    # (tests/support/tiers.py reads that from their code).  `pytest -m "not slow"` runs the rest in seconds.
    mark_slow(items)


def wait_for(cond: Callable[[], Any], timeout: float = 60.0, interval: float = 0.05, what: str = "condition") -> Any:
    """Until cond() is true, returning its value.  The default bound is generous on purpose: it only says how long a
    test waits before calling a condition that never comes a failure, and a loaded machine (load average 15-20 on
    two cores) makes slow what is quick on a quiet one."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def stays(cond: Callable[[], Any], seconds: float = 0.3, what: str = "condition") -> None:
    """Assert that cond holds for the whole window: how a test shows that nothing arrives (no Enter, no key).

    An absence cannot be waited for, only watched for a while; this fails as soon as the thing appears.
    """
    deadline = time.monotonic() + seconds
    while True:
        assert cond(), f"{what} stopped holding"
        if time.monotonic() > deadline:
            return
        time.sleep(0.05)


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """Every test gets its own drover home, config dir and tmux socket directory, and leaves no server behind."""
    # tmux socket paths must stay short (108 bytes), so not under pytest's deep tmp_path.
    tmux_dir = tempfile.mkdtemp(prefix="drt-")
    monkeypatch.setenv("DROVER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("TMUX_TMPDIR", tmux_dir)
    # No persistent daemon unless a test asks for one (tests/test_daemon.py): a test's drover is the direct path.
    monkeypatch.setenv("DROVER_DAEMON", "0")
    for var in ("DROVER_FLEET", "DROVER_ACTOR", "TMUX", "TMUX_PANE"):
        monkeypatch.delenv(var, raising=False)
    yield tmp_path
    # drover.run keeps its connections for the next call: not into the next test, whose fleet and HOME differ.
    import drover

    drover.close()
    sockdir = Path(tmux_dir) / f"tmux-{os.getuid()}"
    if sockdir.exists():
        for sock in sockdir.iterdir():
            subprocess.run(["tmux", "-S", str(sock), "kill-server"], capture_output=True, timeout=10)
    shutil.rmtree(tmux_dir, ignore_errors=True)


@dataclass
class Pane:
    server: str
    id: str
    log: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def tmux(self, *args: str, check: bool = True) -> str:
        proc = subprocess.run(["tmux", "-L", self.server, *args], capture_output=True, text=True, timeout=10)
        if check and proc.returncode != 0:
            raise AssertionError(f"tmux {args}: {proc.stderr}")
        return proc.stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", self.id)

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        assert self.log is not None
        if not self.log.exists():
            return []
        rows = [json.loads(line) for line in self.log.read_text(encoding="utf-8").splitlines() if line.strip()]
        return [r for r in rows if kind is None or r["type"] == kind]

    def messages(self) -> list[str]:
        """What the program received, with drover's message id (the envelope's from-session) taken out, so tests
        can compare texts; raw_messages() keeps it."""
        return [ID_ATTR.sub("", text) for text in self.raw_messages()]

    def raw_messages(self) -> list[str]:
        return [e["text"] for e in self.events("message")]

    @property
    def pid(self) -> int:
        return int(self.events("start")[0]["pid"])

    def wait_idle(self, timeout: float = 60.0) -> None:
        # Generous: the demo agent is a Python program, and its start-up alone can take many seconds under load.
        wait_for(lambda: "idle · paste" in self.screen(), timeout, what=f"{self.id} idle")

    @property
    def address(self) -> str:
        return f"{self.server}/{self.id}"


class Tmux:
    """Starts private tmux servers (one per name) inside the test's TMUX_TMPDIR."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.count = 0

    def start(self, session: str, command: str, server: str = "default", width: int = 160, height: int = 40) -> Pane:
        env_cmd = ["tmux", "-L", server, "new-session", "-d", "-P", "-F", "#{pane_id}", "-s", session]
        proc = subprocess.run(
            [*env_cmd, "-x", str(width), "-y", str(height), "-c", str(self.tmp), command],
            capture_output=True,
            text=True,
            timeout=10,
        )
        assert proc.returncode == 0, proc.stderr
        return Pane(server, proc.stdout.strip())

    def agent(self, session: str = "agent", server: str = "default", *flags: str, wait: bool = True) -> Pane:
        self.count += 1
        log = self.tmp / f"agent-{self.count}.jsonl"
        cmd = f"{sys.executable} -m drover.demo_agent --log {log} --name {session} {' '.join(flags)}"
        pane = self.start(session, cmd, server)
        pane.log = log
        if wait:
            pane.wait_idle()
        return pane


@pytest.fixture
def tmux(isolated: Path) -> Tmux:
    if not shutil.which("tmux"):
        pytest.fail("tmux is not installed: the README's test command installs it (apt-get install tmux)")
    return Tmux(isolated)


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., CliResult]:
    """Run `drover ARGS` in-process; returns exit code, stdout, stderr.  The click command is built once per
    process (drover/cli/program.py), so a call costs what the command does, not typer's signature reading."""
    from drover.cli.main import main

    def run(*args: str, stdin: str | None = None) -> CliResult:
        capsys.readouterr()
        old = sys.stdin
        if stdin is not None:
            import io

            sys.stdin = io.StringIO(stdin)
        try:
            code = main(list(args))
        finally:
            sys.stdin = old
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


def drover_process(*args: str, stdin: str | None = None, timeout: float = 60, env: dict[str, str] | None = None) -> CliResult:
    """Run `python -m drover ARGS` as a real separate process."""
    proc = subprocess.run(
        [sys.executable, "-m", "drover", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=str(ROOT),
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture(scope="session")
def ssh_fleet_started() -> Iterator[Any]:
    from tests.support.sshfleet import SSHD, SSHFleet

    if not Path(SSHD).exists():
        pytest.fail("openssh-server is not installed: the README's test command installs it")
    fleet = SSHFleet(3).start()
    yield fleet
    fleet.stop()


@pytest.fixture
def sshfleet(ssh_fleet_started: Any, isolated: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The real OpenSSH fleet (h1, h2, h3), with this test's client HOME and a fleet file naming its hosts."""
    fleet = ssh_fleet_started
    monkeypatch.setenv("HOME", str(fleet.client_home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    path = isolated / "fleet.toml"
    path.write_text(fleet.fleet_toml(), encoding="utf-8")
    monkeypatch.setenv("DROVER_FLEET", str(path))
    fleet.fleet_file = path
    yield fleet
    fleet.kill_tmux()


def remote_agent(fleet: Any, host: str, session: str, tmp: Path, *flags: str) -> Pane:
    """The demo agent in a tmux pane on one host of the SSH fleet (`flags`: more of its options)."""
    log = tmp / f"{host}-{session}.jsonl"
    cmd = f"{sys.executable} -m drover.demo_agent --log {log} --name {session} {' '.join(flags)}".rstrip()
    proc = fleet.tmux(host, "new-session", "-d", "-P", "-F", "#{pane_id}", "-s", session, "-x", "160", "-y", "40", cmd)
    assert proc.returncode == 0, proc.stderr
    pane = Pane("default", proc.stdout.strip(), log)
    wait_for(lambda: "idle · paste" in fleet.tmux(host, "capture-pane", "-p", "-t", pane.id).stdout, what=f"agent on {host}")
    return pane


def helper_pids(host: str) -> list[int]:
    """The drover helpers at work on one host of the SSH fleet (its bootstrap names itself drover_boot).

    A helper's own child between fork and exec (it runs tmux through subprocess) still shows the helper's command
    line and environment: a process whose parent is a helper is that, not one more helper."""
    found: dict[int, int] = {}  # pid -> its parent's pid
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if b"drover_boot" in cmdline and f"DROVER_TEST_HOST={host}".encode() in environ.split(b"\0"):
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                state, ppid = fields[0], int(fields[1])
            except (OSError, IndexError, ValueError):
                continue
            if state not in ("Z", "X"):  # a helper that has exited, not yet reaped by its sshd, is no helper
                found[int(pid)] = ppid
    return [pid for pid, ppid in found.items() if ppid not in found]


@pytest.fixture(scope="session")
def claude_binary() -> Path:
    from tests.support.claudelab import ensure_binary

    path, why = ensure_binary()
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the tests against the real Claude Code binary, but: {why}")
        pytest.skip(f"the real Claude Code binary cannot run here: {why}")
    return path


@pytest.fixture
def claude_lab(claude_binary: Path, tmux: Tmux, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from tests.support.claudelab import ClaudeLab

    root = Path(tempfile.mkdtemp(prefix="drc-"))
    lab = ClaudeLab(root, claude_binary)
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(lab.config))
    yield lab
    for session in lab.sessions:
        subprocess.run(["tmux", "kill-session", "-t", session.name], capture_output=True, timeout=10)
    shutil.rmtree(root, ignore_errors=True)
