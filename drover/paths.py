"""Where drover keeps its files, and how it writes time: the one home for both.  Standard library only.

The stdlib-only front (drover/front.py) and the daemon's client import this module on the hot path, so it imports
nothing beyond the standard library, and not even `re` until a duration is parsed.  It is the only module of the
local side that reads DROVER_HOME, DROVER_FLEET, DROVER_DAEMON and the XDG_* variables (tests/test_paths.py checks that): every
other module asks here, so the home, the fleet file and the daemon's socket cannot be derived two ways.  (The
remote side, drover/remote/, runs on the host with its own environment and is not concerned.)

- the drover home: `$DROVER_HOME`, else `$XDG_STATE_HOME/drover`, else `~/.local/state/drover` (the truth file,
  its locks, the help and completion caches, the remote helper's compressed bundle, the board's sightings);
- drover's config folder: `$XDG_CONFIG_HOME/drover`, else `~/.config/drover` (the default fleet file and drover's
  own known_hosts); the fleet file: `--fleet`, else `$DROVER_FLEET`, else `fleet.toml` there;
- the daemon's files: its socket `$XDG_RUNTIME_DIR/drover/d-KEY.sock` (else `/tmp/drover-UID/d-KEY.sock`), with its
  lock (holding its pid) and its log beside it; the switch `DROVER_DAEMON=0` turns persistent mode off;
- durations: one grammar for the fleet file's keys and every command's durations (`--since` and the like).

The socket's directory must be ours, a real directory (not a symlink) and mode 0700: then nobody else can reach
the socket (the socket is 0600 too, and the daemon checks the peer's uid on every connection).

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

TYPE_CHECKING = False  # typing's own costs the hot path an import; mypy reads this name as typing's
if TYPE_CHECKING:
    from collections.abc import Mapping

    Env = Mapping[str, str]


# -- the drover home, the config folder, the fleet file ---------------------------------------------------------
def _env(env: Env | None) -> Env:
    return os.environ if env is None else env


def _user_home(env: Env) -> str:
    # The given environment's HOME first: the daemon resolves a caller's paths from the caller's environment.
    return env.get("HOME") or os.path.expanduser("~")


def home(env: Env | None = None) -> str:
    """The drover home: $DROVER_HOME (~ expanded), else $XDG_STATE_HOME/drover, else ~/.local/state/drover."""
    env = _env(env)
    named = env.get("DROVER_HOME")
    if named:
        return os.path.expanduser(named)
    base = env.get("XDG_STATE_HOME") or os.path.join(_user_home(env), ".local", "state")
    return os.path.join(base, "drover")


def config_dir(env: Env | None = None) -> str:
    """drover's config folder: $XDG_CONFIG_HOME/drover, else ~/.config/drover."""
    env = _env(env)
    return os.path.join(env.get("XDG_CONFIG_HOME") or os.path.join(_user_home(env), ".config"), "drover")


def default_fleet(env: Env | None = None) -> str:
    """The fleet file when none is named: fleet.toml in the config folder."""
    return os.path.join(config_dir(env), "fleet.toml")


def named_fleet(env: Env | None = None) -> str | None:
    """$DROVER_FLEET as written (None when unset or empty); a named fleet file must exist, the default need not."""
    return _env(env).get("DROVER_FLEET") or None


def fleet_file(env: Env | None = None) -> str:
    """The fleet file a command reads when --fleet is not given: $DROVER_FLEET, else the default (as written: a
    relative path is relative to the caller's directory, and ~ is left for the caller to expand)."""
    return named_fleet(env) or default_fleet(env)


def known_hosts(env: Env | None = None) -> str:
    """drover's own known_hosts (the keys `accept_new` recorded), in the config folder."""
    return os.path.join(config_dir(env), "known_hosts")


def daemon_enabled(env: Env | None = None) -> bool:
    """Persistent mode, unless DROVER_DAEMON says no (0, off, no, false)."""
    return _env(env).get("DROVER_DAEMON", "") not in ("0", "off", "no", "false")


# -- the daemon's socket, lock and log, and which environment a daemon stands for -------------------------------
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
SOCKET_NAME = "d-0123456789abcdef.sock"  # the shape of every socket's name (key() is 16 hex digits)


class Unsafe(Exception):
    """The socket directory is not the user's own: nothing is created in it and nothing there is trusted."""


def environment(env: Env | None = None) -> dict[str, str]:
    """The part of the environment a daemon must share with its callers."""
    env = _env(env)
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
    package = os.path.dirname(os.path.abspath(__file__))  # drover/ itself
    # The environment (venv) and the real interpreter: `drover` (#!.../bin/python3) and `python -m drover`
    # (.../bin/python) are the same program and must find the same daemon.
    return {**env, "": f"{sys.prefix}\0{os.path.realpath(sys.executable)}\0{package}"}


def key(ident: dict[str, str]) -> str:
    raw = "\0".join(f"{k}={v}" for k, v in sorted(ident.items())).encode("utf-8", "surrogateescape")
    # Two checksums, not a cryptographic hash: hashlib costs the hot path a few milliseconds, and the key only
    # picks a socket (the daemon checks the whole environment itself).
    return f"{zlib.crc32(raw):08x}{zlib.adler32(raw):08x}"


def runtime_dir(env: Env | None = None) -> str:
    base = _env(env).get("XDG_RUNTIME_DIR", "")
    # A runtime directory so deep that the socket's path would not fit in a sockaddr_un is not used.
    if base and os.path.isabs(base) and len(os.fsencode(os.path.join(base, "drover", SOCKET_NAME))) <= MAX_SOCKET_PATH:
        return os.path.join(base, "drover")
    return f"/tmp/drover-{os.getuid()}"


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


def daemon_lock(socket: str) -> str:
    """The daemon's lock, beside its socket (d-KEY.sock: d-KEY.lock): held for its life, and holding its pid."""
    return socket[: -len(".sock")] + ".lock"


def daemon_log(socket: str) -> str:
    """Where a daemon started in the background writes its output, beside its socket (d-KEY.log)."""
    return socket[: -len(".sock")] + ".log"


# -- durations --------------------------------------------------------------------------------------------------
# The longest duration anything drover schedules or waits for may be: a year and a day.  Longer ones overflow the
# clock arithmetic of whatever uses them (a `[[nudge]] every = "999999999999d"` made every `drover nudge run` crash).
MAX_DURATION_S = 366 * 86400.0
DURATION_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
# ASCII digits only: Python's \d and float() also take Arabic-Indic and fullwidth digits, which no one means here.
DURATION_PART = r"([0-9]+(?:\.[0-9]+)?)\s*([dhms])"
SECONDS = r"[0-9]+(?:\.[0-9]+)?"
DURATION_FORMS = "90s, 15m, 1h30m, 2d or a number of seconds"


def parse_duration(value: str) -> float:
    """Seconds in `value` by drover's one grammar: parts of a number and a unit (d, h, m, s; any case, blanks
    between allowed), summed -- "90s", "15m", "1h30m", "1.5h", "2d" -- or a plain number of seconds ("90").
    ValueError for anything else.  Zero and very long durations parse: each use says what it allows (duration_s)."""
    import re  # here: the front imports this module for its paths, and never parses a duration

    text = value.strip().lower()
    if re.fullmatch(SECONDS, text):
        return float(text)
    parts = re.findall(DURATION_PART, text)
    if not parts or re.sub(DURATION_PART, "", text).strip():
        raise ValueError(f"{value!r} is not a duration: write it like {DURATION_FORMS}")
    return sum(float(n) * DURATION_UNITS[unit] for n, unit in parts)


def duration_s(value: str) -> float:
    """A duration something waits for or repeats at (the fleet's `every` and `retry`): parse_duration's grammar,
    above zero and at most MAX_DURATION_S (ValueError otherwise)."""
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"{value!r} is no time at all: give a duration above zero")
    if not seconds <= MAX_DURATION_S:  # also inf, from a number too long for a float
        raise ValueError(f"{value!r} is longer than drover takes: at most 366d")
    return seconds


def seconds_in(value: object) -> object:
    """A fleet key that holds seconds, as the file may write it: a number as it is, or a duration in the one grammar
    ("90s", "15m", "90") as its seconds.  Anything else is handed on for the field's own check to refuse."""
    if isinstance(value, str):
        return parse_duration(value)
    if isinstance(value, bool):  # pydantic would take `true` for 1 second
        raise ValueError(f"{str(value).lower()} is not a length of time: write it like {DURATION_FORMS}")
    return value


def seconds_text(seconds: float) -> str:
    """`seconds` written so that parse_duration reads it back (a plain number, never 1e-05): how one process hands
    a duration to another on its command line (the daemon's --idle)."""
    return f"{seconds:.6f}".rstrip("0").rstrip(".")
