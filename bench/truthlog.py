"""Truth-file benchmark: `drover log` over a large record, as a real process.

Not a test: it prints numbers and asserts nothing.  It writes a truth file of N events (default 1,000,000:
accepted/outcome pairs to 40 targets from 5 actors over the last 30 days, with a few pending messages) into a
temporary DROVER_HOME, then runs, as separate processes, R times each:

  log -n 20           python -m drover log -n 20 --json          (the newest 20: read from the end)
  log --since 1h      python -m drover log --since 1h --json     (a time window: stops at the window's start)
  log show OLD        python -m drover log show ID --json        (a message from the first hour of the file)
  log --pending, first  the same, once, with no index yet        (it builds truth.index beside the file)
  log --pending       python -m drover log --pending --json      (the newest 50 of the 1 in 997 left pending)
  log --actor nobody  python -m drover log --actor nobody --json (no match: answered by the index)
  log --actor coordinator, --target agent-07, --target nobody    (a common and a rare filter)
  log -n 20, empty    the same command on an empty record        (the floor: interpreter, imports, the CLI)

and prints the median wall time and the peak RSS of each (ru_maxrss of that child, from os.wait4; the last line
is resource.getrusage(RUSAGE_CHILDREN), the peak over every child).

    python bench/truthlog.py                      # 1,000,000 events
    python bench/truthlog.py --events 200000 --repeat 5 --keep
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def generate(path: Path, events: int) -> str:
    """Write `events` events (pairs of accepted + outcome); return the id of a message from the first hour."""
    now = time.time()
    pairs = events // 2
    start = now - 30 * 86400
    step = (now - 3600 - start) / max(1, pairs)  # the last hour holds a burst, so --since 1h has something
    targets = [f"box-{i % 4}:agent-{i:02d}" for i in range(40)]
    actors = ["alice@ci", "bob@laptop", "coordinator", "nudger@cron", "carol@desk"]
    old_id = ""
    with open(path, "w", encoding="utf-8") as f:
        buf: list[str] = []
        for n in range(pairs):
            ts = start + n * step if n < pairs - 200 else now - 3600 + (n - pairs + 200) * 15
            msg_id = f"msg_{int(ts * 1000):012x}{n & 0xFFFFFFFFFF:010x}"
            if n == 10:
                old_id = msg_id
            host, target = targets[n % 40].split(":")
            text = f"message {n}: rebase on master, the schema landed; run the suite and report back " * (1 + n % 3)
            buf.append(
                json.dumps(
                    {
                        "v": 1,
                        "event": "accepted",
                        "id": msg_id,
                        "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + ".000Z",
                        "ts": ts,
                        "actor": actors[n % 5],
                        "host": host,
                        "target": target,
                        "text_chars": len(text),
                        "text_sha256": hashlib.sha256(text.encode()).hexdigest(),
                        "options": {"via": None, "expect_engine": None, "as_owner": False},
                        "text": text,
                    },
                    separators=(",", ":"),
                )
            )
            if n % 997 == 0:
                continue  # pending: accepted, no outcome
            outcome = "refused" if n % 50 == 0 else "delivered"
            buf.append(
                json.dumps(
                    {
                        "v": 1,
                        "event": "outcome",
                        "id": msg_id,
                        "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts + 0.4)) + ".400Z",
                        "ts": ts + 0.4,
                        "outcome": outcome,
                        "lane": "tmux",
                        "detail": "pasted and submitted into an idle pane",
                        "session": {"id": "%7", "server": "default", "name": target, "engine": "claude", "pid": 4242},
                    },
                    separators=(",", ":"),
                )
            )
            if len(buf) >= 20000:
                f.write("\n".join(buf) + "\n")
                buf.clear()
        if buf:
            f.write("\n".join(buf) + "\n")
    os.chmod(path, 0o600)
    return old_id


def run(cmd: list[str], env: dict[str, str]) -> tuple[float, int, int, bytes]:
    """(wall seconds, peak RSS in KiB, exit code, stdout) of one child."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(ROOT))
    out, err = proc.stdout.read(), proc.stderr.read()  # type: ignore[union-attr]
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        print(f"  ! {' '.join(cmd[-4:])} exited {proc.returncode}: {err.decode(errors='replace')[-300:]}", file=sys.stderr)
    return wall, usage.ru_maxrss, proc.returncode, out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="events in the truth file (default 1,000,000)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per command (default 3)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary DROVER_HOME and print its path")
    parser.add_argument("--only", help="run only the commands whose label contains this")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="drover-bench-"))
    home = tmp / "home"
    home.mkdir(mode=0o700)
    try:
        t0 = time.perf_counter()
        old_id = generate(home / "truth.jsonl", args.events)
        size = (home / "truth.jsonl").stat().st_size
        print(f"truth file: {args.events:,} events, {size / 1e6:.0f} MB, written in {time.perf_counter() - t0:.1f}s")
        (tmp / "fleet.toml").write_text("")  # an empty fleet: `--target` reads it to tell HOST:ID from an id
        env = {**os.environ, "DROVER_HOME": str(home), "DROVER_FLEET": str(tmp / "fleet.toml"), "PYTHONPATH": str(ROOT)}
        env["DROVER_DAEMON"] = "0"  # each run its own process, start to end: no daemon answers or is started
        py = [sys.executable]
        commands = [
            ("log -n 20", [*py, "-m", "drover", "log", "-n", "20", "--json"]),
            ("log --since 1h", [*py, "-m", "drover", "log", "--since", "1h", "--json"]),
            ("log show OLD", [*py, "-m", "drover", "log", "show", old_id, "--json"]),
            ("log --pending, first", [*py, "-m", "drover", "log", "--pending", "--json"]),
            ("log --pending", [*py, "-m", "drover", "log", "--pending", "--json"]),
            ("log --actor nobody", [*py, "-m", "drover", "log", "--actor", "nobody", "--json"]),
            ("log --actor coordinator", [*py, "-m", "drover", "log", "--actor", "coordinator", "--json"]),
            ("log --target agent-07", [*py, "-m", "drover", "log", "--target", "agent-07", "--json"]),
            ("log --target nobody", [*py, "-m", "drover", "log", "--target", "nobody", "--json"]),
            ("log -n 20, empty", [*py, "-m", "drover", "log", "-n", "20", "--json"]),
        ]
        print(f"{'command':<24} {'wall (median)':>14} {'peak RSS':>10}  answer")
        for label, cmd in commands:
            if args.only and args.only not in label:
                continue
            walls, rss, answer = [], 0, ""
            run_env = {**env, "DROVER_HOME": str(tmp / "empty")} if label.endswith("empty") else env
            once = label.endswith("first")
            if once:
                (home / "truth.index").unlink(missing_ok=True)  # a record nobody queried by filter yet
            for _ in range(1 if once else args.repeat):
                wall, maxrss, code, out = run(cmd, run_env)
                walls.append(wall)
                rss = max(rss, maxrss)
                if code == 0 and out.strip():
                    data = json.loads(out)["data"]
                    answer = f"{len(data['messages'])} messages" if "messages" in data else f"{data['message']['id']}"
            print(f"{label:<24} {statistics.median(walls):>12.3f} s {rss / 1024:>7.0f} MB  {answer}")
        total = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        print(f"peak RSS of any child (getrusage RUSAGE_CHILDREN): {total / 1024:.0f} MB")
    finally:
        if args.keep:
            print(f"kept: DROVER_HOME={home}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
