"""Where the daemon's socket lives, and which environment a daemon stands for.  Standard library only.

The socket is `$XDG_RUNTIME_DIR/drover/d-KEY.sock` (else `/tmp/drover-UID/d-KEY.sock`).  The directory must be
ours, a real directory (not a symlink) and mode 0700: then nobody else can reach the socket (the socket is 0600
too, and the daemon checks the peer's uid on every connection).

KEY is a checksum of the environment the work depends on (the drover home, the fleet file, HOME for ~/.ssh,
tmux's socket directory, Claude's config dir, PATH, ...) and of the interpreter and drover's own location.  A
daemon runs requests in its own process, so it can honour a caller's environment only by *being* started from
the same one: callers with another environment reach another daemon (or none).  The checksum only picks the
socket; the daemon compares the whole environment on every request and refuses one that differs.
"""

from __future__ import annotations

import os
import stat
import sys
import zlib

# What the work reads from the environment, here or in the helper and the programs it runs (grep os.environ), and
# what changes how the process behaves (TZ: local times; the locale; Python's I/O encoding).  Every DROVER_* and
# LC_* variable is compared too (ENV_PREFIXES), but for the ones the front carries with each request or that only
# steer the front (CARRIED).  The terminal's variables (TERM, COLUMNS, NO_COLOR, ...) are carried with each request.
ENV_KEYS = (
    "HOME",
    "USER",
    "LOGNAME",
    "LNAME",
    "USERNAME",
    "PATH",
    "TZ",
    "LANG",
    "LANGUAGE",
    "TMPDIR",
    "DISPLAY",
    "PYTHONIOENCODING",
    "PYTHONUTF8",
    "TMUX_TMPDIR",
    "CLAUDE_CONFIG_DIR",
    "CODEX_HOME",
    "XDG_CONFIG_HOME",
    "XDG_STATE_HOME",
    "XDG_RUNTIME_DIR",
    "SSH_AUTH_SOCK",
    "PYTHONPATH",
)
ENV_PREFIXES = ("DROVER_", "LC_")
# DROVER_ACTOR travels with each request (agents that differ only in their actor share one daemon); DROVER_DAEMON
# and DROVER_DAEMON_IDLE_S decide whether and how long a daemon runs, never what a command does.
CARRIED = frozenset(["DROVER_ACTOR", "DROVER_DAEMON", "DROVER_DAEMON_IDLE_S"])
# The caller's umask (process-wide in the daemon, so it cannot be carried per request: it must match).
UMASK = "(umask)"
# sockaddr_un's sun_path is 108 bytes, with the terminating NUL.
MAX_SOCKET_PATH = 107


class Unsafe(Exception):
    """The socket directory is not the user's own: nothing is created in it and nothing there is trusted."""


def environment(env: os._Environ[str] | dict[str, str] | None = None) -> dict[str, str]:
    """The part of the environment a daemon must share with its callers."""
    env = os.environ if env is None else env
    out = {k: env[k] for k in ENV_KEYS if k in env}
    out.update((k, v) for k, v in env.items() if k.startswith(ENV_PREFIXES) and k not in CARRIED)
    out[UMASK] = f"{current_umask():04o}"
    # Only $TMUX's socket is read (drover/remote/tmux.py); its pid and session index differ from pane to pane.
    tmux = env.get("TMUX", "").split(",")[0]
    if tmux:
        out["TMUX"] = tmux
    return out


def current_umask() -> int:
    """The process's umask, read without changing it where Linux says it (/proc/self/status): setting it to read it
    would, for that instant, apply to files another thread of a script using the library creates."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def identity(env: dict[str, str]) -> dict[str, str]:
    """The environment plus what the code is: another interpreter or another checkout is another daemon."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # The environment (venv) and the real interpreter: `drover` (#!.../bin/python3) and `python -m drover`
    # (.../bin/python) are the same program and must find the same daemon.
    return {**env, "": f"{sys.prefix}\0{os.path.realpath(sys.executable)}\0{package}"}


def key(ident: dict[str, str]) -> str:
    raw = "\0".join(f"{k}={v}" for k, v in sorted(ident.items())).encode("utf-8", "surrogateescape")
    # Two checksums, not a cryptographic hash: hashlib costs the hot path a few milliseconds, and the key only
    # picks a socket (the daemon checks the whole environment itself).
    return f"{zlib.crc32(raw):08x}{zlib.adler32(raw):08x}"


def runtime_dir(env: dict[str, str] | os._Environ[str] | None = None) -> str:
    env = os.environ if env is None else env
    base = env.get("XDG_RUNTIME_DIR", "")
    # A runtime directory so deep that the socket's path would not fit in a sockaddr_un is not used.
    if base and os.path.isabs(base) and len(os.fsencode(os.path.join(base, "drover", SOCKET_NAME))) <= MAX_SOCKET_PATH:
        return os.path.join(base, "drover")
    return f"/tmp/drover-{os.getuid()}"


SOCKET_NAME = "d-0123456789abcdef.sock"  # the shape of every socket's name (key() is 16 hex digits)


def check_dir(path: str) -> None:
    """Raise Unsafe unless `path` is a directory (not a symlink) of ours that nobody else can enter."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise Unsafe(f"{path} is not a directory (a symlink or a file): the daemon's socket is not put there")
    if st.st_uid != os.getuid():
        raise Unsafe(f"{path} belongs to uid {st.st_uid}, not to you: the daemon's socket is not put there")
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise Unsafe(f"{path} has mode {stat.S_IMODE(st.st_mode):04o}, not 0700: the daemon's socket is not put there")


def ensure_dir(path: str) -> None:
    """Create the socket directory 0700 if it is missing, then check it (an existing one is never loosened)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    check_dir(path)


def socket_path(env: dict[str, str] | None = None) -> str:
    env = environment() if env is None else env
    return os.path.join(runtime_dir(env), f"d-{key(identity(env))}.sock")
