"""`transport = "openssh"` against what a user's machine holds: a ProxyJump with no BatchMode and an askpass, a
`Match exec`, a HOME with a space, a file at the ControlPath, a `RemoteCommand`, a remote command that exits 255,
drover killed mid-call.  Each is a way the system ssh, driven by drover, would prompt, hang, delete, or blame the
wrong thing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import ROOT, wait_for
from tests.support.sshfleet import SSHFleet
from tests.test_daemon import persistent, running  # noqa: F401 - persistent is a fixture used here
from tests.test_openssh import (
    HARD_BOUND_S,
    _processes_with,
    close_master,
    control_path,
    drover,
    drover_plain,
    open_master,
    ssh_config,
    use_openssh,
)


def drover_in(fleet: SSHFleet, *args: str, home: Path | None = None, env: dict[str, str] | None = None) -> tuple[int, Any, str]:
    """drover --json with no terminal at all (its own session, as from cron), `home` as HOME and `env` added."""
    full = {**os.environ, "HOME": str(home or fleet.client_home), "DROVER_FLEET": str(fleet.fleet_file), **(env or {})}  # type: ignore[attr-defined]
    proc = subprocess.run(
        [sys.executable, "-m", "drover", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=HARD_BOUND_S,
        env=full,
        cwd=str(ROOT),
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else None, proc.stderr


def with_config(fleet: SSHFleet, before: str = "", after: str = "") -> str:
    """The user's ssh config with `before` and `after` added; what to restore."""
    config = ssh_config(fleet)
    kept = config.read_text()
    config.write_text(before + kept + after)
    return kept


def test_no_ssh_of_drovers_ever_prompts_not_even_a_proxy_jumps(sshfleet: SSHFleet) -> None:
    """A ProxyJump's ssh gets none of drover's -o options (BatchMode included): with no terminal, and DISPLAY and
    SSH_ASKPASS set, it would run the askpass program for a host-key question (or a password).  It never does."""
    log = sshfleet.root / "askpass.log"
    log.unlink(missing_ok=True)
    askpass = sshfleet.root / "askpass.sh"
    askpass.write_text(f'#!/bin/sh\necho "asked: $*" >> {log}\nexit 1\n')
    askpass.chmod(0o755)
    jump = (
        f"Host h3\n    ProxyJump jumpy\nHost jumpy\n    HostName {sshfleet.addr('h2')}\n    Port {sshfleet.port}\n"
        f"    User {sshfleet.user}\n    IdentityFile {sshfleet.client_key}\n    UserKnownHostsFile /dev/null\n"
    )  # the jump's key is known nowhere, and nothing in its block says BatchMode
    kept = with_config(sshfleet, before=jump)
    try:
        use_openssh(sshfleet, "h3")
        env = {"DISPLAY": ":0", "SSH_ASKPASS": str(askpass), "SSH_ASKPASS_REQUIRE": "prefer"}
        code, doc, err = drover_in(sshfleet, "ls", "--host", "h3", env=env)
        assert code != 0 and doc["errors"], (doc, err)
        assert not log.exists(), log.read_text()
    finally:
        ssh_config(sshfleet).write_text(kept)


def test_a_match_exec_in_the_users_config_is_bounded_and_holds_no_pipe(sshfleet: SSHFleet) -> None:
    """`Match exec` runs a program of the user's in every ssh, `ssh -G` included: one that leaves a child in the
    background (holding ssh's stderr) must not hold the call, and a slow one is bounded by the call's own bound,
    its whole group killed -- no sleep of it left behind."""
    use_openssh(sshfleet, "h1")
    kept = with_config(sshfleet, after='Match originalhost h1 exec "sleep 61.25 & true"\n    ServerAliveInterval 30\n')
    try:
        code, _doc, err = drover_in(sshfleet, "ls", "--host", "h1")
        assert code == 0, err
    finally:
        ssh_config(sshfleet).write_text(kept)
    wait_for(lambda: not _sleeps("61.25"), what="the background child killed with its group")
    text = sshfleet.fleet_file.read_text()  # type: ignore[attr-defined]
    sshfleet.fleet_file.write_text(text.replace("connect_timeout = 5.0", "connect_timeout = 1.0"))  # type: ignore[attr-defined]
    kept = with_config(sshfleet, after='Match originalhost h1 exec "sleep 61.5"\n    ServerAliveInterval 30\n')
    try:
        code, doc, err = drover_in(sshfleet, "ls", "--host", "h1", "--timeout", "1")
        assert code != 0 and "within 2s" in doc["errors"][0]["message"] and "Match exec" in doc["errors"][0]["hint"], doc
    finally:
        ssh_config(sshfleet).write_text(kept)
    wait_for(lambda: not _sleeps("61.5"), what="the slow Match exec killed at the bound")


def _sleeps(arg: str) -> list[str]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if cmdline[:2] == [b"sleep", arg.encode()] and state not in ("Z", "X"):
                found.append(entry)
    return found


def test_a_home_with_a_space_reaches_the_host(sshfleet: SSHFleet) -> None:
    """drover's own ControlPath lives under HOME: ssh's config parser splits `-o ControlPath=` at an unquoted
    space ("extra arguments at end of line"), so it is quoted as ssh needs."""
    import shutil

    home = sshfleet.root / "sp ace"
    shutil.rmtree(home, ignore_errors=True)
    shutil.copytree(sshfleet.client_home / ".ssh", home / ".ssh")
    use_openssh(sshfleet, "h1")
    code, doc, err = drover_in(sshfleet, "ls", "--host", "h1", home=home)
    assert code == 0, (doc, err)
    code, doc, err = drover_in(sshfleet, "fleet", "check", "--host", "h1", home=home)
    row = doc["data"]["hosts"][0]
    assert row["ok"] and row["master"] == "down" and row["control_path"].startswith(f"{home}/.ssh/drover-"), row


def test_drover_connect_removes_only_a_dead_socket_of_the_users(sshfleet: SSHFleet) -> None:
    """A ControlPath naming a file of the user's (not a socket): `drover connect` refuses, naming it, and the
    file is untouched -- only a dead master's socket is removed."""
    notes = sshfleet.root / "notes"
    notes.mkdir(exist_ok=True)
    precious = notes / "h1"
    precious.write_text("my notes\n")
    kept = with_config(sshfleet, before=f"Host h1\n    ControlPath {notes}/%n\n")
    try:
        use_openssh(sshfleet, "h1")
        code, _out, err = drover_plain(sshfleet, "connect", "h1")
        assert code != 0 and f"{precious} for h1 is not a socket" in err, err
        assert precious.read_text() == "my notes\n"
        # fleet check says what connect says, and offers no `drover connect` that would refuse.
        _code, out, err = drover_plain(sshfleet, "fleet", "check", "--host", "h1")
        assert f"{precious} for h1 is not a socket" in err and "drover connect h1" not in out + err, (out, err)
    finally:
        ssh_config(sshfleet).write_text(kept)
        close_master(sshfleet, "h1")


def test_a_remote_exit_255_is_the_remote_commands_as_over_asyncssh(sshfleet: SSHFleet) -> None:
    """ssh exits 255 when it fails itself, and passes on the remote command's 255: an interpreter that exits 255
    saying "Permission denied" (or anything else) is the login's failure to start the helper, over both
    transports -- not a missing master, not a lost connection."""
    for n, said in enumerate(("/opt/x: Permission denied", "oops")):
        fake = sshfleet.root / f"fakepy255-{n}"
        fake.write_text(f"#!/bin/sh\necho '{said}' >&2\nexit 255\n")
        fake.chmod(0o755)
        codes = {}
        for transport in ("asyncssh", "openssh"):
            use_openssh(sshfleet, *(["h1"] if transport == "openssh" else []))
            text = sshfleet.fleet_file.read_text().replace('ssh = "h1"\n', f'ssh = "h1"\npython = "{fake}"\n', 1)  # type: ignore[attr-defined]
            sshfleet.fleet_file.write_text(text)  # type: ignore[attr-defined]
            _code, doc, _err = drover(sshfleet, "ls", "--host", "h1")
            codes[transport] = doc["errors"][0]["code"]
        assert codes == {"asyncssh": "shell_failed", "openssh": "shell_failed"}, (said, codes)


def test_a_helper_that_hangs_is_not_blamed_on_a_master(sshfleet: SSHFleet) -> None:
    """The bound passes with no master in the way (the remote command hangs): the message says so rather than
    suggesting a stopped master."""
    fake = sshfleet.root / "fakepyhang"
    fake.write_text("#!/bin/sh\nexec sleep 300\n")
    fake.chmod(0o755)
    use_openssh(sshfleet, "h1")
    text = sshfleet.fleet_file.read_text().replace('ssh = "h1"\n', f'ssh = "h1"\npython = "{fake}"\n', 1)  # type: ignore[attr-defined]
    sshfleet.fleet_file.write_text(text)  # type: ignore[attr-defined]
    _code, doc, _err = drover(sshfleet, "ls", "--host", "h1", "--timeout", "2")
    error = doc["errors"][0]
    assert error["code"] == "timeout" and "hung" in error["message"] and "stopped" not in error["message"], error


def test_a_users_remote_command_does_not_replace_drovers(sshfleet: SSHFleet) -> None:
    """`RemoteCommand` in the user's config: ssh refuses it together with a command-line one ("Cannot execute
    command-line and remote command"); drover's call says RemoteCommand=none."""
    kept = with_config(sshfleet, before="Host h1\n    RemoteCommand echo hello\n")
    try:
        use_openssh(sshfleet, "h1")
        code, doc, err = drover(sshfleet, "ls", "--host", "h1")
        assert code == 0, (doc, err)
    finally:
        ssh_config(sshfleet).write_text(kept)


def test_killing_drover_ends_its_ssh(sshfleet: SSHFleet) -> None:
    """drover killed (SIGTERM, SIGHUP: no handler of its runs) while its ssh waits on a master that stopped
    answering: its ssh, in a session of its own, dies with it rather than waiting there for ever.  Ctrl-C (SIGINT)
    ends it without a "Task exception was never retrieved" traceback."""
    use_openssh(sshfleet, "h1")
    pid = open_master(sshfleet, "h1")
    path = control_path(sshfleet, "h1")
    env = {**os.environ, "HOME": str(sshfleet.client_home), "DROVER_FLEET": str(sshfleet.fleet_file)}  # type: ignore[attr-defined]
    try:
        os.kill(pid, signal.SIGSTOP)
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            proc = subprocess.Popen(
                [sys.executable, "-m", "drover", "ls", "--host", "h1", "--timeout", "30"],
                env=env,
                cwd=str(ROOT),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            try:
                wait_for(lambda: _processes_with(path), timeout=20, what="drover's ssh on the stopped master")
                proc.send_signal(sig)
                _out, err = proc.communicate(timeout=20)
            finally:
                proc.kill()
            wait_for(lambda: not _processes_with(path), timeout=10, what=f"drover's ssh gone after {sig.name}")
            assert "never retrieved" not in err and "HelperGone" not in err, err
    finally:
        close_master(sshfleet, "h1", pid)


def test_the_daemons_bound_is_the_commands_timeout(sshfleet: SSHFleet, persistent: Path) -> None:  # noqa: F811
    """Through the daemon, `--timeout 2` bounds the request as in direct mode -- not 2 s plus the fleet's
    connect_timeout (5 s here) -- also when the master it rides stopped answering."""
    use_openssh(sshfleet, "h1")
    pid = open_master(sshfleet, "h1")
    try:
        assert drover(sshfleet, "ls", "--host", "h1")[0] == 0  # runs directly and starts the daemon
        running()
        assert drover(sshfleet, "ls", "--host", "h1")[0] == 0  # through the daemon: a helper kept on the master
        os.kill(pid, signal.SIGSTOP)
        for op in (("ls", "--host", "h1"), ("status", "h1:nobody")):
            _code, doc, err = drover(sshfleet, *op, "--timeout", "2")
            error = doc["errors"][0]
            assert error["code"] == "timeout" and "within 2s" in error["message"], (op, error, err)
    finally:
        close_master(sshfleet, "h1", pid)


def test_host_key_failures_say_what_asyncssh_says(sshfleet: SSHFleet) -> None:
    """An unknown key and a changed one, over openssh: the same codes as over asyncssh, with how to check and trust
    the key (ssh-keyscan, accept_new) -- and for a changed key, the fingerprint it now presents."""
    from drover.transport.host_keys import drover_known_hosts

    unknown, changed = sshfleet.spare
    entry = 'ssh = "{addr}"\nport = {port}\nuser = "{user}"\nidentity = "{key}"\n'
    common = {"port": sshfleet.port, "user": sshfleet.user, "key": sshfleet.client_key}
    extra = f"[hosts.unk]\n{entry.format(addr=unknown, **common)}[hosts.chg]\n{entry.format(addr=changed, **common)}"
    other = "AAAAC3NzaC1lZDI1NTE5AAAAIIKuR6FjjvP1ma1gyJPFGVZaKYKMY1IbzwxKLpxgkTpW"  # a key the host does not have
    drover_known_hosts().parent.mkdir(parents=True, exist_ok=True)
    drover_known_hosts().write_text(f"[{changed}]:{sshfleet.port} ssh-ed25519 {other}\n")
    rows = {}
    for transport in ("asyncssh", "openssh"):
        use_openssh(sshfleet, extra=extra.replace("\n[", f'\ntransport = "{transport}"\n[') + f'transport = "{transport}"\n')
        _code, doc, _err = drover(sshfleet, "fleet", "check", "--host", "unk,chg")
        rows[transport] = {r["host"]: r["error"] for r in doc["data"]["hosts"]}
    for transport, errors in rows.items():
        assert errors["unk"]["code"] == "unknown_host_key", (transport, errors)
        assert f"ssh-keyscan -p {sshfleet.port} {unknown}" in errors["unk"]["hint"], (transport, errors)
        assert "accept_new" in errors["unk"]["hint"], (transport, errors)
        assert errors["chg"]["code"] == "host_key_changed", (transport, errors)
        assert "ssh-keygen -R" in errors["chg"]["hint"], (transport, errors)
    assert rows["openssh"]["chg"]["fingerprint"] == rows["asyncssh"]["chg"]["fingerprint"], rows
