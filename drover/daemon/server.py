"""The daemon: one per user and environment, started on first use, gone after an idle timeout.

It listens on a 0600 Unix socket in a 0700 directory of the user's (drover/paths.py) and checks the peer's
uid on every connection.  Each request is a `drover` command line: it runs in a thread of its own, through the
program `drover daemon` handed the daemon when it started it (the very CLI a direct run uses), with the caller's
argv, working directory, actor, stdin (fetched only if the command reads it), terminal (isatty, width, TERM) -- and
the caller's environment, which must equal the daemon's own on every key the work reads (else the request is refused
and the client runs it itself).  So it never does more than the command would have done directly
(drover/daemon/request.py); what it adds is a pool, shared by all requests: one SSH connection per host and up to
HELPERS_PER_HOST helper processes kept running on it, the bundle shipped once (drover/daemon/pool.py).

Write-ahead in both modes: a send's `accepted` event is written by the same code; the daemon tells the client
`accepting` before it and `accepted` (with the id) after it, and each of those lines is in the client's socket
before the code goes on -- so a client whose daemon dies knows whether the message may have been delivered.
The other way round, a client that dies (kill -9, a closed terminal) after that point does not cancel the send:
only an `interrupt` from a client that is there (Ctrl-C) does; else the delivery runs to its end and the record
holds its real outcome.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import os
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import drover
from drover import paths
from drover.daemon import wire
from drover.daemon.pool import Pool, context_class, max_links, raise_descriptor_limit
from drover.daemon.request import Request, own_cwd, run_request
from drover.environment import Environment

DEFAULT_IDLE_S = 600.0
HEARTBEAT_S = 1.0  # while a command runs, the client hears from the daemon at least this often (client.SILENCE_TIMEOUT_S)

# What the daemon runs each request through: the `drover` program, `main(argv, env)` -> exit code.  Handed in by
# whoever starts the daemon (`drover daemon`, drover/cli/daemon_cmds.py): the daemon never imports the CLI.
Program = Callable[[list[str], Environment], int]


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


def _peer_pid(writer: asyncio.StreamWriter) -> int | None:
    """The client's pid, from the kernel (never from what it says): which session a command runs in follows from it."""
    try:
        cred = writer.get_extra_info("socket").getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return int(struct.unpack("3i", cred)[0])
    except (OSError, AttributeError):
        return None


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
    def __init__(self, path: str, idle_s: float, program: Program) -> None:
        self.path = path
        self.program = program
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
        self.own_cwd = _probe(own_cwd)  # where threads cannot have their own directory, no request is taken
        from drover.fleet import find_path

        self._fleet_path = str(find_path(None)[0])  # the daemon's own: `daemon = false` there stops it
        self._fleets: dict[str, tuple[tuple[int, int, int] | None, bool]] = {}
        self.watched = time.monotonic()  # the first watch round comes one interval after the start
        self.watching: asyncio.Future[None] | None = None

    def context_maker(self, request: Request) -> Callable[..., Any]:
        if self._context_class is None:
            self._context_class = context_class()
        cls = self._context_class

        def make(
            fleet_path: str | None = None, actor: str | None = None, progress: Any = None, exit_on_interrupt: bool = False
        ) -> Any:
            # The caller's $DROVER_ACTOR stands where the daemon's own environment would (it has none: see main),
            # after --actor, exactly as Context.who orders them.  No progress bar: it would draw from another thread.
            # Nor exit_on_interrupt: the daemon lives on after a request (and its ops run on threads, not signals').
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
        if self.watching is not None and not self.watching.done():
            await asyncio.wait([self.watching], timeout=30)  # its records are written under locks: let it end
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
        """Idle exit, and stepping aside when the socket was removed or replaced; between requests, the fleet's
        `watch_interval` runs `drover watch run` (drover/ops/watch.py) while the daemon lives."""
        while True:
            await asyncio.sleep(max(0.05, min(self.idle_s / 4, 5.0)))
            if not self.active and (self.watching is None or self.watching.done()) and self._watch_due():
                self.watching = asyncio.ensure_future(self.watch_round())
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

    def _watch_due(self) -> bool:
        interval = self._watch_interval()
        return interval > 0 and time.monotonic() - self.watched >= interval

    def _watch_interval(self) -> float:
        try:
            from drover.fleet import load

            return float(load(None)[0].defaults.watch_interval)
        except Exception:  # noqa: BLE001 - an invalid fleet file is each request's problem, not the daemon's
            return 0.0

    async def watch_round(self) -> None:
        """One `watch.run` of the daemon's own, on direct connections closed after it: it never counts as use
        (the idle exit stands), never waits for a cron run's lock (the next round comes soon), never raises."""
        from drover.ops.core import Context, run_async

        self.watched = time.monotonic()
        ctx = Context()
        try:
            doc = await run_async(ctx, "watch.run", {"lock_wait_s": 0})
            data = doc.data or {}
            if data.get("exited") or data.get("resolved") or data.get("notices") or doc.errors:
                said = {k: len(data.get(k) or []) for k in ("exited", "notices", "resolved")}
                print(f"watch round: {said}, errors: {[e.get('message') for e in doc.errors]}", flush=True)
        except Exception as exc:  # noqa: BLE001 - a bug in a round must not end the daemon's service
            print(f"watch round failed: {type(exc).__name__}: {exc}", flush=True)
        finally:
            await ctx.close()
            self.watched = time.monotonic()

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
        deadline = msg.get("deadline")
        if isinstance(deadline, int | float) and time.time() > deadline:
            return "too late: the caller has given up waiting and runs the command itself"
        if msg.get("env") != self.env:
            return "the caller's environment differs from the daemon's"
        from drover.daemon.client import HOT, asks_completion, command_of

        argv = msg.get("argv")
        if not isinstance(argv, list) or command_of([str(a) for a in argv])[0] not in HOT:
            return "the daemon runs only the hot commands (send, ls, status, wait, op, read, log)"
        if asks_completion([str(a) for a in argv]):
            return "shell completion is the caller's shell's: it runs there"
        if not self.own_cwd:
            return "requests cannot have their own working directory here (no unshare(CLONE_FS))"
        if self.stopping is not None and self.stopping.is_set():
            return "the daemon is stopping"
        if _sources() != self.sources:
            self.stop()
            return "drover's code changed since the daemon started"
        from drover.daemon.autostart import fleet_of

        cwd = str(msg["cwd"]) if isinstance(msg.get("cwd"), str) else "/"
        fleet = os.path.join(cwd, os.path.expanduser(fleet_of([str(a) for a in argv], self.env)))
        if not self.fleet_allows(fleet):
            if os.path.realpath(fleet) == os.path.realpath(self._fleet_path):
                self.stop()  # the daemon's own fleet file turned it off
            return "the fleet file turns persistent mode off (daemon = false)"
        return None

    def fleet_allows(self, path: str) -> bool:
        """`daemon = false` in the request's fleet file (its path resolved against the caller's working directory),
        read again whenever the file changes."""
        from drover.daemon.autostart import fleet_file_allows

        try:
            st = os.stat(path)
            seen: tuple[int, int, int] | None = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            seen = None
        known = self._fleets.get(path)
        if known is None or known[0] != seen:
            if len(self._fleets) > 256:
                self._fleets.clear()
            known = self._fleets[path] = (seen, fleet_file_allows(path))
        return known[1]

    async def run(self, msg: dict[str, Any], reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        why = self.refusal(msg)
        if why is not None:
            writer.write(wire.encode({"t": "refuse", "why": why}))
            return
        request = Request(self, writer, msg)
        request.peer_pid = _peer_pid(writer)
        self.last = time.monotonic()  # only commands count as use: `drover daemon status` does not keep it alive
        self.active.add(request)
        self.served += 1
        writer.write(wire.encode({"t": "started"}))
        threading.Thread(target=run_request, args=(request,), name="drover-request", daemon=True).start()
        beats = asyncio.ensure_future(self.heartbeat(request))
        try:
            await self._follow(request, reader)
        finally:
            beats.cancel()

    async def heartbeat(self, request: Request) -> None:
        """`beat` every HEARTBEAT_S while the command runs: a client that stops hearing them gives up on us."""
        while request in self.active:
            await asyncio.sleep(HEARTBEAT_S)
            request._write(wire.encode({"t": "beat"}))

    async def _follow(self, request: Request, reader: asyncio.StreamReader) -> None:
        # Read what the client sends while the command runs: its stdin, its Ctrl-C, or its end (killed, gave up).
        while request in self.active:
            try:
                line = await reader.readline()
            except (OSError, ValueError, asyncio.LimitOverrunError):
                line = b""
            if not line:
                # Only a client that is there can interrupt: one that vanished mid-send (kill -9, a closed
                # terminal) leaves its message to be delivered and recorded as it really went.
                if request in self.active and not request.interrupted and not request.over:
                    from drover.daemon.client import command_of

                    what = command_of(request.argv)[0]
                    if request.disconnected():
                        said = f"a client went away (drover {what}): its command is cancelled, nothing was on its way"
                    else:
                        said = f"a client went away mid-send (drover {what}): the send runs to its end and is recorded"
                    print(said, flush=True)
                break
            try:
                got = wire.decode(line)
            except ValueError:
                continue
            if got.get("t") == "interrupt":
                request.interrupt()
            elif got.get("t") == "stdin" and request.stdin is not None and not request.stdin.done():
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
            "max_links": max_links(),  # hosts that may keep a connection; past it the least recently used is closed
            "evicted": self.pool.evicted,
        }


# -- main --------------------------------------------------------------------------------------------------------


def idle_setting(explicit: float | None) -> float:
    """--idle, else $DROVER_DAEMON_IDLE_S, else `daemon_idle_s` under [defaults] in the fleet file, else 10 minutes."""
    if explicit is not None:
        return explicit
    env = os.environ.get("DROVER_DAEMON_IDLE_S")
    if env:
        try:
            return max(0.1, paths.parse_duration(env))
        except ValueError:  # not a duration: as if unset (the daemon has no one to tell)
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
    fd = os.open(paths.daemon_lock(path), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    # Its pid, for `drover daemon status` to name a daemon that holds the lock but does not answer (stopped).
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _duration(value: str) -> float:
    """--idle by drover's one duration grammar; argparse shows the grammar's message for anything else (exit 2)."""
    try:
        return paths.parse_duration(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv: list[str] | None, program: Program) -> int:
    """Serve requests through `program` until idle, stopped, or stepped aside; the exit code."""
    parser = argparse.ArgumentParser(prog="drover daemon", description="drover's persistent daemon (see drover daemon --help)")
    parser.add_argument("--socket", default=None, help="the socket (default: the one for this environment)")
    parser.add_argument("--idle", type=_duration, default=None, help=f"how long idle before exiting ({paths.DURATION_FORMS})")
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
    raise_descriptor_limit()  # a connection per host it keeps: room for more hosts (max_links follows the limit)
    try:
        os.unlink(path)  # stale: its daemon is gone (we hold the lock that a live one would hold)
    except FileNotFoundError:
        pass
    # Import the ops now, once, so the first request does not pay for them (the CLI is imported: it started us).
    import drover.ops

    drover.ops.register_all()
    import drover.transport.ssh

    daemon = Daemon(path, idle_setting(args.idle), program)
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
