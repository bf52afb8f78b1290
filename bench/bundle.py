"""What one request costs the remote side: bytes shipped on stdin and the interpreter's cold start, measured.

Compares the bundle (drover/transport/bundle.py) with the single-file helper it replaced (read from git, commit
7af030d, when the history is there), each run the way sshd runs it (`sh -c COMMAND`, stdin from a pipe), for a
`classify` request (no host work: what is measured is starting the remote side), under each Python found.
Prints medians; asserts nothing.

    python bench/bundle.py [--runs 20]
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from drover.remote import protocol as P  # noqa: E402
from drover.transport import bundle  # noqa: E402

OLD_COMMIT = "7af030d"
OLD_BOOTSTRAP = (
    "import sys\n"
    "if sys.version_info < (3, 8): sys.exit(97)\n"
    "s = sys.stdin.buffer; n = int(s.readline()); g = {'__name__': 'drover_helper'}\n"
    "exec(compile(s.read(n), 'drover-helper', 'exec'), g); sys.exit(g['main']())"
)


def old_helper() -> bytes | None:
    proc = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{OLD_COMMIT}:drover/remote/helper.py"], capture_output=True, timeout=10
    )
    return proc.stdout if proc.returncode == 0 else None


def timed(argv: list[str], stdin: bytes, runs: int) -> float:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        proc = subprocess.run(argv, input=stdin, capture_output=True, timeout=60)
        samples.append(time.perf_counter() - started)
        if proc.returncode != 0 or not proc.stdout:
            raise SystemExit(f"{argv[:3]} failed: {proc.stderr.decode()[-300:]}")
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()

    new_request = (
        json.dumps({"helper": P.PROTOCOL, "op": "classify", "args": {"engine": "claude", "screen": ""}}).encode() + b"\n"
    )
    new_stdin = bundle.preamble() + new_request
    old = old_helper()
    old_request = json.dumps({"helper": 1, "op": "classify", "args": {"engine": "claude", "screen": ""}}).encode()
    old_stdin = str(len(old)).encode() + b"\n" + old + old_request if old else b""

    print(f"bytes on stdin per request: bundle {len(new_stdin):,}", end="")
    print(f"  ·  single-file helper {len(old_stdin):,} ({len(old_stdin) / len(new_stdin):.1f}x)" if old else "")
    print(f"bootstrap command: {len(bundle.command('python3'))} bytes, one line")
    print()
    print(f"{'python':<10} {'bundle cold start':>18} {'old helper':>12} {'python -c pass':>16}")
    pythons = ["/usr/bin/python3", *sorted(str(p) for p in Path("/root/.pyenv/versions").glob("3.*/bin/python3"))]
    for python in pythons:
        if not shutil.which(python):
            continue
        version = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True)
        label = version.stdout.decode().strip()
        major_minor = tuple(int(x) for x in label.split("."))
        new = timed(["sh", "-c", bundle.command(python)], new_stdin, args.runs)
        bare = timed([python, "-c", "print(1)"], b"", args.runs)
        old_s = "-"
        if old and major_minor >= (3, 8):
            cmd = f"exec {shlex.quote(python)} -I -c {shlex.quote(OLD_BOOTSTRAP)}"
            old_s = f"{timed(['sh', '-c', cmd], old_stdin, args.runs) * 1000:.1f} ms"
        print(f"{label:<10} {new * 1000:>15.1f} ms {old_s:>12} {bare * 1000:>13.1f} ms")
    print(f"\n(medians of {args.runs}; the request is `classify` of an empty screen: the cost of starting the remote side)")


if __name__ == "__main__":
    main()
