"""Every SSH step is bounded: a host that takes the request and never answers costs at most connect_timeout +
request_timeout, and the other hosts' answers are always printed.

These run drover as a real process under a hard subprocess timeout: a hang fails the test (the bound is
asserted by the harness, not by measuring wall time)."""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.sshfleet import SSHFleet

# connect 3 s + request 3 s per host, plus Python's start and the other hosts: 30 s is a generous hard bound.
HARD_BOUND_S = 30


def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("test users with their own rc files need root (CI runs as root)")


def _rc(user: str, text: str) -> Path:
    entry = pwd.getpwnam(user)
    path = Path(entry.pw_dir) / ".bashrc"
    path.write_text(text)
    os.chown(path, entry.pw_uid, entry.pw_gid)
    return path


def _drover(fleet: SSHFleet, *args: str) -> tuple[int, dict[str, Any], str]:
    env = {**os.environ, "HOME": str(fleet.client_home), "DROVER_FLEET": str(fleet.fleet_file)}  # type: ignore[attr-defined]
    proc = subprocess.run(
        [sys.executable, "-m", "drover", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=HARD_BOUND_S,
        env=env,
        cwd=str(ROOT),
    )
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def _fleet_with(fleet: SSHFleet, user: str) -> None:
    toml = fleet.fleet_toml(f'[hosts.stuck]\nssh = "h2"\nuser = "{user}"\n')
    toml = toml.replace("connect_timeout = 5.0\nrequest_timeout = 20.0", "connect_timeout = 3.0\nrequest_timeout = 3.0")
    fleet.fleet_file.write_text(toml, encoding="utf-8")  # type: ignore[attr-defined]


def _stopped_sessions(user: str) -> list[int]:
    uid = pwd.getpwnam(user).pw_uid
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        if "\nState:\tT" in status and f"\nUid:\t{uid}\t" in status:
            out.append(int(pid))
    return out


def test_a_stopped_sshd_mid_fan_out_is_bounded_and_the_others_answer(sshfleet: SSHFleet) -> None:
    """The login shell stops its own sshd session process: the connection stays open and nothing comes back --
    what a partition looks like from the client."""
    _need_root()
    user = sshfleet.shell_user("bash")
    rc = _rc(user, "kill -STOP $PPID\n")
    try:
        _fleet_with(sshfleet, user)
        code, doc, err = _drover(sshfleet, "ls")
        hosts = {h["host"]: h["ok"] for h in doc["data"]["hosts"]}
        assert hosts == {"local": True, "h1": True, "h2": True, "h3": True, "stuck": False}, doc
        assert code == 8, err
        error = next(e for e in doc["errors"] if e["host"] == "stuck")
        assert error["code"] in ("timeout", "connect_timeout") and "3s" in error["message"]
    finally:
        rc.unlink()
        for pid in _stopped_sessions(user):
            os.kill(pid, signal.SIGKILL)


def test_a_remote_rc_file_that_sleeps_is_bounded_by_the_request_timeout(sshfleet: SSHFleet) -> None:
    _need_root()
    user = sshfleet.shell_user("bash")
    rc = _rc(user, "sleep 60\n")
    try:
        _fleet_with(sshfleet, user)
        code, doc, err = _drover(sshfleet, "fleet", "check")
        rows = {r["host"]: r for r in doc["data"]["hosts"]}
        assert rows["h1"]["ok"] and rows["h3"]["ok"] and not rows["stuck"]["ok"], doc
        assert rows["stuck"]["error"]["code"] == "timeout"
        assert code == 8, err
    finally:
        rc.unlink()
        subprocess.run(["pkill", "-KILL", "-u", user, "sleep"], capture_output=True)


def test_a_send_to_a_host_that_never_answers_is_indeterminate_not_failed(sshfleet: SSHFleet) -> None:
    _need_root()
    user = sshfleet.shell_user("bash")
    rc = _rc(user, "kill -STOP $PPID\n")
    try:
        _fleet_with(sshfleet, user)
        code, doc, _err = _drover(sshfleet, "send", "stuck:%0", "are you there?")
        data = doc["data"]
        assert (data["outcome"], data.get("indeterminate")) == ("failed", True), data
        assert code == 5
    finally:
        rc.unlink()
        for pid in _stopped_sessions(user):
            os.kill(pid, signal.SIGKILL)
