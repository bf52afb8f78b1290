"""Fan-out benchmark: `drover ls` across N loopback SSH hosts, next to OpenSSH and parallel-ssh in the same run.

Not a test: it prints numbers and ratios, and asserts nothing. It starts its own sshd (tests/support/sshfleet.py) with
N hosts on 127.0.0.11.., accepting only curve25519-sha256 (OpenSSH's default post-quantum exchange costs more than
asyncssh's curve25519, which flattered drover), then times, R times each, with the same ~/.ssh/config and keys:

  drover        python -m drover ls --tag bench --json        (one connection per host, the helper run there)
  openssh       xargs -P N ssh HOST true                       (connect, auth, run `true`)
  parallel-ssh  parallel-ssh -p N -h HOSTS true                (the pssh package; skipped if not installed)

Wall time and client CPU (user+sys of the command and everything it waited for) are medians over R runs.

    python bench/fanout.py --hosts 16 --repeat 5

bench/run is the whole comparison (sends, warm paths, the truth file, scale), from one run.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.sshfleet import SSHFleet  # noqa: E402


def timed(cmd: list[str], env: dict[str, str], stdin: str | None = None) -> tuple[float, float, int]:
    """(wall seconds, client CPU seconds, exit code) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, input=stdin, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        print(f"  ! {cmd[0]} exited {proc.returncode}: {proc.stderr.strip()[-300:]}", file=sys.stderr)
    return wall, cpu, proc.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, default=16, help="number of loopback SSH hosts (default 16)")
    parser.add_argument("--repeat", type=int, default=5, help="runs per tool (default 5)")
    args = parser.parse_args()

    fleet = SSHFleet(args.hosts, sshd_options=["KexAlgorithms curve25519-sha256"]).start()
    try:
        ssh_cfg = fleet.client_home / ".ssh" / "config"
        ssh_cfg.write_text(ssh_cfg.read_text() + "Host *\n    KexAlgorithms curve25519-sha256\n")  # ssh and asyncssh
        fleet_file = fleet.root / "fleet.toml"
        fleet_file.write_text(fleet.fleet_toml().replace('ssh = "', 'tags = ["bench"]\nssh = "'))
        env = {
            **os.environ,
            "HOME": str(fleet.client_home),
            "DROVER_FLEET": str(fleet_file),
            "DROVER_HOME": str(fleet.root / "dh"),
            "DROVER_DAEMON": "0",  # cold, as the peers are
        }
        env.pop("SSH_AUTH_SOCK", None)
        ssh_opts = ["-F", str(ssh_cfg), "-o", f"UserKnownHostsFile={fleet.known_hosts}"]
        hostlist = "\n".join(fleet.names) + "\n"
        hosts_file = fleet.root / "hosts.txt"
        hosts_file.write_text(hostlist)
        n = str(args.hosts)

        tools: dict[str, tuple[list[str], str | None]] = {
            "drover ls": ([sys.executable, "-m", "drover", "ls", "--tag", "bench", "--json"], None),
            "openssh (xargs -P)": (["xargs", "-P", n, "-I{}", "ssh", *ssh_opts, "{}", "true"], hostlist),
        }
        if shutil.which("parallel-ssh"):
            tools["parallel-ssh"] = (["parallel-ssh", "-p", n, "-h", str(hosts_file), "-x", " ".join(ssh_opts), "true"], None)
        else:
            print("parallel-ssh is not installed (apt-get install pssh): its row is skipped")

        # One warm-up run each, so that no tool pays for cold page caches on the others' behalf.
        for cmd, stdin in tools.values():
            timed(cmd, env, stdin)
        results: dict[str, tuple[float, float]] = {}
        for name, (cmd, stdin) in tools.items():
            runs = [timed(cmd, env, stdin) for _ in range(args.repeat)]
            failures = sum(1 for r in runs if r[2] != 0)
            if failures:
                print(f"  ! {name}: {failures}/{args.repeat} runs failed")
            results[name] = (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs))

        base_wall, base_cpu = results["openssh (xargs -P)"]
        print(f"\nfan-out to {args.hosts} loopback hosts, median of {args.repeat} runs (ratios: vs openssh)")
        print(f"{'tool':<22}{'wall':>10}{'client CPU':>13}{'wall ratio':>12}{'CPU ratio':>11}")
        for name, (wall, cpu) in results.items():
            print(f"{name:<22}{wall * 1000:>8.0f}ms{cpu * 1000:>11.0f}ms{wall / base_wall:>11.2f}x{cpu / base_cpu:>10.2f}x")
    finally:
        fleet.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
