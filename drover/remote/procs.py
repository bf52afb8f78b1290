"""Processes: the table of who runs under whom, which engine a pane runs, and a process's identity over time."""

import os
import re
from typing import Any, Dict, List, Optional, Set, Tuple

from .profiles import engine_order

INTERPRETERS = re.compile(r"^(node|nodejs|bun|deno|npx|python[0-9.]*|pypy[0-9.]*)$")

ProcTable = Dict[int, Tuple[int, List[str]]]


def proc_table() -> ProcTable:
    """pid -> (ppid, argv) for every process we can see, read once per request."""
    table: ProcTable = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return table
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                stat = f.read().decode("utf-8", "replace")
            with open("/proc/%s/cmdline" % name, "rb") as f:
                argv = [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
        except OSError:
            continue
        rest = stat.rsplit(")", 1)[-1].split()
        comm = stat[stat.find("(") + 1 : stat.rfind(")")]
        table[int(name)] = (int(rest[1]), argv or [comm])
    return table


def _engine_of(argv: List[str], profiles: Dict[str, Dict[str, Any]], order: List[str]) -> Optional[str]:
    base = os.path.basename(argv[0]) if argv else ""
    scripts = []
    if INTERPRETERS.match(base):
        args = argv[1:]
        if base.startswith(("python", "pypy")) and "-m" in args:
            i = args.index("-m")
            if i + 1 < len(args):
                scripts.append(args[i + 1])
        first = [a for a in args if not a.startswith("-")]
        if first:
            scripts.append(first[0])
    # npm installs agents as scripts run by node (`node /usr/bin/codex`): the script's name counts as a command.
    names = [base] + [os.path.basename(s) for s in scripts]
    for name in order:
        prof = profiles[name]
        if any(n in prof.get("commands", []) for n in names):
            return name
        for pattern in prof.get("scripts", []):
            if any(re.search(pattern, s) for s in scripts):
                return name
    return None


def detect_engine(pid: int, table: ProcTable, profiles: Dict[str, Dict[str, Any]]) -> Tuple[str, int]:
    """The engine nearest the pane's root process, walking its process tree breadth-first; and that pid."""
    children: Dict[int, List[int]] = {}
    for child, (ppid, _argv) in table.items():
        children.setdefault(ppid, []).append(child)
    order = engine_order(profiles)
    queue = [pid]
    seen: Set[int] = set()
    while queue and len(seen) < 512:
        current = queue.pop(0)
        if current in seen or current not in table:
            continue
        seen.add(current)
        engine = _engine_of(table[current][1], profiles, order)
        if engine:
            return engine, current
        queue.extend(sorted(children.get(current, [])))
    return "shell", pid


def proc_start(pid: int) -> Optional[str]:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks): with the pid, it names one process."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            stat = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None


def pid_domain() -> Optional[str]:
    """Where pids mean something: this machine and this pid namespace (Claude Code records the same)."""
    try:
        with open("/etc/machine-id") as f:
            machine = f.read().strip()
        return "linux:%s:%s" % (machine, os.readlink("/proc/self/ns/pid"))
    except OSError:
        return None


def argv_of(pid: int) -> Optional[List[str]]:
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return [a.decode("utf-8", "replace") for a in f.read().split(b"\0")]
    except OSError:
        return None


def stat_fields(pid: int) -> Optional[List[str]]:
    """The fields of /proc/<pid>/stat after the command name: state, ppid, pgrp, session, tty_nr, tpgid, ..."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            return f.read().decode("utf-8", "replace").rsplit(")", 1)[-1].split()
    except OSError:
        return None


def foreground(pid: int) -> Optional[Tuple[int, int, str]]:
    """(the process's own group, its terminal's foreground group, its state letter), or None if it is gone."""
    fields = stat_fields(pid)
    if fields is None or len(fields) < 6:
        return None
    return int(fields[2]), int(fields[5]), fields[0]


def group_members(pgrp: int) -> List[Tuple[int, str]]:
    """(pid, command name) of every process in a process group."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = stat_fields(int(name))
        if fields is None or len(fields) < 3 or int(fields[2]) != pgrp:
            continue
        argv = argv_of(int(name)) or [""]
        out.append((int(name), os.path.basename(argv[0]) if argv[0] else "?"))
    return out
