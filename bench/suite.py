"""drover against its peers, from one run: every ratio of issue 11's table, with client CPU and peak memory.

Not a test: it prints numbers and asserts nothing (`bench/run` is the way in). It starts N loopback sshd hosts
(tests/support/sshfleet.py) that accept only curve25519-sha256, and writes `KexAlgorithms curve25519-sha256` into the
client's ssh config, which OpenSSH, parallel-ssh (it runs ssh) and asyncssh (drover; it reads ~/.ssh/config)
all honour: every tool pays the same key exchange, ed25519 keys on both sides. Then, R rounds, each drover run
paired with its peer's in the same round (so a neighbour's load falls on both):

  drover --help                     python -c pass
  drover send local:agent TEXT      tmux send-keys -l TEXT, then tmux send-keys Enter (two processes); cold and
                                    through the daemon
  drover send local:claude TEXT     bench/min_inbox_sender.py: the same envelope to the same inbox socket of a real
                                    idle Claude Code (offline); cold and through the daemon (bench/inbox_bench.py)
  drover send local:codex TEXT      the same `codex queue --thread ID --message=TEXT` drover runs, with the thread's
                                    env, to a real idle Codex (offline); cold and through the daemon (codex_bench.py)
  drover send h1:agent TEXT         ssh h1 'tmux send-keys -l TEXT \\; send-keys Enter'  (a fresh connection)
  the same, warm (drover daemon)    the same ssh through a warm ControlMaster
  the same, warm, transport=openssh the same ssh through the same ControlMaster (the daemon's helper rides it)
  drover ls over N hosts            parallel-ssh -p N 'python3 -I -c pass; tmux list-panes -a'; xargs -P N ssh true
  the same, warm (drover daemon)    the same parallel-ssh through warm ControlMasters
  drover log -n 20, 1M events       tail -n 40 of the truth file
  drover log --pending, 1M events   grep -c -F '"event":"accepted"' over the file (a scan of all of it)
  drover log --actor nobody, 1M     the same grep
  discovery on one host             the helper's own took_ms for `list`, with 0 and with S stale tmux sockets

Every agent is the demo agent (drover/demo_agent.py) in a tmux pane; every host also runs a shell pane.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import codex_bench  # noqa: E402
import inbox_bench  # noqa: E402
import measure  # noqa: E402
from measure import Sample, Series, run  # noqa: E402
from truthlog import generate  # noqa: E402

from tests.support.sshfleet import SSHFleet  # noqa: E402

KEX = "curve25519-sha256"
PY = sys.executable
DROVER = [PY, "-m", "drover"]  # until start() writes the console script pip would write from pyproject.toml
PIP_SCRIPT = """#!{python}
# -*- coding: utf-8 -*-
import re
import sys
from {module} import {func}
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit({func}())
"""


def snapshot(root: Path) -> tuple[str, str]:
    """(a Python that imports drover from a snapshot of HEAD, the commit): the daemon steps down whenever one of
    drover's source files changes, and in a tree others are editing that is every few seconds -- so drover runs
    from a copy nobody edits, in a venv of its own whose only other path is this venv's site-packages (its
    dependencies, without the editable install's finder, which would import the working tree again)."""
    import sysconfig

    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    src = root / "src"
    src.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "HEAD", "drover", "pyproject.toml"], capture_output=True)
    if archive.returncode != 0 or commit.returncode != 0:
        raise RuntimeError(f"cannot snapshot HEAD: {archive.stderr.decode()[-200:]}")
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
    # Bytecode, as `pip install .` writes it: without it every cold row compiled drover's modules again whenever
    # the environment says PYTHONDONTWRITEBYTECODE (~100 ms a command here), which no installed drover does.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(src / "drover")], check=True, stdout=subprocess.DEVNULL)
    venv = root / "venv"
    base = getattr(sys, "_base_executable", None) or sys.executable
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"]
    Path(purelib, "bench.pth").write_text(f"{src}\n{sysconfig.get_paths()['purelib']}\n")
    python = str(venv / "bin" / "python")
    check = subprocess.run(
        [python, "-c", "import drover, typer; print(drover.__file__)"], capture_output=True, text=True, cwd=str(root)
    )
    if not check.stdout.startswith(str(src)):
        raise RuntimeError(f"the snapshot's Python imports drover from {check.stdout.strip() or check.stderr[-200:]}")
    return python, commit.stdout.strip()


def console_script(where: Path, python: str, source: Path) -> list[str]:
    """`drover` as `pip install .` makes it, from [project.scripts] (the venv's own may predate a change there)."""
    import tomllib

    entry = tomllib.loads((source / "pyproject.toml").read_text())["project"]["scripts"]["drover"]
    module, func = entry.split(":")
    where.write_text(PIP_SCRIPT.format(python=python, module=module, func=func))
    where.chmod(0o755)
    return [str(where)]


def version(cmd: list[str]) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except OSError:
        return "?"
    return (proc.stdout or proc.stderr).strip().splitlines()[0] if (proc.stdout or proc.stderr).strip() else "?"


def chain(cmds: list[list[str]], env: dict[str, str]) -> Sample:
    """Several commands one after the other, as one sample (times summed, the largest peak)."""
    parts = [run(c, env) for c in cmds]
    return Sample(
        sum(p.wall for p in parts),
        sum(p.cpu for p in parts),
        max(p.rss_kib for p in parts),
        next((p.code for p in parts if p.code), 0),
        "".join(p.out for p in parts),
        "".join(p.err for p in parts),
    )


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rows: list[tuple[str, Series | None, str, Series | None, str]] = []
        self.notes: list[str] = []

    # -- setup ---------------------------------------------------------------------------------------------------
    def start(self) -> None:
        a = self.args
        self.fleet = SSHFleet(a.hosts, sshd_options=[f"KexAlgorithms {KEX}"]).start()
        f = self.fleet
        self.root = f.root
        cfg = f.client_home / ".ssh" / "config"
        cfg.write_text(cfg.read_text() + f"Host *\n    KexAlgorithms {KEX}\n")
        self.ssh = ["ssh", "-F", str(cfg), "-o", f"UserKnownHostsFile={f.known_hosts}"]
        self.cm = ["-o", "ControlMaster=auto", "-o", f"ControlPath={self.root}/cm-%C", "-o", "ControlPersist=300"]
        fleet_file = self.root / "fleet.toml"
        limits = "[limits]\nbucket_size = 1000000\nduplicate_window_s = 0\n"
        # h1 once more, as an openssh-transport host riding the same ControlMaster as the ssh rows (an alias with
        # that ControlPath: %C hashes the resolved endpoint, the same as h1's); untagged, so no fan-out asks it.
        h1 = f.addr("h1")
        cfg.write_text(
            f"Host h1o\n    HostName {h1}\n    Port {f.port}\n    User {f.user}\n    IdentityFile {f.client_key}\n"
            f"    ControlPath {self.root}/cm-%C\n" + cfg.read_text()
        )
        openssh = 'transport = "openssh"'
        hosts = f.fleet_toml(limits).replace('ssh = "', 'tags = ["bench"]\nssh = "') + f'[hosts.h1o]\nssh = "h1o"\n{openssh}\n'
        fleet_file.write_text(hosts)
        (self.root / "lt").mkdir()
        self.env = {
            **os.environ,
            "HOME": str(f.client_home),
            "DROVER_FLEET": str(fleet_file),
            "DROVER_HOME": str(self.root / "dh"),
            "TMUX_TMPDIR": str(self.root / "lt"),
            "DROVER_ACTOR": "bench",
            "DROVER_DAEMON": "0",  # cold: no daemon, none started for next time
        }
        for var in ("SSH_AUTH_SOCK", "TMUX", "TMUX_PANE"):
            self.env.pop(var, None)
        self.warm_env = {**self.env, "DROVER_DAEMON": "1"}
        global DROVER
        self.python, self.commit = snapshot(self.root)
        DROVER = console_script(self.root / "drover", self.python, self.root / "src")
        self.hosts_file = self.root / "hosts.txt"
        self.hosts_file.write_text("\n".join(f.names) + "\n")
        agent = f"{PY} -m drover.demo_agent --log {{log}} --name {{name}}"
        self.local = {}
        for name in ("agent", "peer"):
            cmd = agent.format(log=self.root / f"local-{name}.jsonl", name=name)
            self.local[name] = self.tmux_local(
                "new-session", "-d", "-P", "-F", "#{pane_id}", "-s", name, "-x", "160", "-y", "40", cmd
            )
        self.remote = {}
        for name in ("agent", "peer"):
            cmd = agent.format(log=self.root / f"h1-{name}.jsonl", name=name)
            proc = f.tmux("h1", "new-session", "-d", "-P", "-F", "#{pane_id}", "-s", name, "-x", "160", "-y", "40", cmd)
            self.remote[name] = proc.stdout.strip()
        for host in f.names[1:]:
            f.tmux(host, "new-session", "-d", "-s", "shell", "-x", "120", "-y", "30")
        for name in ("agent", "peer"):
            self.wait_idle(None, self.local[name])
            self.wait_idle("h1", self.remote[name])

    def tmux_local(self, *args: str) -> str:
        env = {**os.environ, "TMUX_TMPDIR": self.env["TMUX_TMPDIR"]}
        env.pop("TMUX", None)
        return subprocess.run(["tmux", *args], env=env, capture_output=True, text=True, timeout=10, cwd=ROOT).stdout.strip()

    def wait_idle(self, host: str | None, pane: str) -> None:
        """Until the demo agent in pane (local when host is None) shows its idle input box."""
        deadline = time.monotonic() + 20
        while True:
            if host is None:
                screen = self.tmux_local("capture-pane", "-p", "-t", pane)
            else:
                screen = self.fleet.tmux(host, "capture-pane", "-p", "-t", pane).stdout
            if "idle · paste" in screen:
                return
            if time.monotonic() > deadline:
                raise SystemExit("bench: the demo agent did not start in its pane")
            time.sleep(0.1)

    def stop(self) -> None:
        if not hasattr(self, "fleet"):
            return
        if hasattr(self, "warm_env"):
            run([*DROVER, "daemon", "stop"], self.warm_env, cwd=str(self.root))  # none, unless a warm row failed
        for host in self.fleet.names:  # the ControlMasters this bench opened
            subprocess.run([*self.ssh, *self.cm, "-O", "exit", host], capture_output=True, timeout=10)
        self.tmux_local("kill-server")
        self.fleet.stop()

    # -- measuring -----------------------------------------------------------------------------------------------
    def rounds(
        self, tools: dict[str, Callable[[int], Sample]], repeat: int | None = None, peak: bool = True
    ) -> dict[str, Series]:
        """R rounds; in each, every tool once, the order alternating so that neither always goes first."""
        series = {name: Series(name) for name in tools}
        names = list(tools)
        for i in range(repeat or self.args.repeat):
            for name in names if i % 2 == 0 else names[::-1]:
                sample = tools[name](i)
                if sample.code != 0:
                    print(f"  ! {name} exited {sample.code}: {(sample.err or sample.out).strip()[-300:]}", file=sys.stderr)
                series[name].samples.append(sample)
        if peak and Path(measure.GNU_TIME).exists():  # one more round, each under GNU time, for the peak memory
            measure.PEAK = True
            try:
                for name in names:
                    series[name].peak_kib = tools[name](self.args.repeat).rss_kib
            finally:
                measure.PEAK = False
        for s in series.values():
            print(
                f"  {s.label:<58} {s.wall * 1000:9.1f} ms wall {s.cpu * 1000:8.1f} ms CPU {s.rss_mb:6.0f} MB"
                + (f"  ({s.failed} failed)" if s.failed else "")
            )
        return series

    def drover(self, *args: str, env: dict[str, str] | None = None) -> Callable[[int], Sample]:
        return lambda i: run([*DROVER, *(a.replace("{i}", str(i)) for a in args)], env or self.env, cwd=str(self.root))

    def daemon(self) -> bool:
        """Start persistent mode's daemon for the warm rows, if this tree has one (False: it has not, or it failed)."""
        probe = run([*DROVER, "daemon", "--help"], self.env, cwd=str(self.root))
        if probe.code != 0 or "start" not in probe.out:
            self.notes.append("warm drover: not available (`drover daemon` does not exist in this tree yet)")
            return False
        started = run([*DROVER, "daemon", "start"], self.warm_env, cwd=str(self.root))
        if started.code != 0 or not self.daemon_status():
            self.notes.append(f"warm drover: `drover daemon start` failed: {(started.err or started.out).strip()[-200:]}")
            return False
        return True

    def daemon_status(self) -> dict[str, Any]:
        """The daemon's status ({} when none answers for this environment)."""
        status = run([*DROVER, "daemon", "status", "--json"], self.warm_env, cwd=str(self.root))
        try:
            info = json.loads(status.out)
        except ValueError:
            return {}
        return info if isinstance(info, dict) and info.get("running") else {}

    def daemon_stop(self) -> None:
        """Stop it, and wait until it is gone: a daemon still stopping would answer `start` and then vanish."""
        run([*DROVER, "daemon", "stop"], self.warm_env, cwd=str(self.root))
        deadline = time.monotonic() + 20
        while self.daemon_status() and time.monotonic() < deadline:
            time.sleep(0.2)

    def background(self, hosts: list[str]) -> tuple[list[int], list[int]]:
        """The processes that work for the warm rows but are no child of a measured command: (the daemon, the
        ControlMasters of `hosts`)."""
        daemon, masters = [], []
        pid = self.daemon_status().get("pid")
        if isinstance(pid, int):
            daemon.append(pid)
        for host in hosts:
            check = subprocess.run([*self.ssh, *self.cm, "-O", "check", host], capture_output=True, text=True, timeout=10)
            found = re.search(r"pid=([0-9]+)", check.stderr + check.stdout)
            if found:
                masters.append(int(found.group(1)))
        return daemon, masters

    def hidden_cpu(self, what: str, hosts: list[str], work: Callable[[], dict[str, Series]]) -> dict[str, Series]:
        """Run `work` (warm rounds) and note the CPU the daemon and the ControlMasters spent meanwhile, per round."""
        daemon, masters = self.background(hosts)
        before = {pid: cpu_of(pid) for pid in daemon + masters}
        served = self.daemon_status().get("served", 0)
        got = work()
        rounds = max(len(series.samples) for series in got.values()) + 1  # + the peak round
        after = self.daemon_status()
        if after.get("pid") not in daemon or after.get("served", 0) - served < rounds:
            self.notes.append(
                f"{what}: THE DAEMON DID NOT SERVE EVERY WARM RUN (pid {daemon} -> {after.get('pid')}, "
                f"{after.get('served', 0) - served} of {rounds} served): those ran cold"
            )
        spent = [sum(cpu_of(pid) - before[pid] for pid in pids) * 1000 / rounds for pids in (daemon, masters)]
        self.notes.append(
            f"{what}, CPU not in the CPU column (other processes), per round: the daemon{'' if daemon else ' (not found)'} "
            f"{spent[0]:.0f} ms, "
            f"the {len(masters)} ControlMasters {spent[1]:.0f} ms"
        )
        return got

    def help_row(self) -> None:
        print("drover --help")
        bare = [self.python, "-c", "pass"]
        first = self.drover("--help")(0)  # writes typer's text to the help cache, as the first --help of a version does
        self.notes.append(f"the first drover --help (typer's, then cached): {first.wall * 1000:.0f} ms; the rows: cached")
        tools = {"drover --help": self.drover("--help"), "python -c pass": lambda i: run(bare, self.env, cwd=str(self.root))}
        s = self.rounds(tools)
        self.rows.append(("drover --help", s["drover --help"], "python -c pass", s["python -c pass"], "<= 5x"))

    def local_send(self) -> None:
        print("local send")
        pane = self.local["peer"]
        peer = lambda i: chain(  # noqa: E731
            [["tmux", "send-keys", "-t", pane, "-l", f"peer message {i}"], ["tmux", "send-keys", "-t", pane, "Enter"]], self.env
        )
        s = self.rounds(
            {"drover send local:agent": self.drover("send", "local:agent", "bench message {i}"), "tmux send-keys x2": peer}
        )
        self.rows.append(
            ("send local:PANE, cold", s["drover send local:agent"], "tmux send-keys x2", s["tmux send-keys x2"], "<= 10x")
        )
        # After the first use a local send goes through the daemon too (it starts one): the path a user mostly sees.
        if self.daemon():
            warm = self.drover("send", "local:agent", "warm message {i}", env=self.warm_env)
            warm(0)
            s = self.hidden_cpu(
                "warm local send", [], lambda: self.rounds({"drover send local:agent (daemon)": warm, "tmux send-keys x2": peer})
            )
            self.daemon_stop()
            self.rows.append(
                (
                    "send local:PANE, warm",
                    s["drover send local:agent (daemon)"],
                    "tmux send-keys x2",
                    s["tmux send-keys x2"],
                    "<= 10x",
                )
            )

    def remote_send(self) -> None:
        print("remote send, cold")
        pane = self.remote["peer"]

        def ssh(i: int, warm: bool = False) -> Sample:
            remote = f"tmux send-keys -t {pane} -l {shlex.quote(f'peer message {i}')} \\; send-keys -t {pane} Enter"
            return run([*self.ssh, *(self.cm if warm else []), "h1", remote], self.env)

        s = self.rounds(
            {"drover send h1:agent": self.drover("send", "h1:agent", "cold message {i}"), "ssh h1 tmux send-keys": ssh}
        )
        cold_ssh = s["ssh h1 tmux send-keys"]
        self.rows.append(("send h1:PANE, cold", s["drover send h1:agent"], "ssh (fresh connection)", cold_ssh, "<= 3x"))
        print("remote send, warm")
        ssh(0, warm=True)  # opens the master
        if self.daemon():
            self.drover("send", "h1:agent", "warm-up", env=self.warm_env)(0)
            self.drover("send", "h1o:agent", "warm-up", env=self.warm_env)(0)
            tools = {
                "drover send h1:agent (daemon)": self.drover("send", "h1:agent", "warm message {i}", env=self.warm_env),
                "drover send h1o:agent (daemon, openssh)": self.drover(
                    "send", "h1o:agent", "openssh message {i}", env=self.warm_env
                ),
                "ssh h1 (ControlMaster)": lambda i: ssh(i, warm=True),
            }
            s = self.hidden_cpu("warm send", ["h1"], lambda: self.rounds(tools))
            self.daemon_stop()
            warm = s["drover send h1:agent (daemon)"]
            self.rows.append(("send h1:PANE, warm", warm, "ssh (fresh connection)", cold_ssh, "<= 0.25x"))
            self.rows.append(("send h1:PANE, warm", warm, "ssh (warm ControlMaster)", s["ssh h1 (ControlMaster)"], "<= 3x"))
            through = s["drover send h1o:agent (daemon, openssh)"]
            master = s["ssh h1 (ControlMaster)"]
            self.rows.append(("send h1:PANE, warm, openssh transport", through, "ssh (same ControlMaster)", master, "<= 3x"))
        else:
            s = self.rounds({"ssh h1 (ControlMaster)": lambda i: ssh(i, warm=True)})
            self.rows.append(("send h1:PANE, warm", None, "ssh (fresh connection)", cold_ssh, "<= 0.25x"))
            self.rows.append(("send h1:PANE, warm", None, "ssh (warm ControlMaster)", s["ssh h1 (ControlMaster)"], "<= 3x"))

    def fan_out(self) -> None:
        n = str(self.args.hosts)
        hostlist = ("\n".join(self.fleet.names) + "\n").encode()
        work = "python3 -I -c pass; tmux list-panes -a"
        pssh = ["parallel-ssh", "-p", n, "-t", "60", "-h", str(self.hosts_file)]
        have_pssh = shutil.which("parallel-ssh") is not None

        def peer(warm: bool, remote: str = work) -> Callable[[int], Sample]:
            opts = " ".join(shlex.quote(o) for o in [*self.ssh[1:], *(self.cm if warm else [])])
            if have_pssh:
                return lambda i: run([*pssh, "-x", opts, remote], self.env)
            return lambda i: run(
                ["xargs", "-P", n, "-I{}", *self.ssh, *(self.cm if warm else []), "{}", remote], self.env, stdin=hostlist
            )

        # drover ls also reads every pane's screen (one more tmux process per host): the peer that does as much.
        screens = work + " -F '#{pane_id}' | xargs -r -n 1 tmux capture-pane -p -t"

        peer_name = "parallel-ssh" if have_pssh else "xargs -P ssh (parallel-ssh is not installed)"
        ls = f"drover ls ({n} hosts)"
        print(f"ls over {n} hosts, cold")
        s = self.rounds(
            {
                ls: self.drover("ls", "--tag", "bench", "--json"),
                f"{peer_name}: {work}": peer(False),
                f"{peer_name}, + each screen": peer(False, screens),
                "xargs -P ssh HOST true": lambda i: run(
                    ["xargs", "-P", n, "-I{}", *self.ssh, "{}", "true"], self.env, stdin=hostlist
                ),
            }
        )
        self.check_ls(s[ls])
        cold_peer = s[f"{peer_name}: {work}"]
        self.rows.append((f"ls, {n} hosts, cold", s[ls], peer_name, cold_peer, "<= 1.0x"))
        with_screens = f"{peer_name}, + each screen"
        self.rows.append((f"ls, {n} hosts, cold", s[ls], with_screens, s[with_screens], "(info)"))
        self.rows.append((f"ls, {n} hosts, cold", s[ls], "xargs -P ssh HOST true", s["xargs -P ssh HOST true"], "(info)"))
        print(f"ls over {n} hosts, warm")
        peer(True)(0)  # opens the masters
        warm_peer_name = f"{peer_name} (warm ControlMasters)"
        if self.daemon():
            warm_ls = self.drover("ls", "--tag", "bench", "--json", env=self.warm_env)
            warm_ls(0)
            s = self.hidden_cpu(
                f"warm ls, {n} hosts",
                self.fleet.names,
                lambda: self.rounds({f"{ls}, daemon": warm_ls, warm_peer_name: peer(True)}),
            )
            self.daemon_stop()
            self.rows.append((f"ls, {n} hosts, warm", s[f"{ls}, daemon"], f"{peer_name} (cold)", cold_peer, "<= 0.3x"))
            self.rows.append((f"ls, {n} hosts, warm", s[f"{ls}, daemon"], warm_peer_name, s[warm_peer_name], "(info)"))
        else:
            s = self.rounds({warm_peer_name: peer(True)})
            self.rows.append((f"ls, {n} hosts, warm", None, f"{peer_name} (cold)", cold_peer, "<= 0.3x"))
            self.rows.append((f"ls, {n} hosts, warm", None, warm_peer_name, s[warm_peer_name], "(info)"))

    def check_ls(self, series: Series) -> None:
        for sample in series.ok[:1]:
            hosts = json.loads(sample.out)["data"]["hosts"]
            answered = sum(1 for h in hosts if h["ok"])
            if answered != self.args.hosts:
                self.notes.append(f"drover ls: only {answered} of {self.args.hosts} hosts answered")

    def stale(self) -> None:
        """Discovery's cost on one host (the helper's took_ms), then the fan-out, with S stale sockets per host."""
        from drover.remote import protocol as P
        from drover.transport import bundle
        from drover.transport.helper_channel import read_answer

        request = json.dumps({"helper": P.PROTOCOL, "op": "list", "args": {"state": True}, "profiles": {}}).encode() + b"\n"
        stdin = bundle.preamble() + request * 4  # one helper, four requests: the first imports, the rest are warm

        def took(first: bool) -> Callable[[int], Sample]:
            def go(i: int) -> Sample:
                sample = run([*self.ssh, *self.cm, "h1", bundle.command("python3")], self.env, stdin=stdin)
                took = [float(ms) for ms in re.findall(r'"took_ms": ?([0-9.]+)', sample.out)]
                ok = len(took) == 4 and read_answer(sample.out.encode())[0] is not None
                ms = (took[0] if first else statistics.median(took[1:])) if ok else float("nan")
                # The helper's own clock, as a Sample (wall = took_ms) so it prints like the rest.
                return Sample(ms / 1000, 0, 0, 0 if ok else 1, "", sample.err)

            return go

        print("discovery on h1: the helper's took_ms for `list` with state (1 agent, 1 peer pane), first and warm")
        tools = {"took_ms, a fresh helper": took(True), "took_ms, a live helper": took(False)}
        before = self.rounds(tools, peak=False)
        paths = [
            self.fleet.host_home(host) / "t" / f"tmux-{os.getuid()}" / f"stale-{k}"
            for host in self.fleet.names
            for k in range(self.args.stale)
        ]

        def stale(present: bool) -> None:
            for path in paths:
                if present and not path.exists():
                    path.parent.mkdir(mode=0o700, exist_ok=True)
                    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    sock.bind(str(path))
                    sock.close()  # the file stays: what a crashed tmux server leaves
                elif not present and path.exists():
                    path.unlink()

        stale(True)
        print(f"the same with {self.args.stale} stale sockets in the tmux directory")
        after = self.rounds(tools, peak=False)
        self.took = (before, after)
        n = self.args.hosts
        print(f"ls over {n} hosts, cold, with and without {self.args.stale} stale sockets on every host (paired)")
        ls = self.drover("ls", "--tag", "bench", "--json")
        with_stale, without = f"drover ls, {self.args.stale} stale sockets per host", "drover ls, none"

        def ls_with(present: bool) -> Callable[[int], Sample]:
            def go(i: int) -> Sample:
                stale(present)  # outside the measured run
                return ls(i)

            return go

        got = self.rounds({with_stale: ls_with(True), without: ls_with(False)}, peak=False)
        stale(False)
        self.stale_ls = (got[with_stale], got[without])

    def scale(self) -> None:
        """`drover ls` over --scale host entries mapped onto the fleet's addresses, next to parallel-ssh -p 64."""
        n, f = self.args.scale, self.fleet
        if not n:
            return
        addrs = [f.addr(h) for h in f.names]
        lines = ["[defaults]", "connect_timeout = 10.0", "request_timeout = 60.0", ""]
        entries = []
        for i in range(n):
            addr = addrs[i % len(addrs)]
            lines += [f"[hosts.s{i:03d}]", f'ssh = "{addr}"', f"port = {f.port}", f'user = "{f.user}"']
            lines += [f'identity = "{f.client_key}"', 'tags = ["scale"]']
            entries.append(f"{f.user}@{addr}:{f.port}")
        (self.root / "scale.toml").write_text("\n".join(lines) + "\n")
        (self.root / "scale-hosts.txt").write_text("\n".join(entries) + "\n")
        env = {**self.env, "DROVER_FLEET": str(self.root / "scale.toml")}
        work = "python3 -I -c pass; tmux list-panes -a"
        opts = " ".join(shlex.quote(o) for o in [*self.ssh[1:], "-i", str(f.client_key)])
        fds: dict[str, int] = {}

        def watched(name: str, cmd: list[str]) -> Callable[[int], Sample]:
            def go(i: int) -> Sample:
                watch = measure.FdWatch()
                sample = run(cmd, env, cwd=str(self.root), watch=watch)
                fds[name] = max(fds.get(name, 0), watch.max_fds)
                return sample

            return go

        ls, peer = f"drover ls ({n} entries, concurrency 64)", "parallel-ssh -p 64"
        pssh = ["parallel-ssh", "-p", "64", "-t", "120", "-h", str(self.root / "scale-hosts.txt"), "-x", opts, work]
        tools = {ls: watched(ls, [*DROVER, "ls", "--tag", "scale", "--json"])}
        if shutil.which("parallel-ssh"):
            tools[peer] = watched(peer, pssh)
        print(f"ls over {n} host entries on {len(addrs)} addresses, cold")
        got = self.rounds(tools, repeat=min(self.args.repeat, 2))
        answered = [sum(1 for h in json.loads(x.out)["data"]["hosts"] if h["ok"]) for x in got[ls].ok]
        self.notes.append(
            f"{n} host entries: drover held at most {fds.get(ls, 0)} descriptors open at once"
            + (f" (parallel-ssh {fds[peer]})" if peer in fds else "")
            + f"; hosts answered per run: {answered}"
        )
        self.rows.append((f"ls, {n} entries, cold", got[ls], peer, got.get(peer), "(info)"))

    def truth_log(self) -> None:
        home = Path(tempfile.mkdtemp(prefix="drover-bench-log-"))
        try:
            started = time.perf_counter()
            generate(home / "truth.jsonl", self.args.events)
            size = (home / "truth.jsonl").stat().st_size
            took = time.perf_counter() - started
            print(f"drover log -n 20 over {self.args.events:,} events ({size / 1e6:.0f} MB, written in {took:.0f} s)")
            env = {**self.env, "DROVER_HOME": str(home)}
            truth = str(home / "truth.jsonl")
            # The first filtered query that reads far builds the index beside the file (once per record): timed
            # on its own, outside the rounds, and reported as a note.
            first = run([*DROVER, "log", "--pending", "--json"], env, timeout=900, cwd=str(self.root))
            self.notes.append(
                f"the first `drover log --pending` over {self.args.events:,} events built truth.index: "
                f"{first.wall:.1f} s wall, {first.cpu:.1f} s CPU (exit {first.code}); the rows below use it"
            )
            s = self.rounds(
                {
                    "drover log -n 20": self.drover("log", "-n", "20", "--json", env=env),
                    "tail -n 40": lambda i: run(["tail", "-n", "40", truth], env),
                    "drover log --pending": self.drover("log", "--pending", "--json", env=env),
                    "drover log --actor nobody": self.drover("log", "--actor", "nobody", "--json", env=env),
                    # Counting accepted lines always matches, so grep exits 0 (with no match it exits 1).
                    "grep -c accepted": lambda i: run(["grep", "-c", "-F", '"event":"accepted"', truth], env),
                }
            )
            n = f"{self.args.events:,} events"
            target = "<= 1 s, <= 100 MB"
            self.rows.append((f"log -n 20, {n}", s["drover log -n 20"], "tail -n 40", s["tail -n 40"], target))
            # grep reads the whole file for the one thing asked: what a query without an index costs at least.
            grep = ("grep -c accepted", s["grep -c accepted"])
            self.rows.append((f"log --pending, {n}", s["drover log --pending"], *grep, target))
            self.rows.append((f"log --actor nobody, {n}", s["drover log --actor nobody"], *grep, target))
        finally:
            shutil.rmtree(home, ignore_errors=True)

    # -- report --------------------------------------------------------------------------------------------------
    def report(self, load_before: str) -> None:
        a = self.args
        print()
        print(
            f"drover bench, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {cpu_model()}, {os.cpu_count()} cores, "
            f"load average {load_before} at the start, {loadavg()} at the end"
        )
        pssh = "parallel-ssh " + ("present" if shutil.which("parallel-ssh") else "absent (xargs -P ssh instead)")
        print(
            f"Python {platform.python_version()}, {version(['ssh', '-V'])}, asyncssh {asyncssh_version()}, "
            f"{version(['tmux', '-V'])}, {pssh}"
        )
        print(f"key exchange: {KEX} for every client (the sshds accept nothing else); ed25519 host and client keys")
        print(f"drover at commit {self.commit}, run from a snapshot of it (the shared tree's edits would restart the daemon)")
        print(
            f"{a.hosts} loopback hosts; medians of {a.repeat} rounds, drover and its peer paired in each; "
            "CPU = user+sys of the client's process tree; peak = ru_maxrss, largest single process"
        )
        print()
        head = f"{'work':<26} {'drover':>24}   {'peer':<28} {'peer':>24}   {'wall':>6} {'CPU':>6}  target"
        print(head)
        print(f"{'':<26} {'wall / CPU / peak':>24}   {'':<28} {'wall / CPU / peak':>24}   {'ratio':>6} {'ratio':>6}")
        for work, mine, peer_name, peer, target in self.rows:
            mine_s = fmt(mine) if mine else "not available"
            wall_r = f"{mine.wall / peer.wall:5.2f}x" if mine and peer else "    -"
            cpu_r = f"{mine.cpu / peer.cpu:5.2f}x" if mine and peer and peer.cpu > 0 else "    -"
            verdict = judge(target, mine, peer)
            peer_s = fmt(peer) if peer else "-"
            print(f"{work:<26} {mine_s:>24}   {peer_name:<28} {peer_s:>24}   {wall_r:>6} {cpu_r:>6}  {target} {verdict}")
        before, after = self.took
        print()
        fresh, live = "took_ms, a fresh helper", "took_ms, a live helper"
        print(
            "discovery on one host, the helper's took_ms for `list` with state: "
            f"{before[fresh].wall * 1000:.1f} ms in a fresh helper (its imports included), {before[live].wall * 1000:.1f} ms in "
            f"a live one; with {a.stale} stale tmux sockets: {after[fresh].wall * 1000:.1f} and {after[live].wall * 1000:.1f} ms"
        )
        print(
            f"drover ls over {a.hosts} hosts with {a.stale} stale sockets on each: {self.stale_ls[0].wall:.2f} s; "
            f"without: {self.stale_ls[1].wall:.2f} s (paired, same rounds)"
        )
        for note in self.notes:
            print(f"note: {note}")


def cpu_of(pid: int) -> float:
    """A live process's user+sys CPU seconds so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fmt(s: Series) -> str:
    wall = f"{s.wall * 1000:.0f}ms" if s.wall < 10 else f"{s.wall:.1f}s"
    return f"{wall} / {s.cpu * 1000:.0f}ms / {s.rss_mb:.0f}MB"


def judge(target: str, mine: Series | None, peer: Series | None) -> str:
    """met / NOT met for the wall-clock target, and whether the client CPU is at most the peer's."""
    if mine is not None and mine.failed:
        # A row whose runs failed measured a failure, not drover: never "met" (a daemon that errored at once
        # once showed as a 33 ms warm send).
        return f"RUNS FAILED ({mine.failed} of {len(mine.samples)}): no verdict"
    if mine is None or peer is None or target == "(info)":
        return ""
    if target.startswith("<= 1 s"):
        ok = mine.wall <= 1.0 and mine.rss_mb <= 100
    else:
        ok = mine.wall / peer.wall <= float(target.split()[1].rstrip("x"))
        cpu_ok = mine.cpu <= peer.cpu
        return ("met" if ok else "NOT met") + ("; CPU <= peer's" if cpu_ok else "; CPU > peer's")
    return "met" if ok else "NOT met"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def asyncssh_version() -> str:
    import asyncssh

    return str(asyncssh.__version__)


def main() -> int:
    parser = argparse.ArgumentParser(prog="bench/run", description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=50, help="loopback SSH hosts for the fan-out rows (default 50)")
    parser.add_argument("--repeat", type=int, default=7, help="rounds per comparison (default 7)")
    parser.add_argument("--events", type=int, default=1_000_000, help="events in the truth file for `log` (default 1,000,000)")
    parser.add_argument("--stale", type=int, default=20, help="stale tmux sockets per host for the discovery rows (default 20)")
    parser.add_argument("--scale", type=int, help="host entries for the scale row (default 500, 40 with --quick; 0: none)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 4 hosts, 2 rounds, 20,000 events, 40 entries")
    args = parser.parse_args()
    if args.quick:
        args.hosts, args.repeat, args.events = 4, 2, 20_000
    if args.scale is None:
        args.scale = 40 if args.quick else 500
    if args.hosts < 2 or args.repeat < 1 or args.events < 2 or args.stale < 0 or args.scale < 0:
        parser.error("--hosts must be at least 2, --repeat at least 1, --events at least 2, --stale and --scale at least 0")
    if os.geteuid() != 0:
        parser.error("the loopback sshd fleet needs root (it listens on 127.0.0.x and sets each host's environment)")
    if args.hosts > 200:
        parser.error("--hosts: at most 200 (one loopback address each, 127.0.0.11 up); --scale maps more entries onto them")
    missing = [tool for tool in ("tmux", "ssh", "sshd") if not shutil.which(tool) and not Path(f"/usr/sbin/{tool}").exists()]
    if missing:
        parser.error(f"not installed: {', '.join(missing)} (apt-get install tmux openssh-client openssh-server)")
    load_before = loadavg()
    bench = Bench(args)
    try:
        bench.start()
        bench.help_row()
        bench.local_send()
        inbox_bench.rows(bench, DROVER)
        codex_bench.rows(bench, DROVER)
        bench.remote_send()
        bench.fan_out()
        bench.stale()
        bench.scale()
        bench.truth_log()
        bench.report(load_before)
    finally:
        bench.stop()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit("bench: interrupted")
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        sys.exit(f"bench: {exc}")
