"""One command run for one client: its connection, its streams, its terminal, its thread.

The daemon runs each request in a thread of its own, through the program it was handed when `drover daemon` started
it (the very CLI a direct run uses, `main(argv, env)`): with an Environment built here from the caller's streams
(stdout and stderr sent back, stdin fetched only if read), its terminal (isatty, width, TERM and colour variables)
and a Context from the daemon (the pool, the caller's actor); its working directory is the caller's
(unshare(CLONE_FS)).  Nothing of the process is swapped: the daemon's own sys.stdout stays its log.
"""

from __future__ import annotations

import asyncio
import ctypes
import io
import os
import threading
from typing import TYPE_CHECKING, Any

from drover.daemon import wire
from drover.environment import Environment

if TYPE_CHECKING:
    from drover.daemon.server import Daemon

CLONE_FS = 0x200


# -- per-request I/O ---------------------------------------------------------------------------------------------


class Request:
    """One command being run for one client: its connection, its terminal, its stdin, its cancellation."""

    def __init__(self, daemon: Daemon, writer: asyncio.StreamWriter, msg: dict[str, Any]) -> None:
        self.daemon = daemon
        self.loop = daemon.loop
        self.writer = writer
        self.argv = [str(a) for a in msg.get("argv") or []]
        self.peer_pid: int | None = None  # the client's, from SO_PEERCRED (drover/self_session.py reads it)
        self.cwd = msg.get("cwd") if isinstance(msg.get("cwd"), str) else None
        self.actor = msg.get("actor") if isinstance(msg.get("actor"), str) and msg.get("actor") else None
        tty: dict[str, Any] = msg["tty"] if isinstance(msg.get("tty"), dict) else {}
        self.tty = {k: bool(tty.get(k)) for k in ("stdin", "stdout", "stderr")}
        cols = msg.get("cols")
        self.cols = cols if isinstance(cols, int) and 0 < cols < 10000 else 80
        term: dict[str, Any] = msg["term"] if isinstance(msg.get("term"), dict) else {}
        self.term = {str(k): str(v) for k, v in term.items()}
        self.stdin: asyncio.Future[str] | None = None
        self.gone = False  # the client's connection ended: nothing more reaches it
        self.interrupted = False  # the command is cancelled: Ctrl-C, or a client gone before anything was on its way
        # A message is being recorded or is on its way: from here a client that disappears no longer cancels the
        # command (a kill -9 is no Ctrl-C): it runs to its end, and the record says what really became of it.
        self.delivering = False
        self._state = threading.Lock()  # the two decisions above, taken one at a time (request thread, daemon loop)
        self.over = False  # the command has ended (its exit is queued): a client closing now is just done with us
        self.loops: set[asyncio.AbstractEventLoop] = set()

    # called from the request's thread
    def send(self, message: dict[str, Any]) -> None:
        """Queue a message to the client (in order with everything else this request sends)."""
        self.loop.call_soon_threadsafe(self._write, wire.encode(message))

    def send_now(self, message: dict[str, Any]) -> bool:
        """Send a message and wait until it is in the client's socket (False: the client is gone)."""
        future = asyncio.run_coroutine_threadsafe(self._flush(wire.encode(message)), self.loop)
        try:
            return future.result(timeout=30)
        except Exception:  # noqa: BLE001 - a client that stopped reading is a client that is gone
            return False

    def read_stdin(self) -> str:
        future = asyncio.run_coroutine_threadsafe(self._ask_stdin(), self.loop)
        return future.result()

    # on the daemon's loop
    def _write(self, data: bytes) -> None:
        if not self.gone and not self.writer.is_closing():
            self.writer.write(data)

    async def _flush(self, data: bytes) -> bool:
        if self.gone or self.writer.is_closing():
            return False
        self.writer.write(data)
        await self.writer.drain()  # the write buffer limit is 0: drained means handed to the kernel
        return not self.gone

    async def _ask_stdin(self) -> str:
        if self.stdin is None:
            self.stdin = self.loop.create_future()
            self._write(wire.encode({"t": "stdin?"}))
        return await asyncio.shield(self.stdin)

    def begin_delivery(self) -> bool:
        """Called before a message is recorded: False when the command was cancelled (record nothing, send
        nothing); else from now on only an interrupt cancels it."""
        with self._state:
            if self.interrupted:
                return False
            self.delivering = True
            return True

    def disconnected(self) -> bool:
        """The client's connection ended without an interrupt (killed, or it gave up on a silent daemon).  Before
        anything was recorded the command is cancelled (nothing to finish); after, it runs to its end.  True:
        cancelled."""
        with self._state:
            self.gone = True
            if self.delivering:
                return False
            self.interrupted = True
        self._cancel()
        return True

    def interrupt(self) -> None:
        """Ctrl-C by a client that is there: cancel the command as Ctrl-C would cancel a direct run (a send on its
        way records `interrupted`)."""
        with self._state:
            self.gone = self.interrupted = True
        self._cancel()

    def _cancel(self) -> None:
        if self.stdin is not None and not self.stdin.done():
            self.stdin.cancel()  # not an empty text: the command ends there, having read nothing
        for loop in list(self.loops):
            try:
                loop.call_soon_threadsafe(_cancel_all, loop)
            except RuntimeError:
                pass  # that loop has finished


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    for task in asyncio.all_tasks(loop):
        task.cancel()


class Out(io.TextIOBase):
    """The caller's stdout or stderr, as the request's thread sees it."""

    def __init__(self, request: Request, kind: str) -> None:
        self.request = request
        self.kind = kind
        self.buffer = _Bytes(self)

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            # A text stream takes str only: click probes a stream with b"" to find out whether it is binary
            # (then writes bytes, e.g. a command's --help, to it) -- it must find .buffer instead.
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if text:
            self.request.send({"t": "out" if self.kind == "stdout" else "err", "d": text})
        return len(text)

    def isatty(self) -> bool:
        return self.request.tty[self.kind]

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    @property
    def errors(self) -> str:  # type: ignore[override]
        return "strict"  # with the encoding, what makes click write to this stream as it is (not wrap its buffer)

    def fileno(self) -> int:
        raise io.UnsupportedOperation("the caller's stream has no descriptor here")


class _Bytes:
    def __init__(self, out: Out) -> None:
        self.out = out

    def write(self, data: bytes) -> int:
        self.out.write(bytes(data).decode("utf-8", "surrogateescape"))
        return len(data)

    def flush(self) -> None:
        return None


class In(io.TextIOBase):
    """The caller's stdin: fetched from the client the first time the command reads it, never otherwise."""

    def __init__(self, request: Request) -> None:
        self.request = request
        self.buffer = _InBytes(self)
        self._data: str | None = None

    def data(self) -> str:
        if self._data is None:
            self._data = self.request.read_stdin()
        return self._data

    def read(self, size: int | None = -1) -> str:
        return self.data().encode("utf-8", "surrogateescape").decode("utf-8", "replace")

    def isatty(self) -> bool:
        return self.request.tty["stdin"]

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        raise io.UnsupportedOperation("the caller's stdin has no descriptor here")


class _InBytes:
    def __init__(self, inp: In) -> None:
        self.inp = inp

    def read(self, size: int = -1) -> bytes:
        return self.inp.data().encode("utf-8", "surrogateescape")


# -- running a command -------------------------------------------------------------------------------------------


def own_cwd() -> bool:
    """Give this thread a working directory of its own (Linux: unshare(CLONE_FS)), so requests from different
    directories can run at once.  False where that is not possible."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.unshare(CLONE_FS)) == 0
    except (OSError, AttributeError):
        return False


def run_request(request: Request) -> None:
    """The request's thread: the CLI, exactly as a direct run would call it, with the caller's state."""
    code = 1
    out, err = Out(request, "stdout"), Out(request, "stderr")
    try:
        if request.cwd is not None:
            if not own_cwd():  # checked at start (Daemon.own_cwd): this does not happen
                raise RuntimeError("cannot give the request its own working directory")
            os.chdir(request.cwd)
        env = Environment(
            stdin=In(request),
            stdout=out,
            stderr=err,
            tty=request.tty,
            columns=request.cols,
            # The caller's TERM/COLORTERM/NO_COLOR/FORCE_COLOR/COLUMNS, as rich would have read them there.
            term=request.term,
            make_context=request.daemon.context_maker(request),
        )
        code = request.daemon.program(request.argv, env)
    except (KeyboardInterrupt, asyncio.CancelledError):
        code = 130
    except BaseException as exc:  # noqa: BLE001 - the client gets a line and an exit code, the daemon goes on
        if isinstance(exc, SystemExit) and isinstance(exc.code, int):
            code = exc.code
        else:
            err.write(f"drover: internal error in the daemon: {type(exc).__name__}: {exc}\n")
    request.over = True  # before the exit goes: a client that reads it and closes is not one that went away
    request.send({"t": "exit", "code": int(code)})
    request.loop.call_soon_threadsafe(request.daemon.finished, request)
