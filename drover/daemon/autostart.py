"""Starting a daemon on first use, and what the command's fleet file says about it.  Standard library only.

The front (drover/daemon/client.py) starts one when no daemon answered; the daemon (server.py) asks the same
questions of each request's fleet file.
"""

from __future__ import annotations

import os
import sys

from drover import paths


def autostart_allowed(argv: list[str]) -> bool:
    """On first use, unless turned off: DROVER_DAEMON=0, or `daemon = false` under [defaults] in the fleet file.
    (The test suite sets DROVER_DAEMON=0 for every test but those of persistent mode: tests/conftest.py.)"""
    if not paths.daemon_enabled():
        return False
    return fleet_allows(argv)


def fleet_of(argv: list[str], env: dict[str, str] | os._Environ[str] | None = None) -> str:
    """The fleet file a command reads: --fleet, else $DROVER_FLEET, else the default (maybe relative: to the cwd)."""
    fleet = None
    for i, word in enumerate(argv):
        if word == "--":
            break
        if word == "--fleet" and i + 1 < len(argv):
            fleet = argv[i + 1]
        elif word.startswith("--fleet="):
            fleet = word.split("=", 1)[1]
    return paths.fleet_file(env) if fleet is None else fleet


def _defaults(path: str) -> dict:
    """[defaults] of the fleet file at `path` ({} when unset, or when the file cannot be read: the command itself
    then reports the file's problem, in either mode)."""
    try:
        import stat
        import tomllib

        path = os.path.expanduser(path)
        if not stat.S_ISREG(os.stat(path).st_mode):
            return {}
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, ValueError, RecursionError):  # RecursionError: nested past the parser's reach
        return {}
    defaults = data.get("defaults")
    return defaults if isinstance(defaults, dict) else {}


def fleet_file_allows(path: str) -> bool:
    return _defaults(path).get("daemon") is not False


def fleet_allows(argv: list[str]) -> bool:
    """The fleet file's `daemon` setting (true when unset or unreadable), the file found as the command finds it."""
    return fleet_file_allows(fleet_of(argv))


def fleet_idle(argv: list[str]) -> float | None:
    """`daemon_idle_s` of the command's fleet file, for a daemon it starts (the daemon itself runs from /, where a
    relative fleet path means something else); None: the daemon's own default ($DROVER_DAEMON_IDLE_S first)."""
    if os.environ.get("DROVER_DAEMON_IDLE_S"):
        return None
    value = _defaults(fleet_of(argv)).get("daemon_idle_s")
    if isinstance(value, str):  # a duration, as the fleet writes lengths of time ("10m")
        try:
            value = paths.parse_duration(value)
        except ValueError:
            return None
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= paths.MAX_DURATION_S:
        return float(value)
    return None


def start(argv: list[str], path: str) -> None:
    """Start a daemon for this environment in the background, detached: its own session, no terminal, stdin from
    /dev/null, output to a log beside the socket, no descriptor of ours (a `$(drover ...)` or a cron job must
    not wait for it).  Several callers may race to start one: the daemon's lock lets one win."""
    if not autostart_allowed(argv):
        return
    try:
        paths.ensure_dir(os.path.dirname(path))
    except (OSError, paths.Unsafe):
        return
    spawn(path, fleet_idle(argv))


def spawn(path: str, idle: float | None = None) -> int:
    """Fork the daemon off (double fork: nobody has to reap it); returns at once in the caller (0), or raises."""
    log = paths.daemon_log(path)
    # Through the CLI (`drover daemon serve`), which hands the daemon the program its requests run through.
    argv = [sys.executable, "-m", "drover", "daemon", "serve", "--socket", path]
    if idle is not None:
        argv += ["--idle", paths.seconds_text(idle)]
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)
        return 0
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        os.chdir("/")
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.closerange(3, 65536)
        os.execv(sys.executable, argv)
    finally:
        os._exit(127)
