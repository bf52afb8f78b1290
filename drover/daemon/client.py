"""The daemon's client: what the `drover` front runs before it imports anything heavy.  Standard library only.

`run(argv)` answers the command's exit code when a daemon ran it, or None when the caller must run it directly:
persistent mode off, not a hot command, no daemon (one is then started for next time), a stale socket, a daemon
of another environment or version, or a daemon that died before the command could have done anything.

A daemon that dies *after* the command may have had an effect is never worked around by running it again: a
send whose message was recorded is reported as uncertain, with its id and the `drover retry` that finishes it
exactly once (the daemon tells the client the id before anything is delivered).
"""

from __future__ import annotations

import _socket  # the C module: `socket` costs the hot path ~4 ms of imports (enum, selectors) it does not use
import os
import sys
import time

from drover import paths, terminal_columns
from drover.daemon import wire

# The commands the daemon runs; everything else (fleet edits, the demo, guard) runs directly.
HOT = frozenset(["send", "ls", "status", "wait", "op", "read", "log"])
# Global options that take a value: `drover --fleet F send ...`.
VALUED = frozenset(["--fleet", "--actor"])
# Commands and ops that only read: when the daemon dies running one of them, running it again here is harmless.
# A send is one too until its message is being recorded (the daemon says so: `accepting`).
RERUN_SAFE = frozenset(["send", "ls", "status", "wait", "read", "log"])
RERUN_SAFE_OPS = frozenset(
    ["sessions.list", "sessions.status", "sessions.wait", "sessions.read", "sessions.message", "messages.list", "messages.get"]
)
CONNECT_TIMEOUT_S = 2.0
# A daemon that took the request must say `started` (or refuse) within this: a stopped or wedged daemon costs the
# caller this much, then the command runs directly.
START_TIMEOUT_S = 10.0
# Once started, the daemon sends a heartbeat every HEARTBEAT_S while the command runs; missing them for this long
# the client gives up on it (a stopped or wedged daemon): a read runs directly, a send is reported uncertain.
SILENCE_TIMEOUT_S = 10.0
HELP_WORDS = frozenset(["--help", "-h"])
# typer's options that print a completion script for the shell of the process that runs them: the caller's own.
COMPLETION_WORDS = frozenset(["--install-completion", "--show-completion"])
EXIT_FAILED = 5  # drover.errors.ExitCode.FAILED (not imported: that module pulls in the remote package)
EXIT_INTERRUPTED = 130


def enabled() -> bool:
    """Persistent mode, unless DROVER_DAEMON says no (read in drover/paths.py, with the daemon's other files)."""
    return paths.daemon_enabled()


def command_of(argv: list[str]) -> tuple[str | None, list[str]]:
    """The command word and the words after it, skipping the global options before it."""
    i = 0
    while i < len(argv):
        word = argv[i]
        if word in VALUED:
            i += 2
            continue
        if word.startswith("-"):
            if word == "--":
                return None, []
            i += 1
            continue
        return word, argv[i + 1 :]
    return None, []


def _positional(rest: list[str]) -> str | None:
    i = 0
    while i < len(rest):
        if rest[i] in VALUED:
            i += 2
        elif rest[i].startswith("-"):
            i += 1
        else:
            return rest[i]
    return None


class Gone(Exception):
    """The connection to the daemon broke (not a timeout): told apart from a broken pipe on our own stdout."""


class Direct(Exception):
    """The command is better run here: stdin is closed, or too big for the protocol (nothing was done yet)."""


class _Saved:
    """What this process read of its stdin for the daemon: a direct run after a fallback reads it again from here."""

    stdin: bytes | None = None


SAVED = _Saved()


def asks_help(argv: list[str]) -> bool:
    """--help or -h before any `--`: help is rendered here, exactly as a direct run renders it (width, colours)."""
    for word in argv:
        if word == "--":
            return False
        if word in HELP_WORDS:
            return True
    return False


def asks_completion(argv: list[str]) -> bool:
    """--install-completion or --show-completion before any `--`: they look for the shell this process runs in,
    and write where click writes (this process's stdout), never through the daemon."""
    for word in argv:
        if word == "--":
            return False
        if word.split("=", 1)[0] in COMPLETION_WORDS:
            return True
    return False


class Conn:
    """A connection to the daemon: send, read lines, close."""

    def __init__(self, sock: _socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def sendall(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except TimeoutError:
            raise
        except OSError as exc:
            raise Gone(str(exc)) from None

    def settimeout(self, seconds: float | None) -> None:
        self.sock.settimeout(seconds)

    def readline(self, limit: int = wire.MAX_LINE) -> bytes:
        """One line (with its newline), or what came before the end (no newline: the daemon went away)."""
        while b"\n" not in self.buffer and len(self.buffer) < limit:
            try:
                chunk = self.sock.recv(1 << 16)
            except TimeoutError:
                raise
            except OSError:
                chunk = b""
            if not chunk:
                break
            self.buffer += chunk
        at = self.buffer.find(b"\n")
        end = at + 1 if at >= 0 else len(self.buffer)
        line, self.buffer = self.buffer[:end], self.buffer[end:]
        return line

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Conn:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def connect(path: str, timeout: float = CONNECT_TIMEOUT_S) -> Conn:
    """A connection to the daemon at `path`, checked: the directory is ours and the peer runs as us."""
    paths.check_dir(os.path.dirname(path))
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
        cred = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)  # struct ucred: pid, uid, gid
        uid = int.from_bytes(cred[4:8], sys.byteorder, signed=True)
        if uid != os.getuid():
            raise paths.Unsafe(f"the process listening on {path} runs as uid {uid}, not as you")
    except BaseException:
        sock.close()
        raise
    return Conn(sock)


def _term() -> dict[str, str]:
    return {k: os.environ[k] for k in ("TERM", "COLORTERM", "NO_COLOR", "FORCE_COLOR", "COLUMNS", "LINES") if k in os.environ}


def _isatty(stream: object) -> bool:
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError, OSError):
        return False


def run(argv: list[str]) -> int | None:
    """Run the command through the daemon: its exit code, or None to run it directly (with whatever stdin was
    read for the daemon put back as this process's stdin, so the direct run reads the same text)."""
    code = _run(argv)
    if code is None and SAVED.stdin is not None:
        import io

        old = sys.stdin
        encoding = getattr(old, "encoding", None) or "utf-8"
        errors = getattr(old, "errors", None) or "strict"
        sys.stdin = io.TextIOWrapper(io.BytesIO(SAVED.stdin), encoding=encoding, errors=errors)
    return code


def _run(argv: list[str]) -> int | None:
    if not enabled() or "_DROVER_COMPLETE" in os.environ:
        return None  # shell completion is click's, from this process's environment: never a command to run
    command, rest = command_of(argv)
    if command not in HOT or asks_help(argv) or asks_completion(argv):
        return None
    env = paths.environment()
    path = paths.socket_path(env)
    try:
        sock = connect(path)
    except (OSError, paths.Unsafe):
        # No daemon (or a stale socket, or one we will not trust): this command runs directly; the next one
        # finds a daemon.
        from drover.daemon import autostart  # only when no daemon answered: not on the warm path

        autostart.start(argv, path)
        return None
    request = {
        "t": "run",
        "v": wire.VERSION,
        "argv": argv,
        "cwd": _cwd(),
        "env": env,
        "actor": os.environ.get("DROVER_ACTOR"),
        "tty": {"stdin": _isatty(sys.stdin), "stdout": _isatty(sys.stdout), "stderr": _isatty(sys.stderr)},
        "cols": terminal_columns(),
        "term": _term(),
        # After this the daemon must not start it: we will have given up and run it ourselves (a daemon stopped
        # with SIGSTOP and continued later would otherwise run it a second time).
        "deadline": time.time() + START_TIMEOUT_S - 1.0,
    }
    with sock:
        return Talk(sock, command, rest).run(request)


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:
        return None  # a removed directory: the daemon runs it from /, as a direct run would fail the same way only if it needs it


class Talk:
    """One request's conversation with the daemon."""

    def __init__(self, sock: Conn, command: str, rest: list[str]) -> None:
        self.sock = sock
        self.command = command
        self.rest = rest
        self.started = False
        self.printed = False
        self.accepting = False
        self.accepted: list[str] = []  # a broadcast records several

    def run(self, request: dict[str, object]) -> int | None:
        try:
            self.sock.sendall(wire.encode(request))
            self.sock.settimeout(START_TIMEOUT_S)
            while True:
                try:
                    line = self.sock.readline()
                except TimeoutError:
                    # Never said it started, or went silent after: treat it as gone.  (A stopped daemon continued
                    # later finds the connection closed and cancels the command, as for a client killed.)
                    line = b""
                if not line.endswith(b"\n"):
                    return self.lost()
                code = self.handle(wire.decode(line))
                if code is not None:
                    return code if code >= 0 else None
        except KeyboardInterrupt:
            # Said, not just a closed connection (which the daemon takes for a client killed, and lets a send on its
            # way finish): the daemon cancels the command, and records an interrupted send as such.
            self.interrupt()
            _write(sys.stderr, "drover: interrupted\n")
            return EXIT_INTERRUPTED
        except Gone:
            return self.lost()
        except Direct:
            # Asked for stdin, which is closed or too big to send: nothing was done yet (a command reads its text
            # first), so it runs here; the daemon cancels it there.
            self.interrupt()
            if not (self.accepting or self.accepted or self.printed):
                return None
            return self.lost()
        except BrokenPipeError:
            return 0  # our own stdout closed: `drover ls | head -1`
        except (OSError, ValueError):
            return self.lost()

    def interrupt(self) -> None:
        try:
            self.sock.settimeout(1.0)
            self.sock.sendall(wire.encode({"t": "interrupt"}))
        except (OSError, Gone):
            pass  # the daemon is gone too: nothing left to cancel

    def handle(self, msg: dict) -> int | None:
        """A message from the daemon: an exit code to end with, -1 to run the command directly, None to go on."""
        kind = msg.get("t")
        if kind == "out":
            self.printed = True
            _write(sys.stdout, msg.get("d", ""))
        elif kind == "err":
            self.printed = True
            _write(sys.stderr, msg.get("d", ""))
        elif kind == "started":
            self.started = True
            # From here the daemon bounds the command by its own timeouts, and says it is alive every second: a
            # daemon silent for SILENCE_TIMEOUT_S (stopped, wedged) is given up on as one that died.
            self.sock.settimeout(SILENCE_TIMEOUT_S)
        elif kind == "stdin?":
            if sys.stdin is None:
                raise Direct("stdin is closed")
            SAVED.stdin = data = _read_stdin()
            line = wire.encode({"t": "stdin", "d": data.decode("utf-8", "surrogateescape")})
            if len(line) > wire.MAX_LINE:
                raise Direct("stdin is too big for the daemon's protocol")
            self.sock.sendall(line)
        elif kind == "accepting":
            self.accepting = True
        elif kind == "accepted":
            self.accepted.append(str(msg.get("id")))
        elif kind == "exit":
            return int(msg.get("code", 1))
        elif kind == "refuse":
            return -1 if not self.started else self.lost()
        return None

    def lost(self) -> int | None:
        """The daemon went away before it answered: run the command here only if that cannot do anything twice."""
        if len(self.accepted) == 1:
            (msg_id,) = self.accepted
            _write(
                sys.stderr,
                f"drover: the daemon stopped while sending {msg_id}: it may or may not have arrived "
                f"(`drover retry {msg_id}` looks for it before it sends it again; never twice)\n",
            )
            return EXIT_FAILED
        if self.accepted:
            _write(
                sys.stderr,
                f"drover: the daemon stopped while sending {len(self.accepted)} messages ({', '.join(self.accepted)}): "
                "each may or may not have arrived (`drover log --pending` lists the unfinished ones; `drover retry ID` "
                "finishes each exactly once)\n",
            )
            return EXIT_FAILED
        if self.accepting:
            _write(
                sys.stderr,
                "drover: the daemon stopped while recording a message: nothing was delivered, and it is not sent again "
                "(`drover log --pending` shows it if it was recorded)\n",
            )
            return EXIT_FAILED
        if not self.started or (not self.printed and self.rerun_safe()):
            return None
        _write(sys.stderr, "drover: the daemon stopped while running the command: not run again, as it may have had effects\n")
        return EXIT_FAILED

    def rerun_safe(self) -> bool:
        if self.command == "op":
            verb = _positional(self.rest)
            return verb is None or verb in RERUN_SAFE_OPS
        return self.command in RERUN_SAFE


def _write(stream: object, text: str) -> None:
    buffer = getattr(stream, "buffer", None)
    if buffer is not None:
        buffer.write(text.encode("utf-8", "surrogateescape"))
        buffer.flush()
    else:
        stream.write(text)  # type: ignore[attr-defined]
        stream.flush()  # type: ignore[attr-defined]


def _read_stdin() -> bytes:
    stream = getattr(sys.stdin, "buffer", None)
    if stream is not None:
        return bytes(stream.read())
    text = sys.stdin.read() if sys.stdin is not None else ""
    return text.encode("utf-8", "surrogateescape")


def control(path: str, message: dict[str, object], timeout: float = 5.0) -> dict | None:
    """One control exchange (status, stop) with the daemon at `path`; None when no daemon answers there."""
    try:
        sock = connect(path, timeout)
    except (OSError, paths.Unsafe):
        return None
    with sock:
        try:
            sock.sendall(wire.encode(message))
            line = sock.readline()
            return wire.decode(line)
        except (OSError, ValueError):
            return None


def unanswering(path: str) -> int | None:
    """The pid of a daemon that holds `path`'s lock (so it lives) but did not answer: stopped (SIGSTOP) or wedged."""
    import fcntl

    if not os.path.exists(path):
        return None
    try:
        fd = os.open(paths.daemon_lock(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            pass  # held: a daemon lives
        else:
            return None  # nobody holds it: no daemon, a stale socket
        pid = int(os.read(fd, 32).decode("ascii").strip() or "0")
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    if pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return pid
