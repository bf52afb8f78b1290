"""The daemon: one per user and environment, started on first use, gone after an idle timeout.

It listens on a 0600 Unix socket in a 0700 directory of the user's (drover/daemon/paths.py) and checks the peer's
uid on every connection.  Each request is a `drover` command line: it runs in a thread of its own, through the very
CLI a direct run uses (drover.cli.main.main), with the caller's argv, working directory, actor, stdin (fetched
only if the command reads it), terminal (isatty, width, TERM) -- and the caller's environment, which must equal the
daemon's own on every key the work reads (else the request is refused and the client runs it itself).  So it never
does more than the command would have done directly; what it adds is a pool, shared by all requests: one SSH
connection per host and up to HELPERS_PER_HOST helper processes kept running on it (the bundle shipped once).

Write-ahead in both modes: a send's `accepted` event is written by the same code; the daemon tells the client
`accepting` before it and `accepted` (with the id) after it, and each of those lines is in the client's socket
before the code goes on -- so a client whose daemon dies knows whether the message may have been delivered.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import fcntl
import io
import json
import os
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import drover
from drover.daemon import paths
from drover.daemon import protocol as wire

HELPERS_PER_HOST = 8  # below OpenSSH's MaxSessions (10 channels per connection)
DEFAULT_IDLE_S = 600.0
CLONE_FS = 0x200


# -- per-request I/O ---------------------------------------------------------------------------------------------


class Request:
    """One command being run for one client: its connection, its terminal, its stdin, its cancellation."""

    def __init__(self, daemon: Daemon, writer: asyncio.StreamWriter, msg: dict[str, Any]) -> None:
        self.daemon = daemon
        self.loop = daemon.loop
        self.writer = writer
        self.argv = [str(a) for a in msg.get("argv") or []]
        self.cwd = msg.get("cwd") if isinstance(msg.get("cwd"), str) else None
        self.actor = msg.get("actor") if isinstance(msg.get("actor"), str) and msg.get("actor") else None
        tty: dict[str, Any] = msg["tty"] if isinstance(msg.get("tty"), dict) else {}
        self.tty = {k: bool(tty.get(k)) for k in ("stdin", "stdout", "stderr")}
        cols = msg.get("cols")
        self.cols = cols if isinstance(cols, int) and 0 < cols < 10000 else 80
        term: dict[str, Any] = msg["term"] if isinstance(msg.get("term"), dict) else {}
        self.term = {str(k): str(v) for k, v in term.items()}
        self.stdin: asyncio.Future[str] | None = None
        self.gone = False
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

    def cancel(self) -> None:
        """The client went away (Ctrl-C, killed): cancel the command as Ctrl-C would cancel a direct run."""
        self.gone = True
        if self.stdin is not None and not self.stdin.done():
            self.stdin.set_result("")
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


class _Local(threading.local):
    stdout: Any = None
    stderr: Any = None
    stdin: Any = None
    consoles: dict[str, Any] | None = None


LOCAL = _Local()


class Switch:
    """sys.stdout (stderr, stdin) of the daemon: the current request's stream in a request's thread, else the real
    one (the daemon's log)."""

    def __init__(self, name: str, real: Any) -> None:
        self._name = name
        self._real = real

    def _target(self) -> Any:
        return getattr(LOCAL, self._name) or self._real

    def write(self, text: str) -> int:
        return int(self._target().write(text))

    def flush(self) -> None:
        self._target().flush()

    def isatty(self) -> bool:
        return bool(self._target().isatty())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target(), name)


class ConsoleSwitch:
    """render.out / render.err: the current request's rich Console (its width, colours, terminal) in a request's
    thread, else the daemon's own."""

    def __init__(self, name: str, real: Any) -> None:
        self._name = name
        self._real = real

    def __getattr__(self, name: str) -> Any:
        consoles = LOCAL.consoles
        return getattr(consoles[self._name] if consoles else self._real, name)


def _consoles(request: Request, out: Out, err: Out) -> dict[str, Any]:
    """The Consoles drover.cli.render would have made in the caller's process (same arguments; the caller's
    terminal width, and its TERM/COLORTERM/NO_COLOR/FORCE_COLOR through rich's `_environ`)."""
    from rich.console import Console

    common: dict[str, Any] = {"highlight": False, "markup": False, "emoji": False, "_environ": request.term}
    return {
        "out": Console(file=out, soft_wrap=False, width=request.cols if out.isatty() else 200, **common),  # type: ignore[arg-type]
        "err": Console(file=err, soft_wrap=True, width=request.cols, **common),  # type: ignore[arg-type]
    }


# -- running a command -------------------------------------------------------------------------------------------


def _own_cwd() -> bool:
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
            if not _own_cwd():  # checked at start (Daemon.own_cwd): this does not happen
                raise RuntimeError("cannot give the request its own working directory")
            os.chdir(request.cwd)
        LOCAL.stdout, LOCAL.stderr, LOCAL.stdin = out, err, In(request)
        LOCAL.consoles = _consoles(request, out, err)
        from drover.cli.app import state
        from drover.cli.main import main as cli_main

        state.make_context = request.daemon.context_maker(request)
        code = cli_main(request.argv)
    except (KeyboardInterrupt, asyncio.CancelledError):
        code = 130
    except BaseException as exc:  # noqa: BLE001 - the client gets a line and an exit code, the daemon goes on
        if isinstance(exc, SystemExit) and isinstance(exc.code, int):
            code = exc.code
        else:
            err.write(f"drover: internal error in the daemon: {type(exc).__name__}: {exc}\n")
    finally:
        LOCAL.stdout = LOCAL.stderr = LOCAL.stdin = LOCAL.consoles = None
    request.send({"t": "exit", "code": int(code)})
    request.loop.call_soon_threadsafe(request.daemon.finished, request)


# -- the pool ----------------------------------------------------------------------------------------------------


class Pool:
    """One SSHTransport per host (persistent mode), on the daemon's loop; requests reach it from their threads."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.links: dict[str, tuple[str, Any]] = {}
        self.closing: set[asyncio.Future[None]] = set()  # old links being closed (kept referenced until done)

    def _link(self, host: str, cfg: Any, defaults: Any, profiles: dict[str, Any]) -> Any:
        from drover.transport.ssh import SSHTransport

        # The fleet file is read again for every request; a host whose settings changed gets a new connection.
        key = json.dumps([cfg.model_dump(mode="json"), defaults.connect_timeout, profiles], sort_keys=True, default=str)
        known = self.links.get(host)
        if known is not None and known[0] == key:
            return known[1]
        if known is not None:
            self.closing.add(asyncio.ensure_future(known[1].close()))
        transport = SSHTransport(host, cfg, defaults, profiles, helpers=HELPERS_PER_HOST)
        self.links[host] = (key, transport)
        return transport

    async def call(self, host: str, cfg: Any, defaults: Any, profiles: dict[str, Any], op: str, args: Any, timeout: float) -> Any:
        transport = self._link(host, cfg, defaults, profiles)
        data = await transport.call(op, args, timeout=timeout)
        noticed, transport.warnings[:] = list(transport.warnings), []
        return data, noticed, transport.connect_seconds

    def status(self) -> list[dict[str, Any]]:
        rows = []
        for host, (_key, t) in sorted(self.links.items()):
            rows.append(
                {
                    "host": host,
                    "connected": t._conn is not None,
                    "helpers": len(t._idle) + t.busy,
                    "busy": t.busy,
                    "connects": t.connects,
                }
            )
        return rows

    async def close(self) -> None:
        for _key, transport in self.links.values():
            try:
                await transport.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
        self.links.clear()


class PooledTransport:
    """What a request's Context holds for an SSH host: calls go to the pool on the daemon's loop."""

    def __init__(self, request: Request, host: str, cfg: Any, defaults: Any, profiles: dict[str, Any]) -> None:
        self.request = request
        self.host = host
        self.cfg, self.defaults, self.profiles = cfg, defaults, profiles
        self.warnings: list[str] = []
        self.connect_seconds: float | None = None

    async def call(self, op: str, args: dict[str, Any], *, timeout: float) -> Any:
        loop = asyncio.get_running_loop()
        self.request.loops.add(loop)
        if self.request.gone:
            raise asyncio.CancelledError
        pool = self.request.daemon.pool
        future = asyncio.run_coroutine_threadsafe(
            pool.call(self.host, self.cfg, self.defaults, self.profiles, op, args, timeout), self.request.loop
        )
        try:
            data, noticed, self.connect_seconds = await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.cancel()
            raise
        self.warnings.extend(noticed)
        return data

    async def close(self) -> None:
        return None  # the connection and its helpers stay, for the next request


def context_class() -> type:
    """A Context whose SSH hosts go through the pool and whose truth file tells the client about a send's
    write-ahead record as it is made.  (Built on first use: importing the ops costs the daemon's start only.)"""
    from drover.fleet import LOCAL as LOCAL_HOST
    from drover.ops.core import Context
    from drover.truth import TruthFile

    class NotifyingTruth(TruthFile):
        request: Request

        def accept(self, **kwargs: Any) -> Any:
            if not self.request.send_now({"t": "accepting"}):
                raise asyncio.CancelledError  # the client is gone: nothing recorded, nothing sent
            result = super().accept(**kwargs)
            # In the client's socket before anything is delivered: if the daemon dies now, the client knows the id.
            self.request.send_now({"t": "accepted", "id": result[0]})
            return result

    @dataclass
    class DaemonContext(Context):
        request: Any = None

        @property
        def truth(self) -> TruthFile:
            truth = NotifyingTruth(self.home)
            truth.request = self.request
            return truth

        def transport(self, host: str) -> Any:
            # The loop this request's ops run on: cancelled if the client goes away (local work included).
            self.request.loops.add(asyncio.get_running_loop())
            if host not in self._transports:
                cfg = self.fleet.host(host)
                if host == LOCAL_HOST and not cfg.ssh:
                    return super().transport(host)
                profiles = self.fleet.profile_overrides()
                self._transports[host] = PooledTransport(self.request, host, cfg, self.fleet.defaults, profiles)
            return self._transports[host]

    return DaemonContext


# -- the daemon --------------------------------------------------------------------------------------------------


def _probe(check: Callable[[], bool]) -> bool:
    """`check()` run in a throwaway thread (unsharing changes the thread that does it)."""
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(check()), daemon=True)
    thread.start()
    thread.join(5)
    return bool(result and result[0])


def _peer_uid(sock: socket.socket) -> int:
    cred = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", cred)[1])


def _sources() -> dict[str, int]:
    """drover's source files and their mtimes: a daemon whose code changed under it (an upgrade, an edit) steps
    aside rather than run old code."""
    root = os.path.dirname(os.path.abspath(drover.__file__))
    found: dict[str, int] = {}
    for base, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(base, name)
                try:
                    found[path] = os.stat(path).st_mtime_ns
                except OSError:
                    pass
    return found


class Daemon:
    def __init__(self, path: str, idle_s: float) -> None:
        self.path = path
        self.idle_s = idle_s
        self.env = paths.environment()
        self.loop = asyncio.new_event_loop()
        self.pool = Pool(self.loop)
        self.started = time.time()
        self.last = time.monotonic()
        self.served = 0
        self.active: set[Request] = set()
        self.sources = _sources()
        self.stopping: asyncio.Event | None = None
        self.inode: int | None = None
        self._context_class: type | None = None
        self.own_cwd = _probe(_own_cwd)  # where threads cannot have their own directory, no request is taken
        from drover.fleet import find_path

        self._fleet_path = str(find_path(None)[0])
        self._fleet_seen: tuple[int, int] | None = (-1, -1)
        self._fleet_ok = True

    def context_maker(self, request: Request) -> Callable[..., Any]:
        if self._context_class is None:
            self._context_class = context_class()
        cls = self._context_class

        def make(fleet_path: str | None = None, actor: str | None = None, progress: Any = None) -> Any:
            # The caller's $DROVER_ACTOR stands where the daemon's own environment would (it has none: see main),
            # after --actor, exactly as Context.who orders them.  No progress bar: it would draw from another thread.
            return cls(fleet_path=fleet_path, actor=actor or request.actor, request=request)

        return make

    # -- serving --
    async def serve(self) -> None:
        self.stopping = asyncio.Event()
        old = os.umask(0o177)  # the socket is born 0600: there is no moment when others could connect
        try:
            server = await asyncio.start_unix_server(self.client, path=self.path, limit=wire.MAX_LINE)
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        self.inode = os.stat(self.path).st_ino
        version, pid = drover.__version__, os.getpid()
        print(f"drover daemon {version}: pid {pid}, socket {self.path}, idle timeout {self.idle_s:g}s", flush=True)
        watcher = asyncio.ensure_future(self.watch())
        await self.stopping.wait()
        server.close()
        self._unlink()
        watcher.cancel()
        # Requests already running finish (each within its own timeouts) before the connections close.
        while self.active:
            await asyncio.sleep(0.05)
        await self.pool.close()

    def _unlink(self) -> None:
        try:
            if os.stat(self.path).st_ino == self.inode:
                os.unlink(self.path)
        except OSError:
            pass

    def stop(self) -> None:
        if self.stopping is not None:
            self.stopping.set()

    async def watch(self) -> None:
        """Idle exit, and stepping aside when the socket was removed or replaced."""
        while True:
            await asyncio.sleep(max(0.05, min(self.idle_s / 4, 5.0)))
            if not self.active and time.monotonic() - self.last >= self.idle_s:
                print(f"idle for {self.idle_s:g}s: exiting", flush=True)
                self.stop()
                return
            try:
                if os.stat(self.path).st_ino != self.inode:
                    raise FileNotFoundError
            except OSError:
                print("the socket was removed or replaced: exiting", flush=True)
                self.stop()
                return

    async def client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        try:
            uid = _peer_uid(sock)
        except OSError:
            uid = -1
        if uid != os.getuid():
            writer.close()  # only the user can reach the socket (0600 in a 0700 directory); this is the last check
            return
        writer.transport.set_write_buffer_limits(high=0)
        try:
            line = await reader.readline()
            msg = wire.decode(line)
        except (ValueError, OSError, asyncio.LimitOverrunError, asyncio.IncompleteReadError):
            writer.close()
            return
        kind = msg.get("t")
        if kind == "status":
            writer.write(wire.encode({"t": "status", **self.status()}))
        elif kind == "stop":
            writer.write(wire.encode({"t": "stopping", "pid": os.getpid()}))
            self.stop()
        elif kind == "run":
            await self.run(msg, reader, writer)
        try:
            await writer.drain()
            writer.close()
        except OSError:
            pass

    def refusal(self, msg: dict[str, Any]) -> str | None:
        if msg.get("v") != wire.VERSION:
            return f"protocol {msg.get('v')!r}, the daemon speaks {wire.VERSION}"
        if msg.get("env") != self.env:
            return "the caller's environment differs from the daemon's"
        from drover.daemon.client import HOT, command_of

        argv = msg.get("argv")
        if not isinstance(argv, list) or command_of([str(a) for a in argv])[0] not in HOT:
            return "the daemon runs only the hot commands (send, ls, status, wait, op, read, log)"
        if not self.own_cwd:
            return "requests cannot have their own working directory here (no unshare(CLONE_FS))"
        if self.stopping is not None and self.stopping.is_set():
            return "the daemon is stopping"
        if _sources() != self.sources:
            self.stop()
            return "drover's code changed since the daemon started"
        if not self.fleet_allows():
            self.stop()
            return "the fleet file turns persistent mode off (daemon = false)"
        return None

    def fleet_allows(self) -> bool:
        """`daemon = false` in the fleet file stops a running daemon too (read again whenever the file changes)."""
        from drover.daemon.client import fleet_allows

        try:
            st = os.stat(self._fleet_path)
            seen: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except OSError:
            seen = None
        if seen != self._fleet_seen:
            self._fleet_seen, self._fleet_ok = seen, fleet_allows([])
        return self._fleet_ok

    async def run(self, msg: dict[str, Any], reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        why = self.refusal(msg)
        if why is not None:
            writer.write(wire.encode({"t": "refuse", "why": why}))
            return
        request = Request(self, writer, msg)
        self.last = time.monotonic()  # only commands count as use: `drover daemon status` does not keep it alive
        self.active.add(request)
        self.served += 1
        writer.write(wire.encode({"t": "started"}))
        threading.Thread(target=run_request, args=(request,), name="drover-request", daemon=True).start()
        # Read what the client sends while the command runs: its stdin, or its end (Ctrl-C, killed).
        while request in self.active:
            try:
                line = await reader.readline()
            except (OSError, ValueError, asyncio.LimitOverrunError):
                line = b""
            if not line:
                if request in self.active:
                    request.cancel()
                break
            try:
                got = wire.decode(line)
            except ValueError:
                continue
            if got.get("t") == "stdin" and request.stdin is not None and not request.stdin.done():
                request.stdin.set_result(str(got.get("d", "")))
        while request in self.active:
            await asyncio.sleep(0.02)

    def finished(self, request: Request) -> None:
        self.active.discard(request)
        self.last = time.monotonic()
        request.writer.close()  # after `exit` (queued before this): the client needs nothing more

    def status(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "version": drover.__version__,
            "socket": self.path,
            "uptime_s": round(time.time() - self.started, 1),
            "served": self.served,
            "active": len(self.active),
            "idle_s": round(time.monotonic() - self.last, 1),
            "idle_timeout_s": self.idle_s,
            "hosts": self.pool.status(),
        }


# -- main --------------------------------------------------------------------------------------------------------


class Built:
    """The typer app, its click command built once (see main)."""

    def __init__(self, command: Any) -> None:
        self.command = command

    def __call__(self, **kwargs: Any) -> Any:
        return self.command.main(**kwargs)


def idle_setting(explicit: float | None) -> float:
    """--idle, else $DROVER_DAEMON_IDLE_S, else `daemon_idle_s` under [defaults] in the fleet file, else 10 minutes."""
    if explicit is not None:
        return explicit
    env = os.environ.get("DROVER_DAEMON_IDLE_S")
    if env:
        try:
            return max(0.1, float(env))
        except ValueError:
            pass
    try:
        from drover.fleet import load

        value = getattr(load(None)[0].defaults, "daemon_idle_s", None)
        if isinstance(value, int | float) and value > 0:
            return float(value)
    except Exception:  # noqa: BLE001 - an invalid fleet file is each request's problem, not the daemon's
        pass
    return DEFAULT_IDLE_S


def lock(path: str) -> int | None:
    """The daemon's lock, held for its life: a second daemon for the same socket (a race of first uses) leaves."""
    fd = os.open(path[: -len(".sock")] + ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="drover daemon", description="drover's persistent daemon (see drover daemon --help)")
    parser.add_argument("--socket", default=None, help="the socket (default: the one for this environment)")
    parser.add_argument("--idle", type=float, default=None, help="seconds idle before exiting")
    args = parser.parse_args(argv)
    path = args.socket or paths.socket_path()
    try:
        paths.ensure_dir(os.path.dirname(path))
    except (OSError, paths.Unsafe) as exc:
        print(f"drover daemon: {exc}", file=sys.stderr)
        return 7
    held = lock(path)
    if held is None:
        print("drover daemon: another daemon holds this socket's lock: leaving", flush=True)
        return 0
    # Requests bring their own actor; the daemon's must not stand in for a caller that has none.
    os.environ.pop("DROVER_ACTOR", None)
    try:
        os.unlink(path)  # stale: its daemon is gone (we hold the lock that a live one would hold)
    except FileNotFoundError:
        pass
    # Import the CLI and the ops now, once, so the first request does not pay for them.
    import typer.main

    from drover.cli import main as cli
    from drover.cli import render

    # typer builds its click command from the functions' signatures on every call: ~35 ms, most of a warm
    # request.  The daemon builds it once; main() then calls it exactly as typer's __call__ would.
    cli.app = Built(typer.main.get_command(cli.app))  # type: ignore[assignment]

    render.out = ConsoleSwitch("out", render.out)  # type: ignore[assignment]
    render.err = ConsoleSwitch("err", render.err)  # type: ignore[assignment]
    sys.stdout = Switch("stdout", sys.stdout)
    sys.stderr = Switch("stderr", sys.stderr)
    sys.stdin = Switch("stdin", sys.stdin)
    import drover.ops  # registers every op
    import drover.transport.ssh  # noqa: F401 - imported now, not by the first request

    daemon = Daemon(path, idle_setting(args.idle))
    loop = daemon.loop
    asyncio.set_event_loop(loop)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, daemon.stop)
    try:
        loop.run_until_complete(daemon.serve())
    finally:
        loop.close()
        os.close(held)
    return 0


if __name__ == "__main__":
    sys.exit(main())
