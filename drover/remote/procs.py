"""Processes: the table of who runs under whom, which engine a pane runs, and a process's identity over time."""

import json
import os
import re
from typing import Any, Dict, List, Optional, Set, Tuple

from .profiles import engine_order

INTERPRETERS = re.compile(r"^(node|nodejs|bun|deno|npx|python[0-9.]*|pypy[0-9.]*)$")


class ProcTable(Dict[int, Tuple[int, str]]):
    """pid -> (ppid, command name), for engine detection: which processes run under a pane, and their argv.

    Where the kernel lists each thread's children (/proc/PID/task/TID/children, Linux 3.5+ with
    CONFIG_PROC_CHILDREN, as Debian, Ubuntu and Fedora build it), the table is lazy: a pane's process tree is read
    from its root down, a few files per process under the pane, and nothing of the rest of the machine.  Elsewhere
    it is one pass over /proc, one stat per process, and the parent -> children map built once.  Either way a
    process's argv is read only when detection asks for it."""

    def __init__(self, lazy: bool = False) -> None:
        super().__init__()
        self.lazy = lazy
        self._argv = {}  # type: Dict[int, List[str]]
        self._children = None  # type: Optional[Dict[int, List[int]]]
        self._kids = {}  # type: Dict[int, List[int]]

    def __contains__(self, pid: object) -> bool:
        if super().__contains__(pid):
            return True
        if not self.lazy or not isinstance(pid, int):
            return False
        entry = _stat_entry(pid)
        if entry is None:
            return False
        self[pid] = entry
        return True

    def argv(self, pid: int) -> List[str]:
        if pid not in self._argv:
            argv = [a for a in (argv_of(pid) or []) if a]
            if not argv and pid in self:
                argv = [self[pid][1]]  # a kernel thread, or a process gone since the table was read: its name
            self._argv[pid] = argv
        return self._argv[pid]

    def children(self, pid: int) -> List[int]:
        if self.lazy:
            if pid not in self._kids:
                self._kids[pid] = _children_of(pid)
            return self._kids[pid]
        if self._children is None:
            self._children = {}
            for child, (ppid, _comm) in self.items():
                self._children.setdefault(ppid, []).append(child)
            for kids in self._children.values():
                kids.sort()
        return self._children.get(pid, [])


def _stat_entry(pid: Any) -> Optional[Tuple[int, str]]:
    """(ppid, command name) from /proc/PID/stat, or None if it is gone."""
    try:
        with open("/proc/%s/stat" % pid, "rb") as f:
            stat = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    close = stat.rfind(")")
    rest = stat[close + 1 :].split()
    if len(rest) < 2:
        return None
    return int(rest[1]), stat[stat.find("(") + 1 : close]


def _children_of(pid: int) -> List[int]:
    """A process's children, as every one of its threads lists them."""
    kids = set()  # type: Set[int]
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return []
    for tid in tids:
        try:
            with open("/proc/%d/task/%s/children" % (pid, tid)) as f:
                kids.update(int(k) for k in f.read().split())
        except (OSError, ValueError):
            continue
    return sorted(kids)


_LAZY = []  # type: List[bool]


def children_listed() -> bool:
    """Does this kernel list each thread's children?  Asked once per process."""
    if not _LAZY:
        _LAZY.append(os.path.exists("/proc/self/task/%d/children" % os.getpid()))
    return _LAZY[0]


def proc_table(scan: bool = False) -> ProcTable:
    """The processes engine detection may look at: lazily, a pane's tree at a time, where the kernel lists each
    thread's children; else (or with `scan`) every process we can see, one stat each."""
    if children_listed() and not scan:
        return ProcTable(lazy=True)
    table = ProcTable()
    try:
        names = os.listdir("/proc")
    except OSError:
        return table
    for name in names:
        if name.isdigit():
            entry = _stat_entry(name)
            if entry is not None:
                table[int(name)] = entry
    return table


def _resolved(pid: int, path: str) -> str:
    """A path as the process sees it, links resolved (relative to its working directory), or "" if unreadable."""
    try:
        base = os.readlink("/proc/%d/cwd" % pid)
    except OSError:
        base = "/"
    return os.path.realpath(os.path.join(base, path)) if path else ""


def _exe(pid: int) -> str:
    try:
        return os.readlink("/proc/%d/exe" % pid)
    except OSError:
        return ""


def claude_dir() -> str:
    return os.environ.get("CLAUDE_CONFIG_DIR") or os.path.join(os.path.expanduser("~"), ".claude")


def process_env(pid: int) -> Dict[str, str]:
    """A process's environment (readable for our own processes), or {}."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def claude_dir_of(pid: int) -> Optional[str]:
    """The config dir a Claude process reads (its own CLAUDE_CONFIG_DIR, else its HOME's .claude), or None when its
    environment is unreadable.  A second account (CLAUDE_CONFIG_DIR=~/.claude-work) or a variable exported only in
    an interactive shell's rc file is the session's, not the helper's: its registry is where the process says."""
    env = process_env(pid)
    if not env:
        return None
    if env.get("CLAUDE_CONFIG_DIR"):
        return env["CLAUDE_CONFIG_DIR"]
    return os.path.join(env["HOME"], ".claude") if env.get("HOME") else None


# Config dirs seen in running Claude processes, beside the helper's own: read for records and transcripts.
_SEEN_DIRS = []  # type: List[str]


def claude_dirs(extra: Optional[List[str]] = None) -> List[str]:
    """The helper's own Claude config dir, then every other one a running Claude was seen to use (no duplicates)."""
    for path in extra or []:
        if path and path not in _SEEN_DIRS:
            _SEEN_DIRS.append(path)
    out = []  # type: List[str]
    real = set()  # type: Set[str]
    for path in [claude_dir()] + _SEEN_DIRS:
        key = os.path.realpath(path)
        if key not in real:
            real.add(key)
            out.append(path)
    return out


def claude_registered(pid: int) -> bool:
    """Claude Code's own registry names this very process (its pid, and the start time that rules out a reused one)."""
    own = claude_dir_of(pid)
    for folder in claude_dirs() + ([own] if own else []):
        try:
            with open(os.path.join(folder, "sessions", "%d.json" % pid), encoding="utf-8") as f:
                rec = json.load(f)
        except (OSError, ValueError):
            continue
        started = proc_start(pid)
        domain = pid_domain()
        if isinstance(rec, dict) and rec.get("pidDomain") and domain and rec["pidDomain"] != domain:
            # Written in another machine or pid namespace: its pid names some other process there, and the
            # registry discards it as stale -- evidence of nothing here (a Claude seen as one without its record
            # would be pasted into around its inbox).
            continue
        if isinstance(rec, dict) and rec.get("pid") == pid and started is not None and str(rec.get("procStart")) == started:
            return True
    return False


def by_package(pid: int, prof: Dict[str, Any]) -> bool:
    """Is this process its engine's own program by package path (its executable's or its script's, links resolved),
    whatever the fleet vouches for?  What tells a real Claude or Codex from a program of the user's own."""
    argv = argv_of(pid) or []
    if not argv:
        return False
    scripts = script_of(os.path.basename(argv[0]), argv[1:]) if INTERPRETERS.match(os.path.basename(argv[0])) else []
    paths = [p for p in [_exe(pid)] + [_resolved(pid, s) for s in scripts] + scripts if p]
    return any(re.search(pattern, p) for pattern in prof.get("scripts", []) for p in paths)


def ancestors(pid: int, limit: int = 64) -> List[int]:
    """The process and its parents, nearest first (pid 1 and 0 left out)."""
    out = []  # type: List[int]
    while pid > 1 and len(out) < limit:
        out.append(pid)
        entry = _stat_entry(pid)
        if entry is None:
            break
        pid = entry[0]
    return out


# Interpreter options that take the next word as their value (so it is not the script), and those whose value is
# code rather than a file: python -c, node -e/-p (code names no package: it is never evidence of one).
_VALUE_OPTS = {"-W", "-X", "-Q", "-r", "--require", "--import", "--loader", "--experimental-loader", "--env-file"}
_CODE_OPTS = {"-c", "-e", "--eval", "-p", "--print"}


def script_of(base: str, args: List[str]) -> List[str]:
    """What an interpreter runs, read as the interpreter reads its command line: the module after `-m`, else the
    first word that is not an option -- and nothing for code given inline (`-c`, `-e`).  Words after the script are
    its own arguments: `python3 fake.py -m drover.demo_agent` runs fake.py, not the demo agent."""
    python = base.startswith(("python", "pypy"))
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--":
            return args[i + 1 : i + 2]
        if word in _CODE_OPTS or (python and word.startswith("-c")):
            return []
        if python and word == "-m":
            return args[i + 1 : i + 2]
        if python and word.startswith("-m") and len(word) > 2:
            return [word[2:]]
        if word in _VALUE_OPTS:
            i += 2
            continue
        if not word.startswith("-") or word == "-":
            return [word] if word != "-" else []
        i += 1
    return []


def _engine_of(pid: int, argv: List[str], profiles: Dict[str, Dict[str, Any]], order: List[str]) -> Optional[str]:
    """The engine this process is, "unknown" when it only bears an engine's name, or None when it is no engine.

    A built-in engine is known by evidence: the running program's package (its executable's or its script's path,
    links resolved, matches the profile's `scripts`: Claude Code's native binary lives in
    .../@anthropic-ai/claude-code-linux-x64/, Codex's in @openai/codex*, gemini-cli's in @google/gemini-cli), or,
    for Claude, its registry record for this pid and start time.  A name alone (`claude`, a copy of sh under that
    name) is `unknown`: drover types nothing into it.  A fleet that lists an engine's `commands` vouches for those
    names: that is how a user makes another program an engine."""
    base = os.path.basename(argv[0]) if argv else ""
    scripts = script_of(base, argv[1:]) if INTERPRETERS.match(base) else []
    # npm installs agents as scripts run by node (`node /usr/bin/codex`): the script's name counts as a command.
    names = [base] + [os.path.basename(s) for s in scripts]
    paths = None  # type: Optional[List[str]]
    claimed = False
    for name in order:
        prof = profiles[name]
        patterns = prof.get("scripts", [])
        if any(re.search(pattern, s) for pattern in patterns for s in scripts):
            return name
        if not any(n in prof.get("commands", []) for n in names):
            continue
        if prof.get("vouched"):
            return name
        if paths is None:
            paths = [p for p in [_exe(pid)] + [_resolved(pid, s) for s in scripts] if p]
        if any(re.search(pattern, p) for pattern in patterns for p in paths):
            return name
        if name == "claude" and claude_registered(pid):
            return name
        claimed = True
    return "unknown" if claimed else None


def detect_engine(pid: int, table: ProcTable, profiles: Dict[str, Dict[str, Any]]) -> Tuple[str, int]:
    """The engine nearest the pane's root process, walking its process tree breadth-first; and that pid."""
    order = engine_order(profiles)
    queue = [pid]
    seen: Set[int] = set()
    while queue and len(seen) < 512:
        current = queue.pop(0)
        if current in seen or current not in table:
            continue
        seen.add(current)
        engine = _engine_of(current, table.argv(current), profiles, order)
        if engine:
            return engine, current
        queue.extend(table.children(current))
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


_DOMAIN = []  # type: List[Optional[str]]


def pid_domain() -> Optional[str]:
    """Where pids mean something: this machine and this pid namespace (Claude Code records the same).  Read once
    per process: neither changes under a running helper, and discovery asks once per Claude record."""
    if not _DOMAIN:
        try:
            with open("/etc/machine-id") as f:
                machine = f.read().strip()
            _DOMAIN.append("linux:%s:%s" % (machine, os.readlink("/proc/self/ns/pid")))
        except OSError:
            return None
    return _DOMAIN[0]


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
