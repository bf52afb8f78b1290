"""Scale: `drover ls` over 500 hosts (simulated on loopback) with bounded file descriptors, memory and concurrency,
and a host that never answers costing the fan-out its timeout once.

500 host entries of one fleet file map onto the 16 addresses (two sshd processes) of a fleet of our own. drover runs
as a real process; the test samples its /proc/PID/fd and VmHWM while it works. No assertion on wall time: the
bounds are counted (descriptors, megabytes, connections, answers), and a hang fails the subprocess's timeout.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from drover.errors import ExitCode
from tests.conftest import ROOT, Tmux, wait_for
from tests.support.sshfleet import SSHD, SSHFleet

HOSTS = 500
CONCURRENCY = 24
# Descriptors drover holds whatever the fleet's size: stdio, the event loop's selector and self-pipe, the truth
# file, the fleet file, /dev/urandom... Measured at about 10; the bound leaves room without admitting one per host.
BASELINE_FDS = 30
MAX_RSS_MB = 150  # measured 66 MB with 500 hosts
HARD_BOUND_S = 240  # a hang fails here; the run itself takes a few tens of seconds on 2 loaded cores


class Blackhole:
    """A TCP listener that accepts and never says a word, counting the connections it was offered."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)

    def close(self) -> None:
        for conn in self.conns:
            conn.close()
        self.sock.close()


class Sampler:
    """Samples a process's open descriptors and memory high-water mark until it exits."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.max_fds = 0
        self.hwm_kib = 0
        self.samples = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            try:
                fds = len(os.listdir(f"/proc/{self.pid}/fd"))
                status = Path(f"/proc/{self.pid}/status").read_text()
            except OSError:
                return
            if "\nState:\tZ" in status:
                return
            for line in status.splitlines():
                if line.startswith("VmHWM:"):
                    self.hwm_kib = max(self.hwm_kib, int(line.split()[1]))
            self.max_fds = max(self.max_fds, fds)
            self.samples += 1
            time.sleep(0.01)


@pytest.fixture(scope="module")
def big_fleet() -> Iterator[SSHFleet]:
    if not Path(SSHD).exists():
        pytest.fail("openssh-server is not installed: the README's test command installs it")
    fleet = SSHFleet(16).start()
    yield fleet
    fleet.stop()


def fleet_file(
    fleet: SSHFleet, path: Path, hole: Blackhole | None, hosts: int = HOSTS, concurrency: int = CONCURRENCY
) -> list[str]:
    """Entries n001..nNNN, round-robin over the fleet's 16 addresses, and `slow`, a host that never answers."""
    names = [f"n{i:03d}" for i in range(1, hosts + 1)]
    lines = [
        "[defaults]",
        "connect_timeout = 4.0",
        "request_timeout = 60.0",
        f"concurrency = {concurrency}",
        "",
    ]
    for i, name in enumerate(names):
        addr = fleet.addr(fleet.names[i % len(fleet.names)])
        lines += [
            f"[hosts.{name}]",
            f'ssh = "{addr}"',
            f"port = {fleet.port}",
            f'user = "{fleet.user}"',
            f'identity = "{fleet.client_key}"',
            'tags = ["scale"]',
        ]
    if hole is not None:
        lines += ["[hosts.slow]", 'ssh = "127.0.0.1"', f"port = {hole.port}", 'tags = ["scale"]']
    path.write_text("\n".join(lines) + "\n")
    return names


def drover(
    fleet: SSHFleet, isolated: Path, *args: str, nofile: int | None = None
) -> tuple[subprocess.Popen[bytes], bytes, bytes, Sampler]:
    """drover as a real process (no daemon), watched by a Sampler until it exits; `nofile`: its descriptor limit."""
    limit = None if nofile is None else lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    env = {
        **os.environ,
        "HOME": str(fleet.client_home),
        "DROVER_FLEET": str(isolated / "fleet.toml"),
        "DROVER_HOME": str(isolated / "dh"),
        "DROVER_DAEMON": "0",
    }
    env.pop("SSH_AUTH_SOCK", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "drover", *args, "--json"],
        env=env,
        cwd=str(ROOT),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=limit,
    )
    sampler = Sampler(proc.pid)
    try:
        out, err = proc.communicate(timeout=HARD_BOUND_S)
    finally:
        proc.kill()
    sampler.thread.join(5)
    return proc, out, err, sampler


def test_fleet_check_past_the_bound_still_reports_each_hosts_connect_time(big_fleet: SSHFleet, isolated: Path) -> None:
    """Each host's connection closes when its work is done (more hosts than `concurrency`), yet the connect time it
    took is still in its row; and never more than `concurrency` connections were open."""
    names = fleet_file(big_fleet, isolated / "fleet.toml", None, hosts=40, concurrency=4)
    proc, out, err, sampler = drover(big_fleet, isolated, "fleet", "check", "--tag", "scale")
    assert proc.returncode == 0, err.decode()[-2000:]
    rows = json.loads(out)["data"]["hosts"]
    assert sorted(r["host"] for r in rows) == names
    assert all(r["ok"] and isinstance(r["connect_ms"], float) and r["connect_ms"] > 0 for r in rows), rows
    assert sampler.max_fds <= BASELINE_FDS + 4, f"{sampler.max_fds} descriptors open at once"


def test_hosts_behind_a_bastion_go_through_proxyjump_within_the_bound(big_fleet: SSHFleet, isolated: Path) -> None:
    """Past one network, hosts are reached SSH's own way: 30 hosts through the jump host h2 (each its own tunnel, as
    OpenSSH's ProxyJump makes), at most `concurrency` of them at once -- two descriptors each, tunnel included."""
    names = fleet_file(big_fleet, isolated / "fleet.toml", None, hosts=30, concurrency=4)
    text = (isolated / "fleet.toml").read_text().replace('tags = ["scale"]', 'tags = ["scale"]\nproxy_jump = "h2"')
    (isolated / "fleet.toml").write_text(text)
    proc, out, err, sampler = drover(big_fleet, isolated, "ls", "--tag", "scale")
    assert proc.returncode == 0, err.decode()[-2000:]
    rows = json.loads(out)["data"]["hosts"]
    assert sorted(r["host"] for r in rows if r["ok"]) == names
    assert sampler.max_fds <= BASELINE_FDS + 2 * 4, f"{sampler.max_fds} descriptors open at once"
    # The jump is really taken: h1 forwards nothing, so through it every host fails, each with its own row.
    (isolated / "fleet.toml").write_text(text.replace('proxy_jump = "h2"', 'proxy_jump = "h1"'))
    proc, out, err, sampler = drover(big_fleet, isolated, "ls", "--tag", "scale")
    assert proc.returncode == 5, err.decode()[-2000:]
    assert sorted(e["host"] for e in json.loads(out)["errors"] if "via h1" in e["message"]) == names


def test_a_concurrency_beyond_the_descriptor_limit_is_clamped_to_it(big_fleet: SSHFleet, isolated: Path) -> None:
    """concurrency = 1000 in the fleet file, a process allowed 96 descriptors, 100 hosts: every host answers (none
    is lost to 'too many open files') and the limit holds."""
    names = fleet_file(big_fleet, isolated / "fleet.toml", None, hosts=100, concurrency=1000)
    proc, out, err, sampler = drover(big_fleet, isolated, "ls", "--tag", "scale", nofile=96)
    assert proc.returncode == 0, (err.decode()[-1000:], out.decode()[-1000:])
    rows = json.loads(out)["data"]["hosts"]
    assert sorted(r["host"] for r in rows if r["ok"]) == names
    assert sampler.max_fds <= 96


def test_ls_over_500_hosts_holds_at_most_concurrency_connections_and_a_dead_host_once(
    big_fleet: SSHFleet, isolated: Path
) -> None:
    hole = Blackhole()
    try:
        names = fleet_file(big_fleet, isolated / "fleet.toml", hole)
        proc, out, err, sampler = drover(big_fleet, isolated, "ls", "--tag", "scale")
    finally:
        hole.close()

    print(f"{HOSTS} hosts: at most {sampler.max_fds} descriptors, peak RSS {sampler.hwm_kib / 1024:.0f} MB")
    assert proc.returncode == ExitCode.PARTIAL, err.decode()[-2000:]
    doc: dict[str, Any] = json.loads(out)
    rows = {row["host"]: row["ok"] for row in doc["data"]["hosts"]}
    # Every host answered, but the one that cannot.
    assert sorted(h for h, ok in rows.items() if ok) == names
    assert [(e["host"], e["code"]) for e in doc["errors"]] == [("slow", "connect_timeout")]
    # The dead host cost one connection attempt: it timed out once, not once per host or per retry.
    assert len(hole.conns) == 1
    # Bounded while it ran: one socket per host at work, never one per host of the fleet.
    assert sampler.samples > 10, "the sampler saw too little of the run to say anything"
    assert sampler.max_fds <= BASELINE_FDS + CONCURRENCY, f"{sampler.max_fds} descriptors open at once"
    assert sampler.hwm_kib / 1024 <= MAX_RSS_MB, f"peak RSS {sampler.hwm_kib / 1024:.0f} MB"


def test_a_listing_reads_each_servers_screens_in_one_tmux_process(tmux: Tmux, monkeypatch: pytest.MonkeyPatch) -> None:
    """ls and status cost one tmux process per server for the listing and one for every screen, not one per pane;
    each screen is exactly what capture-pane alone shows; a pane gone mid-listing is its own error, not another's."""
    from drover.remote import tmux as remote_tmux
    from drover.remote.protocol import HelperError

    panes = [tmux.start(f"s{i}", f"printf 'this is pane {i}\\n'; exec sleep 600") for i in range(4)]
    wait_for(lambda: all(f"this is pane {i}" in pane.screen() for i, pane in enumerate(panes)))
    calls: list[str] = []
    real = remote_tmux.tmux

    def counted(socket: str, args: list[str], *rest: Any, **kw: Any) -> str:
        calls.append(args[0])
        return real(socket, args, *rest, **kw)

    monkeypatch.setattr(remote_tmux, "tmux", counted)
    listed = remote_tmux.list_panes([])
    by_session = {p["session_name"]: p for p in listed}
    assert sorted(by_session) == ["s0", "s1", "s2", "s3"]
    screens = {name: remote_tmux.screen(p["socket"], p["pane_id"]) for name, p in by_session.items()}
    assert calls == ["list-panes", "display-message"]  # the listing, then every screen in one sequence
    for name, p in by_session.items():
        assert f"this is pane {name[1]}" in screens[name]
        assert screens[name] == real(p["socket"], ["capture-pane", "-p", "-t", p["pane_id"]])

    # A pane that dies between the listing and its screen: the others still get theirs, it gets its own error.
    listed = remote_tmux.list_panes([])
    by_session = {p["session_name"]: p for p in listed}
    panes[1].tmux("kill-session", "-t", "s1")
    assert "this is pane 2" in remote_tmux.screen(by_session["s2"]["socket"], by_session["s2"]["pane_id"])
    with pytest.raises(HelperError):
        remote_tmux.screen(by_session["s1"]["socket"], by_session["s1"]["pane_id"])


def test_engine_detection_reads_a_panes_process_tree_not_the_whole_machine(tmux: Tmux) -> None:
    """Where the kernel lists each thread's children, a look at a pane reads that pane's process tree and nothing
    else; what it finds is what a scan of every process finds, for every process on the machine."""
    from drover.remote import procs
    from drover.remote.profiles import merge_profiles

    if not procs.children_listed():
        pytest.skip("this kernel does not list /proc/PID/task/TID/children (CONFIG_PROC_CHILDREN)")
    profiles = merge_profiles(None)
    agent = tmux.agent("deep")
    shell = tmux.start("nested", "sh -c 'sleep 600; true'")

    def root(pane: Any) -> int:
        return int(pane.tmux("display-message", "-p", "-t", pane.id, "#{pane_pid}").strip())

    wait_for(lambda: procs.proc_table(scan=True).children(root(shell)), what="sleep under the pane's sh")
    full = procs.proc_table(scan=True)
    lazy = procs.proc_table()
    # Every process of this test's tmux server (others' come and go on a shared machine between two looks).
    ours, queue = [], [int(agent.tmux("display-message", "-p", "#{pid}").strip())]
    while queue:
        ours.append(queue.pop())
        queue += full.children(ours[-1])
    assert len(ours) >= 4  # the server, the agent, sh, sleep
    for pid in ours:
        assert procs.detect_engine(pid, lazy, profiles) == procs.detect_engine(pid, full, profiles), pid
    assert procs.detect_engine(root(agent), procs.proc_table(), profiles) == ("demo", agent.pid)
    one = procs.proc_table()
    assert procs.detect_engine(root(shell), one, profiles) == ("shell", root(shell))
    assert 0 < len(one) <= 3 < len(full)  # sh and sleep, not the machine


def test_the_daemon_keeps_at_most_its_descriptor_bound_of_hosts_connected(big_fleet: SSHFleet, isolated: Path) -> None:
    """A daemon allowed 120 descriptors (hard limit too, so it cannot raise it) keeps at most (120 - 64) / 2 = 28
    hosts connected: `ls` over 60 hosts through it, twice, answers every host both times; the least recently used
    connections are closed as new hosts come, and the daemon never holds more descriptors than it may."""
    names = fleet_file(big_fleet, isolated / "fleet.toml", None, hosts=60, concurrency=8)
    run = Path(tempfile.mkdtemp(prefix="drd-"))
    env = {
        **os.environ,
        "HOME": str(big_fleet.client_home),
        "DROVER_FLEET": str(isolated / "fleet.toml"),
        "DROVER_HOME": str(isolated / "dh"),
        "DROVER_DAEMON": "1",
        "XDG_RUNTIME_DIR": str(run),
    }
    env.pop("SSH_AUTH_SOCK", None)

    def drover_d(*args: str, nofile: int | None = None) -> subprocess.CompletedProcess[str]:
        limit = None if nofile is None else lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
        return subprocess.run(
            [sys.executable, "-m", "drover", *args],
            env=env,
            cwd=str(ROOT),
            capture_output=True,
            text=True,
            timeout=120,
            preexec_fn=limit,
        )

    assert drover_d("daemon", "start", nofile=120).returncode == 0
    try:
        pid = json.loads(drover_d("daemon", "status", "--json").stdout)["pid"]
        sampler = Sampler(pid)
        for _ in range(2):
            res = drover_d("ls", "--tag", "scale", "--json")
            assert res.returncode == 0, res.stderr[-2000:]
            assert sorted(r["host"] for r in json.loads(res.stdout)["data"]["hosts"] if r["ok"]) == names
        info = json.loads(drover_d("daemon", "status", "--json").stdout)
        assert info["max_links"] == 28 and len(info["hosts"]) <= 28, (info["max_links"], len(info["hosts"]))
        assert info["evicted"] >= 60 - 28, info["evicted"]
        assert info["served"] >= 2 and sampler.max_fds <= 120, sampler.max_fds
    finally:
        drover_d("daemon", "stop")
