"""`transport = "openssh"`: drover's calls through the system ssh and the user's own config, against the real sshd
fleet (key logins; the second-factor host is tests/test_openssh_otp.py).  Same answers as asyncssh, bounds that
hold with a master that never answers, and the traps of riding a master."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import ROOT, remote_agent, wait_for
from tests.support.sshfleet import SSHFleet

HARD_BOUND_S = 40
MASTER_KEYS = {"transport", "master", "control_path", "connect"}  # what fleet check adds for openssh hosts
BROADCAST_ID = re.compile(
    r"bc_[0-9a-f]+"
)  # connect 3 s + request 3 s, Python's start, a loaded machine: a hang fails, slowness does not


def use_openssh(fleet: SSHFleet, *hosts: str, extra: str = "") -> None:
    """The fleet file with `transport = "openssh"` for `hosts`."""
    text = fleet.fleet_toml(extra)
    for host in hosts:
        text = text.replace(f'ssh = "{host}"\n', f'ssh = "{host}"\ntransport = "openssh"\n', 1)
    fleet.fleet_file.write_text(text, encoding="utf-8")  # type: ignore[attr-defined]


def ssh_config(fleet: SSHFleet) -> Path:
    return fleet.client_home / ".ssh" / "config"


def ssh(fleet: SSHFleet, *args: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    """The user's own ssh, as they would type it (their config, their known_hosts)."""
    return subprocess.run(
        ["ssh", "-F", str(ssh_config(fleet)), "-o", f"UserKnownHostsFile={fleet.known_hosts}", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def drover(fleet: SSHFleet, *args: str) -> tuple[int, Any, str]:
    """drover as a real process under a hard bound: a hang fails the test."""
    env = {**os.environ, "HOME": str(fleet.client_home), "DROVER_FLEET": str(fleet.fleet_file)}  # type: ignore[attr-defined]
    proc = subprocess.run(
        [sys.executable, "-m", "drover", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=HARD_BOUND_S,
        env=env,
        cwd=str(ROOT),
        stdin=subprocess.DEVNULL,
    )
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else None, proc.stderr


def control_path(fleet: SSHFleet, host: str) -> str:
    from drover.fleet import load
    from drover.transport.openssh_config import OpenSSHCommand

    fleet_doc, _ = load(fleet.fleet_file)  # type: ignore[attr-defined]
    return OpenSSHCommand(host, fleet_doc.host(host), 5).control_path()


def open_master(fleet: SSHFleet, host: str) -> int:
    """A master for a key-login host, opened as the user would (`-f`: in the background); its pid."""
    path = control_path(fleet, host)
    done = ssh(fleet, "-M", "-f", "-N", "-o", "ControlPersist=120", "-o", f"ControlPath={path}", host)
    assert done.returncode == 0, done.stderr
    check = ssh(fleet, "-o", f"ControlPath={path}", "-O", "check", host)
    return int(re.search(r"pid=(\d+)", check.stderr).group(1))  # type: ignore[union-attr]


def close_master(fleet: SSHFleet, host: str, pid: int | None = None) -> None:
    if pid is not None:
        for sig in (signal.SIGCONT, signal.SIGTERM):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                break
    ssh(fleet, "-o", f"ControlPath={control_path(fleet, host)}", "-O", "exit", host)


def _stable(doc: Any) -> Any:
    """An op's data without what differs from one run to the next (timings, ids, clocks)."""
    volatile = {"rtt_ms", "connect_ms", "at", "id", "msg_id", "seconds", "took_ms", "waited_s", "ts", "sent_at", "created"}
    volatile |= {"since", "screen", "tail", "lines", "last_lines"}
    # What the session did last moves between the two rounds (the first round's send is its newest entry).
    volatile |= {"last_progress", "progress", "evidence"}
    if isinstance(doc, dict):
        return {k: _stable(v) for k, v in doc.items() if k not in volatile and k not in MASTER_KEYS}
    if isinstance(doc, list):
        return [_stable(v) for v in doc]
    return doc


def test_both_transports_give_the_same_answers(sshfleet: SSHFleet, isolated: Path, cli: Any) -> None:
    """ls, status, send (paste lane), read, wait, broadcast and fleet check over asyncssh, then over the system ssh
    (no master: key logins need none), on the same hosts: the same data."""
    panes = {h: remote_agent(sshfleet, h, "agent", isolated) for h in ("h1", "h2")}
    answers: dict[str, list[Any]] = {}
    for transport, tag in (("asyncssh", "run-a"), ("openssh", "run-o")):
        use_openssh(sshfleet, *(["h1", "h2", "h3"] if transport == "openssh" else []))
        runs = [
            cli("ls", "--json"),
            cli("status", "h1:agent", "--json"),
            cli("--actor", "tester", "send", "h2:agent", f"over {tag}", "--json"),
            cli("read", "h2:agent", "--json"),
            cli("wait", "h1:agent", "--until", "idle", "--timeout", "10", "--json"),
            cli("--actor", "tester", "broadcast", f"hello all over {tag}", "--host", "h1,h2", "--json"),
            cli("fleet", "check", "--host", "h1,h2,h3", "--json"),
        ]
        for res in runs:
            assert res.code == 0, (transport, res.err, res.out)
        # The texts sent name their transport: that is the one difference allowed.
        answers[transport] = [_stable(json.loads(BROADCAST_ID.sub("bc_", r.out.replace(tag, "T")))["data"]) for r in runs]
        wait_for(lambda: any(f"over {tag}" in m for m in panes["h2"].messages()), what=f"the send over {transport}")  # noqa: B023
    # fleet check says, for each openssh host, that no master is up (key logins need none) and how to open one.
    rows = json.loads(runs[-1].out)["data"]["hosts"]
    assert [(r["transport"], r["master"]) for r in rows] == [("openssh", "down")] * 3
    template = str(sshfleet.client_home / ".ssh" / "drover-%C")
    # The printed command is exactly what `drover connect` runs: BatchMode=no over the config's `BatchMode yes`.
    words = shlex.split(rows[0]["connect"])
    assert words[:2] == ["ssh", "-F"] and words[-2:] == ["h1", "true"], words
    assert {"-M", "ControlPersist=8h", "BatchMode=no", f"ControlPath={template}", "RemoteCommand=none"} <= set(words)
    assert re.fullmatch(re.escape(template).replace("%C", "[0-9a-f]{40}"), rows[0]["control_path"]), rows[0]
    sent = answers["openssh"][2]
    assert sent["outcome"] == "delivered" and sent["host"] == "h2"
    for name, a, o in zip(("ls", "status", "send", "read", "wait", "broadcast", "check"), *answers.values(), strict=True):
        if name == "read":  # what the screen shows: the second run's screen holds the first send too
            assert set(a) == set(o)
            continue
        assert a == o, (
            name,
            [(x, y) for x, y in zip(json.dumps(a).split(","), json.dumps(o).split(","), strict=False) if x != y],
        )


def test_a_master_that_never_answers_is_bounded_and_named(sshfleet: SSHFleet) -> None:
    """A master stopped with SIGSTOP accepts on its socket and never replies: ConnectTimeout does not cover that.
    The call ends at its bound with the whole ssh process group killed, and fleet check names the master."""
    use_openssh(sshfleet, "h1")
    text = sshfleet.fleet_file.read_text()  # type: ignore[attr-defined]
    text = text.replace("connect_timeout = 5.0\nrequest_timeout = 20.0", "connect_timeout = 2.0\nrequest_timeout = 2.0")
    sshfleet.fleet_file.write_text(text)  # type: ignore[attr-defined]
    pid = open_master(sshfleet, "h1")
    try:
        code, doc, err = drover(sshfleet, "ls", "--host", "h1")
        assert code == 0, err  # through the master, while it answers
        os.kill(pid, signal.SIGSTOP)
        code, doc, _err = drover(sshfleet, "ls", "--host", "h1")
        assert code != 0, doc
        error = doc["errors"][0]
        assert error["code"] == "timeout" and "master" in error["message"], error
        # `drover connect` refuses to open another while this one holds the socket: the hint says to end it.
        assert "kill its process" in error["hint"], error
        # The pgrep the hint gives finds the master: a ControlPersist one shows as `ssh: SOCKET [mux]`.
        pgrep = re.search(r"`(pgrep -af [^`]+)` finds it", error["hint"]).group(1)  # type: ignore[union-attr]
        found = subprocess.run(pgrep, shell=True, capture_output=True, text=True).stdout
        assert str(pid) in found.split(), (pgrep, found)
        # Every ssh drover started is gone (its process group killed at the bound): none is left on the socket.
        path = control_path(sshfleet, "h1")
        assert not _processes_with(path), "an ssh of drover's outlived its bound"
        code, doc, _err = drover(sshfleet, "fleet", "check", "--host", "h1")
        row = doc["data"]["hosts"][0]
        assert row["master"] == "not answering" and "drover connect" not in row.get("connect", "x")
        # Only the master failed: the row says no step past it worked (not AUTH yes, SHELL yes, PYTHON NO).
        assert row["reachable"] is False and row["auth"] is None and row["shell"] is None, row
        human = drover_plain(sshfleet, "fleet", "check", "--host", "h1")[2]
        assert "does not answer" in human and "kill its process (`pgrep -af" in human, human
    finally:
        close_master(sshfleet, "h1", pid)


def _processes_with(text: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if text.encode() in cmdline and b"-o ControlMaster=no" in cmdline and state not in ("Z", "X"):
                pids.append(int(entry))
    return pids


def test_the_users_controlmaster_auto_is_ridden_never_started_by_drover(sshfleet: SSHFleet) -> None:
    """The user's `ControlMaster auto` + `ControlPersist`: drover rides their master when one is up and never starts
    one itself -- a master forked by drover's ssh would outlive the call holding what it inherited, and would not
    be the user's."""
    config = ssh_config(sshfleet)
    kept = config.read_text()
    user_path = f"{sshfleet.root}/cm-%C"
    config.write_text(f"Host h1\n    ControlMaster auto\n    ControlPersist 60\n    ControlPath {user_path}\n" + kept)
    try:
        use_openssh(sshfleet, "h1")
        assert control_path(sshfleet, "h1").startswith(f"{sshfleet.root}/cm-")  # the user's, expanded by ssh
        code, _doc, err = drover(sshfleet, "ls", "--host", "h1")
        assert code == 0, err
        check = ssh(sshfleet, "-O", "check", "h1")
        assert check.returncode != 0, f"drover's call left a master behind: {check.stderr}"
        # With the user's master up, drover's calls ride it: sshd sees no new connection.
        pid = open_master(sshfleet, "h1")
        try:
            mark = sshfleet.log_mark()
            for _ in range(2):
                assert drover(sshfleet, "ls", "--host", "h1")[0] == 0
            assert sshfleet.connections(mark)["h1"] == 0
        finally:
            close_master(sshfleet, "h1", pid)
    finally:
        config.write_text(kept)


def test_a_stale_socket_is_named_and_drover_connect_replaces_it(sshfleet: SSHFleet) -> None:
    """A master that died leaves its socket: fleet check says `stale`, and `drover connect` removes it first (ssh -M
    would otherwise refuse the path and open a master nobody can reach)."""
    use_openssh(sshfleet, "h1")
    from drover.fleet import load
    from drover.transport.openssh_config import OpenSSHCommand

    doc, _ = load(sshfleet.fleet_file)  # type: ignore[attr-defined]
    path = OpenSSHCommand("h1", doc.host("h1"), 5).control_socket()
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(path)
    dead.close()  # the file stays, with nobody listening: a master killed with SIGKILL
    try:
        _code, doc, _err = drover(sshfleet, "fleet", "check", "--host", "h1")
        assert doc["data"]["hosts"][0]["master"] == "stale"
        code, _out, err = drover_plain(sshfleet, "connect", "h1")
        assert code == 0 and "the master for h1 is up" in err, err
        _code, doc, _err = drover(sshfleet, "fleet", "check", "--host", "h1")
        assert doc["data"]["hosts"][0]["master"] == "up"
        code, _out, err = drover_plain(sshfleet, "connect", "h1")
        assert code == 0 and "already up" in err, err
    finally:
        close_master(sshfleet, "h1")
        Path(path).unlink(missing_ok=True)


def drover_plain(fleet: SSHFleet, *args: str) -> tuple[int, str, str]:
    env = {**os.environ, "HOME": str(fleet.client_home), "DROVER_FLEET": str(fleet.fleet_file)}  # type: ignore[attr-defined]
    proc = subprocess.run(
        [sys.executable, "-m", "drover", *args],
        capture_output=True,
        text=True,
        timeout=HARD_BOUND_S,
        env=env,
        cwd=str(ROOT),
        stdin=subprocess.DEVNULL,
    )
    return proc.returncode, proc.stdout, proc.stderr


def test_a_control_path_too_long_for_a_socket_is_never_used(sshfleet: SSHFleet, monkeypatch: Any) -> None:
    """ssh binds the master's socket at the path plus 17 bytes before renaming it: a ControlPath within 17 bytes of
    the socket limit fails only when the master is opened.  drover uses a short one of its own and says why."""
    from drover.transport import openssh_config
    from drover.transport.openssh_master import describe

    config = ssh_config(sshfleet)
    kept = config.read_text()
    long_dir = sshfleet.root / ("d" * 60)
    config.write_text(f"Host h1\n    ControlPath {long_dir}/%C\n" + kept)
    try:
        use_openssh(sshfleet, "h1")
        from drover.fleet import load

        doc, _ = load(sshfleet.fleet_file)  # type: ignore[attr-defined]
        command = openssh_config.OpenSSHCommand("h1", doc.host("h1"), 5)
        assert command.user_control_path() and len(command.user_control_path() or "") + 17 >= 104
        assert command.control_path() == str(sshfleet.client_home / ".ssh" / "drover-%C")
        row = asyncio.run(describe(command, 5))
        assert "over the socket limit" in row["control_path_note"] and len(row["control_path"]) + 17 < 104, row
        assert drover(sshfleet, "ls", "--host", "h1")[0] == 0
    finally:
        config.write_text(kept)
    # A home too deep for drover's own default: a private directory under /tmp instead.
    deep = sshfleet.root / ("h" * 80)
    deep.mkdir(exist_ok=True)
    monkeypatch.setenv("HOME", str(deep))
    path = openssh_config.drover_control_path()
    assert path == f"/tmp/drover-ssh-{os.getuid()}/%C" and openssh_config.socket_fits(path.replace("%C", "c" * 40))


def test_ssh_failures_and_the_remote_commands_own_are_told_apart(sshfleet: SSHFleet) -> None:
    """Exit 255 is ssh's own failure (here: a host key nobody trusts), anything else the remote command's (here:
    no such interpreter, 127): each named as over asyncssh."""
    extra = (
        f'[hosts.nokey]\nssh = "{sshfleet.spare[0]}"\nport = {sshfleet.port}\nuser = "{sshfleet.user}"\n'
        f'identity = "{sshfleet.client_key}"\ntransport = "openssh"\n'
    )
    use_openssh(sshfleet, "h1", extra=extra)
    text = sshfleet.fleet_file.read_text().replace('ssh = "h1"\n', 'ssh = "h1"\npython = "python9"\n', 1)  # type: ignore[attr-defined]
    sshfleet.fleet_file.write_text(text)  # type: ignore[attr-defined]
    _code, doc, _err = drover(sshfleet, "fleet", "check", "--host", "h1,nokey")
    rows = {r["host"]: r for r in doc["data"]["hosts"]}
    assert rows["h1"]["error"]["code"] == "python_missing" and rows["h1"]["shell"] is True, rows["h1"]
    assert rows["nokey"]["error"]["code"] == "unknown_host_key" and rows["nokey"]["host_key"] is False, rows["nokey"]


def test_both_transports_trust_the_same_host_keys(sshfleet: SSHFleet, isolated: Path) -> None:
    """drover's own known_hosts is passed to ssh: a key only drover trusts is trusted over either transport;
    accept_new records where asyncssh records; `StrictHostKeyChecking no` in the user's config is not obeyed."""
    from drover.transport.host_keys import drover_known_hosts

    trusted, fresh = sshfleet.spare
    entry = 'ssh = "{addr}"\nport = {port}\nuser = "{user}"\nidentity = "{key}"\ntransport = "openssh"\n'
    common = {"port": sshfleet.port, "user": sshfleet.user, "key": sshfleet.client_key}
    extra = f"[hosts.mine]\n{entry.format(addr=trusted, **common)}[hosts.new]\n{entry.format(addr=fresh, **common)}"
    use_openssh(sshfleet, extra=extra)
    key = sshfleet.host_key_line.split()
    drover_known_hosts().parent.mkdir(parents=True, exist_ok=True)
    drover_known_hosts().write_text(f"[{trusted}]:{sshfleet.port} {key[0]} {key[1]}\n")
    config = ssh_config(sshfleet)
    kept = config.read_text()
    config.write_text(f"Host {fresh}\n    StrictHostKeyChecking no\n" + kept)
    try:
        _code, doc, _err = drover(sshfleet, "fleet", "check", "--host", "mine,new")
        rows = {r["host"]: r for r in doc["data"]["hosts"]}
        assert rows["mine"]["ok"], rows["mine"]
        assert rows["new"]["error"]["code"] == "unknown_host_key", rows["new"]
        # accept_new: trusted on first use, recorded in drover's known_hosts -- where the asyncssh transport looks.
        text = sshfleet.fleet_file.read_text()  # type: ignore[attr-defined]
        sshfleet.fleet_file.write_text(text.replace(f'ssh = "{fresh}"\n', f'ssh = "{fresh}"\naccept_new = true\n'))  # type: ignore[attr-defined]
        _code, doc, _err = drover(sshfleet, "fleet", "check", "--host", "new")
        assert doc["data"]["hosts"][0]["ok"], doc
        assert f"[{fresh}]:{sshfleet.port}" in drover_known_hosts().read_text()
    finally:
        config.write_text(kept)
    sshfleet.fleet_file.write_text(sshfleet.fleet_file.read_text().replace('transport = "openssh"\n', ""))  # type: ignore[attr-defined]
    _code, doc, _err = drover(sshfleet, "fleet", "check", "--host", "mine,new")
    assert all(r["ok"] for r in doc["data"]["hosts"]), doc  # and asyncssh agrees on both


def test_what_an_ssh_leaves_holding_its_pipes_never_holds_a_call() -> None:
    """An ssh whose child outlives it holding stdout and stderr (a master forked under ControlPersist, a
    ProxyCommand): the answer is read up to its frame, the exit status is not waited for through the pipes, and the
    whole group is killed -- a communicate() would wait until the child ended (here: 300 s, the test's bound)."""
    from drover.remote.main import frame
    from drover.transport.openssh import SSHProcess

    answer = frame({"helper": 2, "ok": True, "data": "hi"})
    script = f"sleep 300 & printf %s {shlex.quote(answer.decode())}; exit 0"

    async def run() -> tuple[Any, int | None, list[int]]:
        proc = await SSHProcess.start(["sh", "-c", script])
        got = await asyncio.wait_for(proc.answer(), 20)
        status = await proc.status(20)
        group = [int(p) for p in os.listdir("/proc") if p.isdigit() and _pgid(int(p)) == proc.proc.pid]
        await asyncio.wait_for(proc.reap(), 20)
        return got, status, group

    got, status, group = asyncio.run(asyncio.wait_for(run(), 60))
    assert got[0]["data"] == "hi" and status == 0
    assert group, "the background child was not in ssh's group: this test tests nothing"
    wait_for(lambda: all(_pgid(p) is None for p in group), what="the group killed")


def _pgid(pid: int) -> int | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[2])


def test_drover_connect_refuses_what_has_no_master_to_open(sshfleet: SSHFleet, cli: Any) -> None:
    """`drover connect` on an asyncssh host (which would not ride the master) or on `local` is a usage error that
    says what to set; `--print` shows the command without running it."""
    refused = cli("connect", "h1")
    assert refused.code == 2 and 'transport = "openssh"' in refused.err and "[hosts.h1]" in refused.err, refused
    assert cli("connect", "local").code == 2
    use_openssh(sshfleet, "h1")
    printed = cli("connect", "h1", "--print")
    words = shlex.split(printed.out.strip())
    assert printed.code == 0 and words[-2:] == ["h1", "true"], printed
    assert "ControlPath=" + str(sshfleet.client_home / ".ssh" / "drover-%C") in words and "BatchMode=no" in words
    assert ssh(sshfleet, "-o", f"ControlPath={control_path(sshfleet, 'h1')}", "-O", "check", "h1").returncode != 0
