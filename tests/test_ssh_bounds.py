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
from tests.support.sshfleet import SSHFleet

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


def test_a_send_to_a_host_that_never_answers_is_indeterminate_not_failed(sshfleet: SSHFleet, isolated: Path) -> None:
    """The host answers which session it is (resolve), then takes the delivery and never answers: drover cannot
    know whether the text arrived, so the outcome is failed + indeterminate -- and a host that never answered
    the resolve is plainly failed, since nothing was sent."""
    _need_root()
    user = sshfleet.shell_user("bash")
    home = Path(pwd.getpwnam(user).pw_dir)
    (home / ".drover-seen").unlink(missing_ok=True)
    rc = _rc(user, "if [ -e ~/.drover-seen ]; then kill -STOP $PPID; fi; touch ~/.drover-seen\n")
    # A pane of that user's own (what it runs does not matter: the delivery never gets an answer).
    subprocess.run(
        ["su", "-s", "/bin/sh", user, "-c", "env -u TMUX_TMPDIR -u TMUX tmux new-session -d -s target sleep 600"],
        check=True,
        timeout=10,
    )
    try:
        _fleet_with(sshfleet, user)
        code, doc, _err = _drover(sshfleet, "send", "stuck:target", "are you there?")
        data = doc["data"]
        assert (data["outcome"], data.get("indeterminate")) == ("failed", True), data
        assert code == 5
        (home / ".drover-seen").unlink(missing_ok=True)
        for pid in _stopped_sessions(user):
            os.kill(pid, signal.SIGKILL)
        rc.write_text("kill -STOP $PPID\n")
        code, doc, _err = _drover(sshfleet, "send", "stuck:target", "and now?")
        assert (doc["data"]["outcome"], doc["data"].get("indeterminate")) == ("failed", None), doc["data"]
    finally:
        rc.unlink()
        for pid in _stopped_sessions(user):
            os.kill(pid, signal.SIGKILL)
        subprocess.run(["pkill", "-KILL", "-u", user], capture_output=True)


def test_a_job_an_rc_file_leaves_in_the_background_does_not_hold_the_answer(sshfleet: SSHFleet) -> None:
    """The job keeps the channel open long after the helper answered: drover reads the framed answer and goes."""
    _need_root()
    user = sshfleet.shell_user("bash")
    rc = _rc(user, "sleep 30 &\n")
    try:
        _fleet_with(sshfleet, user)
        code, doc, err = _drover(sshfleet, "ls", "--host", "stuck")
        assert code == 0, (doc, err)
        assert doc["data"]["hosts"] == [{"host": "stuck", "ok": True, "sessions": 0}]
    finally:
        rc.unlink()
        subprocess.run(["pkill", "-KILL", "-u", user, "sleep"], capture_output=True)


def test_an_rc_file_that_fakes_drovers_framing_does_not_replace_the_answer(sshfleet: SSHFleet) -> None:
    _need_root()
    user = sshfleet.shell_user("bash")
    rc = _rc(user, 'printf "\\036drover-answer 2\\n{}\\n\\036drover-answer x\\n"\n')
    try:
        _fleet_with(sshfleet, user)
        code, doc, err = _drover(sshfleet, "ls", "--host", "stuck")
        assert code == 0, (doc, err)
        assert "login shell on stuck printed" in " ".join(w["message"] for w in doc["data"]["warnings"])
    finally:
        rc.unlink()


@pytest.mark.parametrize(
    ("rc_text", "code"),
    [("exit 1\n", "shell_failed"), ("echo banner >&2; exit 2\n", "shell_failed"), ("read x\n", "shell_failed")],
)
def test_a_login_shell_that_does_not_run_the_helper_is_named(sshfleet: SSHFleet, rc_text: str, code: str) -> None:
    _need_root()
    user = sshfleet.shell_user("bash")
    rc = _rc(user, rc_text)
    try:
        _fleet_with(sshfleet, user)
        _code, doc, _err = _drover(sshfleet, "fleet", "check", "--host", "stuck")
        row = doc["data"]["hosts"][0]
        assert (row["reachable"], row["auth"], row["shell"], row["error"]["code"]) == (True, True, False, code), row
    finally:
        rc.unlink()


def test_a_python_missing_under_tcsh_is_named_so(sshfleet: SSHFleet) -> None:
    _need_root()
    user = sshfleet.shell_user("tcsh")
    toml = sshfleet.fleet_toml(f'[hosts.tc]\nssh = "h2"\nuser = "{user}"\npython = "python9"\n')
    sshfleet.fleet_file.write_text(toml, encoding="utf-8")  # type: ignore[attr-defined]
    _code, doc, _err = _drover(sshfleet, "fleet", "check", "--host", "tc")
    row = doc["data"]["hosts"][0]
    assert (row["shell"], row["python"], row["error"]["code"]) == (True, False, "python_missing"), row


def test_a_spawn_on_a_host_that_never_answers_is_bounded_by_its_timeout(sshfleet: SSHFleet) -> None:
    """`spawn --timeout 3` to a host whose login never finishes: reported within the harness's bound, not after
    the engine's 60 s ready wait on top (the request's bound was ready_timeout_s + the timeout)."""
    _need_root()
    user = sshfleet.shell_user("bash")
    rc = _rc(user, "sleep 120\n")
    try:
        _fleet_with(sshfleet, user)
        fleet = Path(sshfleet.fleet_file)  # type: ignore[attr-defined]
        fleet.write_text(fleet.read_text(encoding="utf-8") + '\n[spawn.demo]\ncommand = "sleep 600"\n', encoding="utf-8")
        code, doc, err = _drover(
            sshfleet, "spawn", "stuck", "--engine", "demo", "--cwd", "/tmp", "--brief", "x", "--timeout", "3"
        )
        assert code != 0 and doc["ok"] is False, err
        assert doc["errors"][0]["code"] in ("timeout", "connect_timeout") and "3s" in doc["errors"][0]["message"], doc
    finally:
        rc.unlink()
        subprocess.run(["pkill", "-KILL", "-u", user, "sleep"], capture_output=True)
