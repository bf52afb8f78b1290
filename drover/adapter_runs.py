"""Which attempt of an adapter is running, kept outside drover's process: `<home>/adapter-runs/<msg id>.json` (0600).

Written before the adapter starts (its attempt number) and once it has started (its pid and the process's start
time from /proc), each time by a rename, so a drover killed at any point leaves a whole file or the one before.
A later `drover retry` reads it: the attempt counts every started run (a killed drover records no outcome), and a
run whose process still lives -- the same pid AND the same start time, so a reused pid is not mistaken for it --
is never started twice.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

DIR = "adapter-runs"


def _path(home: Path, msg_id: str) -> Path:
    return home / DIR / f"{msg_id}.json"


def read(home: Path, msg_id: str) -> dict[str, Any]:
    try:
        data = json.loads(_path(home, msg_id).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write(home: Path, msg_id: str, state: dict[str, Any]) -> None:
    path = _path(home, msg_id)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(state, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def started(pid: int) -> int | None:
    """The process's start time (clock ticks since boot, /proc/PID/stat field 22), None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()  # after the command name, which may hold spaces and ')'
    with contextlib.suppress(IndexError, ValueError):
        if fields[0] != "Z":  # a zombie has finished: nothing of it is still delivering
            return int(fields[19])
    return None


def next_attempt(home: Path, msg_id: str, at_least: int) -> int:
    """The number of the attempt about to start: one past every attempt started before, whatever it recorded."""
    prior = read(home, msg_id).get("attempt")
    return max(at_least, prior + 1 if isinstance(prior, int) else 1)


def running(home: Path, msg_id: str) -> dict[str, Any] | None:
    """The earlier attempt whose adapter still runs (its state), else None."""
    state = read(home, msg_id)
    pid, start = state.get("pid"), state.get("start")
    if isinstance(pid, int) and isinstance(start, int) and started(pid) == start:
        return state
    return None
