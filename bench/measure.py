"""Running a command as a measured child: wall time, client CPU and peak memory, from one os.wait4.

CPU is the child's user+sys time including every descendant it waited for (xargs's and parallel-ssh's ssh
processes, drover's tmux); peak memory is ru_maxrss of that tree, i.e. the largest single process in it, not
the sum. Nothing on the far side of an SSH connection (sshd, the helper) is a child, so none of it is counted.

The peak is taken in a run of its own under GNU time (`PEAK = True`): Linux keeps the high-water mark of the
memory a process had before exec, so a child forked by this (large) Python would report this Python's peak.
GNU time is small, and its child's peak is the child's own.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Sample:
    wall: float
    cpu: float
    rss_kib: int
    code: int
    out: str
    err: str


@dataclass
class Series:
    """Every sample of one command, and what the medians say."""

    label: str
    samples: list[Sample] = field(default_factory=list)
    peak_kib: int = 0  # from a run of its own under GNU time

    @property
    def ok(self) -> list[Sample]:
        return [s for s in self.samples if s.code == 0]

    @property
    def failed(self) -> int:
        return len(self.samples) - len(self.ok)

    def _median(self, attr: str) -> float:
        values = [getattr(s, attr) for s in (self.ok or self.samples)]
        return statistics.median(values) if values else float("nan")

    @property
    def wall(self) -> float:
        return self._median("wall")

    @property
    def cpu(self) -> float:
        return self._median("cpu")

    @property
    def rss_mb(self) -> float:
        return self.peak_kib / 1024 if self.peak_kib else float("nan")


PEAK = False
GNU_TIME = "/usr/bin/time"


def run(
    cmd: Sequence[str],
    env: dict[str, str],
    stdin: bytes | None = None,
    timeout: float = 180,
    cwd: str | None = None,
    watch: Callable[[int], Any] | None = None,
) -> Sample:
    """One run of cmd; killed (with its process group) after `timeout` seconds, which counts as a failure.
    With PEAK set, run under GNU time and rss_kib is its %M (the rest of the sample is not worth comparing)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, tempfile.NamedTemporaryFile() as peak:
        if PEAK:
            cmd = [GNU_TIME, "-q", "-f", "%M", "-o", peak.name, *cmd]
        started = time.perf_counter()
        proc = subprocess.Popen(
            list(cmd),
            env=env,
            cwd=cwd,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
        killer = threading.Timer(timeout, lambda: _kill(proc.pid))
        killer.start()
        if watch is not None:
            threading.Thread(target=watch, args=(proc.pid,), daemon=True).start()
        try:
            if stdin is not None and proc.stdin is not None:
                try:
                    proc.stdin.write(stdin)
                    proc.stdin.close()
                except BrokenPipeError:
                    pass
            _pid, status, usage = os.wait4(proc.pid, 0)
        finally:
            killer.cancel()
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        rss = usage.ru_maxrss
        if PEAK:
            lines = Path(peak.name).read_text().split()
            rss = int(lines[-1]) if lines and lines[-1].isdigit() else 0
        return Sample(
            wall,
            usage.ru_utime + usage.ru_stime,
            rss,
            proc.returncode,
            out.read().decode("utf-8", "replace"),
            err.read().decode("utf-8", "replace"),
        )


def _kill(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


class FdWatch:
    """The most descriptors a process held open at once, sampled from /proc/PID/fd every 10 ms until it exits."""

    def __init__(self) -> None:
        self.max_fds = 0

    def __call__(self, pid: int) -> None:
        while True:
            try:
                fds = len(os.listdir(f"/proc/{pid}/fd"))
                if "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text():
                    return
            except OSError:
                return
            self.max_fds = max(self.max_fds, fds)
            time.sleep(0.01)
