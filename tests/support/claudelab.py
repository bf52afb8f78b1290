"""The real Claude Code binary, offline, in tmux panes: each session in its own network namespace with a fake
Messages API beside it (claude-code-inbox.md §7).

The binary comes from npm (@anthropic-ai/claude-code@2.1.328), installed once into ~/.cache/drover-test/ and
reused. Every session of one lab shares a HOME (so they share ~/.claude/sessions, as a user's sessions do);
drover's helper finds them through CLAUDE_CONFIG_DIR.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VERSION = "2.1.328"
PACKAGE = f"@anthropic-ai/claude-code@{VERSION}"
HERE = Path(__file__).resolve().parent

try:  # imported as tests.support.claudelab by pytest, as claudelab by scripts/test.sh
    from tests.support.npmcache import START_S, cache_root, npm_install, unshare_works
except ImportError:
    from npmcache import START_S, cache_root, npm_install, unshare_works  # type: ignore[no-redef]


def cache_dir() -> Path:
    return cache_root() / f"claude-code-{VERSION}"


def binary_path() -> Path:
    return cache_dir() / "node_modules" / "@anthropic-ai" / "claude-code-linux-x64" / "claude"


def ensure_binary() -> tuple[Path | None, str]:
    """(path to the binary, "") or (None, why it cannot run here)."""
    path = binary_path()
    why = npm_install(PACKAGE, cache_dir(), path) or unshare_works()
    return (None, why) if why else (path, "")


@dataclass
class ClaudeSession:
    lab: ClaudeLab
    name: str
    cwd: Path
    pane: str
    control: Path
    requests: Path
    pid: int = 0
    session_id: str = ""

    def set_control(self, **values: Any) -> None:
        self.control.write_text(json.dumps(values))

    def record(self) -> dict[str, Any] | None:
        path = self.lab.config / "sessions" / f"{self.pid}.json"
        try:
            return dict(json.loads(path.read_text()))
        except (OSError, ValueError):
            return None

    def status(self) -> str | None:
        rec = self.record()
        return rec.get("status") if rec else None

    def transcript(self) -> list[dict[str, Any]]:
        out = []
        for path in (self.lab.config / "projects").glob(f"*/{self.session_id}.jsonl"):
            for line in path.read_text(errors="replace").splitlines():
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return out

    def peer_messages(self) -> list[dict[str, Any]]:
        return [r for r in self.transcript() if r.get("turnOrigin") == "peer" and isinstance(r.get("origin"), dict)]

    def screen(self) -> str:
        return self.lab.tmux("capture-pane", "-p", "-t", self.pane)


class ClaudeLab:
    def __init__(self, root: Path, binary: Path, home: Path | None = None, socket: Path | None = None) -> None:
        """`socket`: a tmux server of the lab's own (a lab that outlives one test: the test's own servers are
        killed after it), else the default server of $TMUX_TMPDIR."""
        self.root = root
        self.binary = binary
        self.socket = socket
        self.prefix = ["tmux", "-S", str(socket)] if socket else ["tmux"]
        self.home = home or root / "home"
        self.config = self.home / ".claude"
        self.root.mkdir(parents=True, exist_ok=True)
        self.config.mkdir(parents=True, exist_ok=True)
        self.sessions: list[ClaudeSession] = []
        self._claude_json()

    def tmux(self, *args: str) -> str:
        proc = subprocess.run([*self.prefix, *args], capture_output=True, text=True, timeout=10)
        return proc.stdout

    def close(self) -> None:
        """Stop the lab's own tmux server, and every session in it."""
        if self.socket is not None:
            subprocess.run([*self.prefix, "kill-server"], capture_output=True, timeout=10)

    def settings(self, **values: Any) -> None:
        (self.config / "settings.json").write_text(json.dumps(values))

    def _claude_json(self) -> None:
        data = {
            "hasCompletedOnboarding": True,
            "lastOnboardingVersion": VERSION,
            "customApiKeyResponses": {"approved": ["sk-ant-dummy"], "rejected": []},
            "bypassPermissionsModeAccepted": True,
            # Written once, before any session starts: running sessions rewrite this file, so a later edit could be lost.
            "projects": {str(self.root / f"w{i}"): {"hasTrustDialogAccepted": True} for i in range(10)},
        }
        (self.home / ".claude.json").write_text(json.dumps(data))

    def start(
        self,
        name: str,
        *,
        trust: bool = True,
        flags: str = "",
        wait: bool = True,
        project_settings: dict[str, Any] | None = None,
        **control: Any,
    ) -> ClaudeSession:
        """`project_settings`: the session's own .claude/settings.json (a lab's sessions share the user's)."""
        n = len(self.sessions)
        cwd = self.root / (f"w{n}" if trust else f"untrusted{n}")
        cwd.mkdir()
        if project_settings is not None:
            (cwd / ".claude").mkdir()
            (cwd / ".claude" / "settings.json").write_text(json.dumps(project_settings))
        session = ClaudeSession(self, name, cwd, "", self.root / f"{name}.control.json", self.root / f"{name}.requests.jsonl")
        session.set_control(**control)
        api = f"{sys.executable} {HERE / 'fake_anthropic.py'} --port 8765 --log {session.requests} --control {session.control}"
        env = (
            f"env -u CLAUDE_CONFIG_DIR -u TMUX_PANE HOME={self.home} ANTHROPIC_API_KEY=sk-ant-dummy "
            "ANTHROPIC_BASE_URL=http://127.0.0.1:8765 DISABLE_AUTOUPDATER=1 DISABLE_TELEMETRY=1 "
            "DISABLE_ERROR_REPORTING=1 IS_SANDBOX=1"
        )
        inner = f"ip link set lo up && ({api} &) && sleep 0.3 && exec {env} {self.binary} --name {name} {flags}"
        command = f"unshare -n sh -c '{inner}'"
        proc = subprocess.run(
            [
                *self.prefix,
                "new-session",
                "-d",
                "-P",
                "-F",
                "#{pane_id}",
                "-s",
                name,
                "-x",
                "160",
                "-y",
                "45",
                "-c",
                str(cwd),
                command,
            ],
            capture_output=True,
            text=True,
            timeout=10,
        )
        assert proc.returncode == 0, proc.stderr
        session.pane = proc.stdout.strip()
        self.sessions.append(session)
        if wait:
            self.wait_registered(session)
        return session

    def launcher(self) -> Path:
        """A script that runs this lab's Claude offline in whatever pane starts it, as `sh LAUNCHER NAME`: the
        command a spawn template names (`drover spawn`).  Its fake API logs to ROOT/NAME.requests.jsonl."""
        script = self.root / "launch-claude.sh"
        api = f'{sys.executable} {HERE / "fake_anthropic.py"} --port 8765 --log {self.root}/"$0".requests.jsonl'
        env = (
            f"env -u CLAUDE_CONFIG_DIR -u TMUX_PANE HOME={self.home} ANTHROPIC_API_KEY=sk-ant-dummy "
            "ANTHROPIC_BASE_URL=http://127.0.0.1:8765 DISABLE_AUTOUPDATER=1 DISABLE_TELEMETRY=1 "
            "DISABLE_ERROR_REPORTING=1 IS_SANDBOX=1"
        )
        inner = f'ip link set lo up && ({api} &) && sleep 0.3 && exec {env} {self.binary} --name "$0"'
        script.write_text(f"#!/bin/sh\nexec unshare -n sh -c '{inner}' \"$1\"\n")
        return script

    def wait_registered(self, session: ClaudeSession, timeout: float = START_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for path in (self.config / "sessions").glob("*.json"):
                try:
                    rec = json.loads(path.read_text())
                except (OSError, ValueError):
                    continue
                if rec.get("cwd") == str(session.cwd) and rec.get("status") == "idle":
                    session.pid, session.session_id = int(rec["pid"]), str(rec["sessionId"])
                    return
            time.sleep(0.1)
        raise AssertionError(f"claude {session.name} did not register as idle; screen:\n{session.screen()}")


def own_server_lab(binary: Path, prefix: str) -> Iterator[ClaudeLab]:
    """A lab with a tmux server of its own, for a module's tests to share (a module-scoped fixture yields from it)."""
    root = Path(tempfile.mkdtemp(prefix=prefix))  # short: the tmux socket lives under it
    lab = ClaudeLab(root, binary, socket=root / "tmux.sock")
    try:
        yield lab
    finally:
        lab.close()
        shutil.rmtree(root, ignore_errors=True)


def expose(lab: ClaudeLab) -> Iterator[None]:
    """The lab's sessions, visible to one test's drover (its CLAUDE_CONFIG_DIR, and its tmux server linked into the
    test's TMUX_TMPDIR); the link goes before the test's tmux servers are killed.  The caller sets the variable
    with its monkeypatch; this yields around the link."""
    sockdir = Path(os.environ["TMUX_TMPDIR"]) / f"tmux-{os.getuid()}"
    sockdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    link = sockdir / "claudelab"
    link.symlink_to(lab.socket or "")
    yield
    link.unlink()
