"""drover over SSH: a real OpenSSH sshd on loopback serving three hosts with distinct state, and its faults."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import drover
from tests.conftest import ROOT, helper_pids, remote_agent, stays, wait_for
from tests.support.sshfleet import SSHFleet, free_port, keygen


def add_hosts(fleet: SSHFleet, text: str) -> None:
    fleet.fleet_file.write_text(fleet.fleet_toml(text), encoding="utf-8")  # type: ignore[attr-defined]


def test_ls_across_three_hosts_lists_each_hosts_own_panes(sshfleet: SSHFleet, isolated: Path, cli: Any) -> None:
    for host in sshfleet.names:
        remote_agent(sshfleet, host, f"agent-{host}", isolated)
    res = cli("ls", "--json")
    assert res.code == 0, res.err
    data = res.json()["data"]
    seen = sorted((s["host"], s["name"], s["engine"], s["state"]) for s in data["sessions"])
    assert seen == [(h, f"agent-{h}", "demo", "idle") for h in sshfleet.names]  # local has no panes in this test
    assert {h["host"]: h["ok"] for h in data["hosts"]} == {"local": True, "h1": True, "h2": True, "h3": True}
    human = cli("ls", "--host", "h2")
    assert "agent-h2" in human.out and "agent-h1" not in human.out


def test_send_to_host_two_arrives_there_and_nowhere_else(sshfleet: SSHFleet, isolated: Path, cli: Any) -> None:
    panes = {h: remote_agent(sshfleet, h, "agent", isolated) for h in sshfleet.names}
    res = cli("--actor", "tester", "send", "h2:agent", "only for h2", "--json")
    assert res.code == 0, res.err
    data = res.json()["data"]
    assert data["outcome"] == "delivered" and data["host"] == "h2"
    wait_for(panes["h2"].messages)
    assert panes["h2"].messages() == [
        '<cross-session-message from-name="drover (tester)" from-mode="prompting">\nonly for h2\n</cross-session-message>'
    ]
    stays(lambda: panes["h1"].messages() == [] and panes["h3"].messages() == [], what="h1 and h3 receiving nothing")
    log = cli("log", "--json").json()["data"]["messages"]
    assert [(m["host"], m["target"], m["outcome"]) for m in log] == [("h2", "agent", "delivered")]
    st = cli("status", "h3:agent", "--json")
    assert st.code == 0 and st.json()["data"]["session"]["host"] == "h3"
    op = cli("op", "sessions.message", json.dumps({"host": "h1", "id": "agent", "text": "via op"}))
    assert op.code == 0 and op.json()["data"]["outcome"] == "delivered"
    wait_for(panes["h1"].messages)


def test_helper_leaves_no_files_on_the_host(sshfleet: SSHFleet, cli: Any) -> None:
    before = sorted(p.name for p in sshfleet.host_home("h1").iterdir())
    assert cli("ls", "--host", "h1").code == 0
    assert sorted(p.name for p in sshfleet.host_home("h1").iterdir()) == before


class Blackhole:
    """A TCP listener that accepts and never says a word: an SSH client waits for a banner that never comes."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)

    def close(self) -> None:
        for c in self.conns:
            c.close()
        self.sock.close()


@pytest.fixture
def broken_hosts(sshfleet: SSHFleet, isolated: Path) -> Any:
    hole = Blackhole()
    other_key = isolated / "other_key"
    keygen(other_key, "not-authorized")
    wrong_hostkey = isolated / "wrong_hostkey"
    fake = keygen(wrong_hostkey, "impostor").split()
    wrong_known = isolated / "wrong_known_hosts"
    wrong_known.write_text(f"[{sshfleet.spare[1]}]:{sshfleet.port} {fake[0]} {fake[1]}\n")
    user, port, key = sshfleet.user, sshfleet.port, sshfleet.client_key
    common = f'user = "{user}"\nport = {port}\nidentity = "{key}"\nconnect_timeout = 2.0\n'
    add_hosts(
        sshfleet,
        f'[hosts.closed]\nssh = "127.0.0.1"\nport = {free_port()}\nconnect_timeout = 2.0\n'
        f'[hosts.silent]\nssh = "127.0.0.1"\nport = {hole.port}\nconnect_timeout = 2.0\n'
        f'[hosts.stranger]\nssh = "{sshfleet.spare[0]}"\n{common}'
        f'[hosts.impostor]\nssh = "{sshfleet.spare[1]}"\n{common}known_hosts = "{wrong_known}"\n'
        f'[hosts.badauth]\nssh = "{sshfleet.addr("h1")}"\nuser = "{user}"\nport = {port}\nidentity = "{other_key}"\n'
        f'[hosts.nopython]\nssh = "h3"\npython = "python3-nope"\n',
    )
    yield hole
    hole.close()


EXPECTED = {
    "closed": "connection_refused",
    "silent": "connect_timeout",
    "stranger": "unknown_host_key",
    "impostor": "host_key_changed",
    "badauth": "auth_failed",
    "nopython": "python_missing",
}


def test_each_fault_is_a_bounded_per_host_error_while_the_others_answer(
    broken_hosts: Any, sshfleet: SSHFleet, isolated: Path, cli: Any
) -> None:
    remote_agent(sshfleet, "h1", "survivor", isolated)
    started = time.monotonic()
    res = cli("ls", "--json")
    elapsed = time.monotonic() - started
    assert res.code == 8, res.err  # some hosts failed, some answered
    doc = res.json()
    errors = {e["host"]: e for e in doc["errors"]}
    assert {h: e["code"] for h, e in errors.items()} == EXPECTED
    assert [s["name"] for s in doc["data"]["sessions"] if s["host"] == "h1"] == ["survivor"]
    assert elapsed < 15, f"a broken host held up the fan-out for {elapsed:.1f}s"
    assert "SHA256:" in errors["stranger"]["message"] and "ssh-keyscan -p" in errors["stranger"]["hint"]
    assert "HOST KEY CHANGED" in errors["impostor"]["message"] and "ssh-keygen -R" in errors["impostor"]["hint"]
    assert "python3-nope" in errors["nopython"]["message"]
    human = cli("ls")
    assert human.code == 8
    assert "survivor" in human.out
    for host in EXPECTED:
        assert f"drover: {host}: " in human.err


def test_fleet_check_names_the_broken_hosts(broken_hosts: Any, sshfleet: SSHFleet, cli: Any) -> None:
    res = cli("fleet", "check", "--json")
    assert res.code == 8
    rows = {r["host"]: r for r in res.json()["data"]["hosts"]}
    assert set(rows) == {"local", "h1", "h2", "h3", *EXPECTED}
    for host in ("local", "h1", "h2", "h3"):
        assert rows[host]["ok"] and rows[host]["python"] and rows[host]["tmux"] and rows[host]["rtt_ms"] is not None
    assert (rows["closed"]["reachable"], rows["closed"]["host_key"]) == (False, None)
    assert (rows["impostor"]["reachable"], rows["impostor"]["host_key"], rows["impostor"]["auth"]) == (True, False, None)
    assert (rows["badauth"]["host_key"], rows["badauth"]["auth"]) == (True, False)
    assert (rows["nopython"]["auth"], rows["nopython"]["python"]) == (True, False), rows["nopython"]
    human = cli("fleet", "check")
    lines = human.out.splitlines()
    assert len([ln for ln in lines if ln.split() and ln.split()[0] in rows]) == len(rows)
    assert "failed the check: " in human.err
    for host in EXPECTED:
        assert host in human.err


def test_unknown_host_key_is_refused_unless_accept_new(sshfleet: SSHFleet, isolated: Path, cli: Any) -> None:
    common = f'user = "{sshfleet.user}"\nport = {sshfleet.port}\nidentity = "{sshfleet.client_key}"\n'
    add_hosts(sshfleet, f'[hosts.newbox]\nssh = "{sshfleet.spare[0]}"\n{common}')
    res = cli("ls", "--host", "newbox")
    assert res.code == 5 and "unknown host key" in res.err
    add_hosts(sshfleet, f'[hosts.newbox]\nssh = "{sshfleet.spare[0]}"\n{common}accept_new = true\n')
    res = cli("ls", "--host", "newbox")
    assert res.code == 0, res.err
    recorded = (isolated / "config" / "drover" / "known_hosts").read_text()
    assert f"[{sshfleet.spare[0]}]:{sshfleet.port} ssh-ed25519 " in recorded
    # Now known: trusted without accept_new.
    add_hosts(sshfleet, f'[hosts.newbox]\nssh = "{sshfleet.spare[0]}"\n{common}')
    assert cli("ls", "--host", "newbox").code == 0


def test_connection_killed_mid_send_is_failed_never_delivered(sshfleet: SSHFleet, isolated: Path) -> None:
    from drover.remote.tmux_lane import PaneLock

    pane = remote_agent(sshfleet, "h2", "agent", isolated)
    socket = Path(sshfleet.host_env("h2")["TMUX_TMPDIR"]) / f"tmux-{os.getuid()}" / "default"
    # Helpers already on h2 (an earlier test's daemon or library pool, until its idle exit) are not this send's.
    others = set(helper_pids("h2"))
    with PaneLock(str(socket), pane.id, 0):  # another sender holds the pane: the delivery waits there, mid-request
        proc = subprocess.Popen(
            [sys.executable, "-m", "drover", "send", "h2:agent", "cut off", "--json"],
            cwd=str(ROOT),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for(lambda: drover.run("messages.list", {}).data["messages"], what="the accepted event")
        helpers = wait_for(lambda: sorted(set(helper_pids("h2")) - others), what="the delivering helper to run on h2")
        sshd_session = int(Path(f"/proc/{helpers[0]}/stat").read_text().rsplit(")", 1)[1].split()[1])
        os.kill(sshd_session, signal.SIGKILL)  # the SSH connection dies under the request
        for pid in helpers:
            os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 5, err
    data = json.loads(out)["data"]
    assert data["outcome"] == "failed" and data["code"] == "connection_lost" and data.get("indeterminate") is True
    msgs = drover.run("messages.list", {}).data["messages"]
    assert [(m["host"], m["outcome"], m["code"]) for m in msgs] == [("h2", "failed", "connection_lost")]
    stays(lambda: pane.messages() == [], what="nothing pasted")


def test_proxy_jump_goes_through_the_jump_host(sshfleet: SSHFleet, isolated: Path, cli: Any) -> None:
    remote_agent(sshfleet, "h3", "far-away", isolated)
    add_hosts(
        sshfleet,
        '[hosts.via-h2]\nssh = "h3"\nproxy_jump = "h2"\n[hosts.via-h1]\nssh = "h3"\nproxy_jump = "h1"\nconnect_timeout = 3.0\n',
    )
    res = cli("ls", "--host", "via-h2", "--json")
    assert res.code == 0, res.err
    assert [s["name"] for s in res.json()["data"]["sessions"]] == ["far-away"]
    # h1 refuses to forward TCP, so a jump through it must fail -- proof that the jump is really taken
    res = cli("ls", "--host", "via-h1", "--json")
    assert res.code == 5
    error = res.json()["errors"][0]
    assert error["host"] == "via-h1" and "via h1" in error["message"]


def test_auth_through_the_ssh_agent(sshfleet: SSHFleet, isolated: Path, cli: Any, monkeypatch: Any) -> None:
    home = isolated / "agent-home"
    (home / ".ssh").mkdir(parents=True)
    shutil.copy(sshfleet.known_hosts, home / ".ssh" / "known_hosts")  # no keys in this HOME: only the agent has one
    sock = isolated / "agent.sock"
    out = subprocess.run(["ssh-agent", "-a", str(sock)], capture_output=True, text=True, check=True).stdout
    agent_pid = int(out.split("SSH_AGENT_PID=")[1].split(";")[0])
    try:
        env = {**os.environ, "SSH_AUTH_SOCK": str(sock)}
        subprocess.run(["ssh-add", "-q", str(sshfleet.client_key)], env=env, check=True, capture_output=True)
        monkeypatch.setenv("HOME", str(home))
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        add_hosts(sshfleet, f'[hosts.agented]\nssh = "{sshfleet.addr("h1")}"\nport = {sshfleet.port}\nuser = "{sshfleet.user}"\n')
        res = cli("ls", "--host", "agented", "--json")
        assert res.code == 0, res.err
    finally:
        os.kill(agent_pid, signal.SIGTERM)
    wait_for(lambda: not sock.exists(), what="the agent to go")
    res = cli("ls", "--host", "agented", "--json")
    assert res.code == 5 and res.json()["errors"][0]["code"] == "auth_failed"  # it was the agent that let us in


def test_remote_without_tmux_says_so(sshfleet: SSHFleet, isolated: Path, cli: Any) -> None:
    known = isolated / "bare_known_hosts"
    key = sshfleet.host_key_line.split()
    known.write_text(f"[{sshfleet.bare}]:{sshfleet.port} {key[0]} {key[1]}\n")
    add_hosts(
        sshfleet,
        f'[hosts.bare]\nssh = "{sshfleet.bare}"\nport = {sshfleet.port}\nuser = "{sshfleet.user}"\n'
        f'identity = "{sshfleet.client_key}"\nknown_hosts = "{known}"\npython = "{sys.executable}"\n',
    )
    res = cli("ls", "--host", "bare", "--json")
    assert res.code == 0, res.err
    assert [w["message"] for w in res.json()["data"]["warnings"]] == [
        "tmux is not installed on this host, so no tmux panes are listed"
    ]
    res = cli("send", "bare:anything", "hello")
    assert res.code == 6 and "tmux is not installed on this host" in res.err
    row = cli("fleet", "check", "--host", "bare", "--json").json()["data"]["hosts"][0]
    assert row["ok"] and row["tmux"] is None


def test_agent_and_x11_forwarding_are_never_requested(sshfleet: SSHFleet, isolated: Path, cli: Any, monkeypatch: Any) -> None:
    """~/.ssh/config asks for both; the helper on the host must get neither (a forwarded agent is a way back in)."""
    config = sshfleet.client_home / ".ssh" / "config"
    original = config.read_text()
    sock = isolated / "fwd-agent.sock"
    out = subprocess.run(["ssh-agent", "-a", str(sock)], capture_output=True, text=True, check=True).stdout
    agent_pid = int(out.split("SSH_AGENT_PID=")[1].split(";")[0])
    try:
        config.write_text("Host *\n    ForwardAgent yes\n    ForwardX11 yes\n    ForwardX11Trusted yes\n\n" + original)
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        monkeypatch.setenv("DISPLAY", ":0")
        res = cli("fleet", "check", "--host", "h1", "--json")
        assert res.code == 0, res.err
        row = res.json()["data"]["hosts"][0]
        assert row["forwarded"] == {"agent": False, "x11": False}, row
    finally:
        config.write_text(original)
        os.kill(agent_pid, signal.SIGTERM)


def test_a_missing_identity_file_and_a_bad_jump_host_are_named(sshfleet: SSHFleet, isolated: Path, cli: Any) -> None:
    add_hosts(sshfleet, f'[hosts.nokey]\nssh = "h1"\nidentity = "{isolated}/no-such-key"\n')
    res = cli("ls", "--host", "nokey", "--json")
    error = res.json()["errors"][0]
    assert (res.code, error["code"]) == (5, "identity_missing") and "no-such-key" in error["message"], res.out
    add_hosts(sshfleet, '[hosts.jumpy]\nssh = "h1"\nproxy_jump = "no-such-jump-host.invalid"\n')
    res = cli("fleet", "check", "--host", "jumpy", "--json")
    row = res.json()["data"]["hosts"][0]
    assert row["error"]["code"] == "proxy_jump_failed" and "jump host" in row["error"]["message"], row
