"""drover for scripts: every op by name, its JSON document back as a dict, SSH connections kept between calls.

    import drover
    doc = drover.run("sessions.list", hosts=["h1"])            # {"drover": 1, "op", "ok", "data", "errors"}
    doc = await drover.arun("sessions.wait", host="h1", id="worker-1")
    with drover.Client(fleet="fleet.toml", actor="coordinator") as c: c.run(...)
    async with drover.AsyncClient(actor="coordinator") as c: await c.run(...)

Where an op runs: in a running daemon when there is one (its pool of connections, shared with every `drover`
command), else in this process, over a pool of its own -- one SSH connection per host, with helper processes
kept running on it, for as long as the client lives.  `drover.run` and `drover.arun` share one process-wide
client, which runs on a thread of its own: so `drover.run` works from inside a running event loop too (it blocks
that loop while it waits, as any blocking call does; `await drover.arun(...)` does not).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import os
import threading
import weakref
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from drover.daemon import client as daemon_client
from drover.daemon import library as daemon_library
from drover.daemon.pool import LinkedTransport, Pool
from drover.ops import Context, run_async

T = TypeVar("T")


class Reply(dict[str, Any]):
    """An op's document -- exactly what `drover op` prints, as a dict: {"drover": 1, "op", "ok", "data",
    "errors"} -- with its fields readable as attributes too, and the exit code the CLI would end with."""

    __slots__ = ("exit_code",)

    def __init__(self, doc: dict[str, Any], exit_code: int) -> None:
        super().__init__(doc)
        self.exit_code = exit_code

    @property
    def ok(self) -> bool:
        return bool(self["ok"])

    @property
    def op(self) -> str:
        return str(self["op"])

    @property
    def data(self) -> Any:
        return self["data"]

    @property
    def errors(self) -> list[dict[str, Any]]:
        return self["errors"]

    def to_dict(self) -> dict[str, Any]:
        return dict(self)


def _payload(args: dict[str, Any] | None, fields: dict[str, Any]) -> dict[str, Any]:
    """The request: a dict, keyword arguments, or both (the keywords win)."""
    if args is None:
        return dict(fields)
    if not isinstance(args, dict):
        raise TypeError(f"an op's arguments are a dict or keyword arguments, not {type(args).__name__}")
    return {**args, **fields}


@dataclass
class _PoolContext(Context):
    """A Context whose SSH hosts go through the client's pool (the daemon's DaemonContext, without a daemon)."""

    pool: Any = None

    def transport(self, host: str) -> Any:
        if host not in self._transports:
            route = self.route(host)  # unknown host -> UnknownHost
            if route.local:
                return super().transport(host)
            self._transports[host] = LinkedTransport(self.pool, host, route.config, route.defaults, dict(route.profiles))
        return self._transports[host]


class _Core:
    """What both clients do, on one event loop: the daemon if one runs, else the op here over a pool."""

    def __init__(
        self, fleet: str | os.PathLike[str] | None, actor: str | None, home: str | os.PathLike[str] | None, daemon: bool
    ) -> None:
        self.fleet = os.fspath(fleet) if fleet is not None else None
        self.actor = actor
        self.home = Path(home) if home is not None else None
        # A truth file of the caller's own choosing is something the daemon cannot be told: such a client runs here.
        self.daemon = daemon and self.home is None
        self.pool: Pool | None = None
        self.served_by_daemon = 0
        self.running: set[asyncio.Task[Any]] = set()  # the ops at work, which a Client's close() lets unwind

    async def run(self, name: str, payload: dict[str, Any]) -> Reply:
        task = asyncio.current_task()
        assert task is not None
        self.running.add(task)
        try:
            return await self._run(name, payload)
        finally:
            self.running.discard(task)

    async def _run(self, name: str, payload: dict[str, Any]) -> Reply:
        if self.daemon and daemon_client.enabled():
            try:
                doc, code = await daemon_library.run(name, payload, self.fleet, self.actor)
            except daemon_library.Refused:
                pass  # nothing was done there: done here
            else:
                self.served_by_daemon += 1
                return Reply(doc, code)
        if self.pool is None:
            self.pool = Pool(asyncio.get_running_loop())
        ctx = _PoolContext(fleet_path=self.fleet, actor=self.actor, home=self.home, pool=self.pool)
        try:
            document = await run_async(ctx, name, payload)
        finally:
            await ctx.close()
        return Reply(document.to_dict(), document.exit_code)

    def connections(self) -> dict[str, int]:
        """Per host: how many SSH connections this client has opened so far (its own pool; not the daemon's)."""
        if self.pool is None:
            return {}
        return {row["host"]: int(row["connects"]) for row in self.pool.status()}

    async def close(self) -> None:
        if self.pool is not None:
            pool, self.pool = self.pool, None
            await pool.close()
            if pool.closing:
                await asyncio.wait(set(pool.closing), timeout=5)


class AsyncClient:
    """A client on the caller's event loop: `async with drover.AsyncClient() as c: doc = await c.run(op, **args)`.

    Its connections belong to that loop and are closed by `aclose()` (or leaving the `async with`)."""

    def __init__(
        self,
        fleet: str | os.PathLike[str] | None = None,
        actor: str | None = None,
        home: str | os.PathLike[str] | None = None,
        daemon: bool = True,
    ) -> None:
        """`fleet`: the fleet file (default: $DROVER_FLEET, else ~/.config/drover/fleet.toml); `actor`: who sends
        (default: $DROVER_ACTOR, else user@host); `home`: the truth file's directory (default: $DROVER_HOME);
        `daemon`: use a running daemon when there is one (never started from here)."""
        self._core = _Core(fleet, actor, home, daemon)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    async def run(self, op: str, args: dict[str, Any] | None = None, /, **fields: Any) -> Reply:
        """Run one op; its document.  Failures are in the document (`ok` false, `errors`), never raised."""
        if self._closed:
            raise RuntimeError("this drover.AsyncClient is closed")
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise RuntimeError("a drover.AsyncClient belongs to the event loop it was first used on; make one per loop")
        return await self._core.run(op, _payload(args, fields))

    def connections(self) -> dict[str, int]:
        return self._core.connections()

    async def aclose(self) -> None:
        self._closed = True
        await self._core.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()


class Client:
    """A client for synchronous code: `with drover.Client() as c: doc = c.run(op, **args)`.

    Its ops run on an event loop of its own, on a thread of its own (started on first use), which keeps its
    connections between calls -- so it works the same from plain code, from other threads, and from inside a
    running event loop.  `await c.arun(...)` runs an op there without blocking the caller's loop."""

    def __init__(
        self,
        fleet: str | os.PathLike[str] | None = None,
        actor: str | None = None,
        home: str | os.PathLike[str] | None = None,
        daemon: bool = True,
    ) -> None:
        """The same settings as AsyncClient's."""
        self._core = _Core(fleet, actor, home, daemon)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._closed = False
        # The calls in flight, so that close() can end them: a call whose loop stopped under it would wait forever.
        self._inflight: set[concurrent.futures.Future[Any]] = set()
        self._ended: set[concurrent.futures.Future[Any]] = set()  # those close() ended

    def _start(self) -> asyncio.AbstractEventLoop:
        """The client's loop, started on first use (called with self._lock held)."""
        if self._closed:
            raise RuntimeError("this drover.Client is closed")
        if self._loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="drover-client", daemon=True)
            thread.start()
            self._loop, self._thread = loop, thread
            # A client dropped without close(): its connections and thread go when it is collected.
            self._finalizer = weakref.finalize(self, _stop, loop, self._core)
            # Not at exit: _stop does not wait, and the process would end with its closing task pending ("Task was
            # destroyed but it is pending!").  drover.run's client is closed at exit by close(), which waits.
            self._finalizer.atexit = False
        return self._loop

    def _submit(self, work: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        # Under the lock: a close() that starts now sees this call among those it must end.
        with self._lock:
            try:
                loop = self._start()
            except BaseException:
                work.close()
                raise
            future = asyncio.run_coroutine_threadsafe(work, loop)
            self._inflight.add(future)
        future.add_done_callback(self._inflight.discard)
        return future

    def _closed_under(self, future: concurrent.futures.Future[Any]) -> RuntimeError | None:
        if future in self._ended:
            return RuntimeError(
                "this drover.Client was closed while the call ran: the op was stopped where it was, as Ctrl-C "
                "stops a command (a message it had recorded shows in messages.list with pending)"
            )
        return None

    def run(self, op: str, args: dict[str, Any] | None = None, /, **fields: Any) -> Reply:
        """Run one op and wait for its document.  Failures are in the document (`ok` false, `errors`), never raised."""
        if self._thread is not None and threading.current_thread() is self._thread:
            raise RuntimeError("drover.Client.run called from inside one of its own ops")
        future = self._submit(self._core.run(op, _payload(args, fields)))
        try:
            return future.result()
        except BaseException as exc:
            future.cancel()  # Ctrl-C while waiting: the op is cancelled as a direct run's would be
            closed = self._closed_under(future)
            if closed is not None:
                raise closed from exc
            raise

    async def arun(self, op: str, args: dict[str, Any] | None = None, /, **fields: Any) -> Reply:
        """As run, awaited: the op runs on this client's loop, the caller's loop goes on meanwhile."""
        future = self._submit(self._core.run(op, _payload(args, fields)))
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError as exc:
            closed = self._closed_under(future)
            if closed is not None:
                raise closed from exc
            raise

    def connections(self) -> dict[str, int]:
        return self._core.connections()

    def close(self) -> None:
        """Close the connections and stop the thread (bounded: a host that stopped answering is dropped).

        Calls still in flight in other threads are stopped: each raises RuntimeError ("closed while the call
        ran") rather than waiting on a loop that no longer runs."""
        if self._thread is not None and threading.current_thread() is self._thread:
            raise RuntimeError("drover.Client.close called from inside one of its own ops")
        with self._lock:
            if self._closed:
                return
            self._closed = True
            loop, thread = self._loop, self._thread
            inflight = set(self._inflight)
        if self._finalizer is not None:
            self._finalizer.detach()
        if loop is None or thread is None:
            return
        self._ended |= inflight
        for future in inflight:
            future.cancel()  # its task on the loop is cancelled in turn, and unwinds below
        work = _shutdown(self._core)
        try:
            asyncio.run_coroutine_threadsafe(work, loop).result(timeout=10)
        except RuntimeError:
            work.close()  # its loop is closed already (the process is exiting): never left un-awaited
        except Exception:  # noqa: BLE001 - closing is best effort; the process may be exiting
            pass
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        if not thread.is_alive():
            loop.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


async def _shutdown(core: _Core) -> None:
    """On the client's loop: let the ops close() cancelled unwind (their records, their helpers), then close."""
    if core.running:
        await asyncio.wait(set(core.running), timeout=5)
    await core.close()


def _stop(loop: asyncio.AbstractEventLoop, core: _Core) -> None:
    """Close a collected client's connections, then its loop, without waiting (the collector may run anywhere)."""

    async def down() -> None:
        try:
            await core.close()
        finally:
            loop.stop()

    work = down()
    try:
        asyncio.run_coroutine_threadsafe(work, loop)
    except RuntimeError:
        work.close()  # its loop is closed already


# -- the process-wide client behind drover.run and drover.arun ---------------------------------------------------

_shared: tuple[int, Client] | None = None
_shared_lock = threading.Lock()


def shared() -> Client:
    """The client drover.run and drover.arun use: one per process (a forked child makes its own)."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared[0] != os.getpid():
            _shared = (os.getpid(), Client())
        return _shared[1]


def close() -> None:
    """Close the shared client's connections now (the next drover.run opens new ones); also done at exit."""
    global _shared
    with _shared_lock:
        held, _shared = _shared, None
    if held is not None and held[0] == os.getpid():
        held[1].close()


atexit.register(close)


def run(op: str, args: dict[str, Any] | None = None, /, **fields: Any) -> Reply:
    return shared().run(op, args, **fields)


async def arun(op: str, args: dict[str, Any] | None = None, /, **fields: Any) -> Reply:
    return await shared().arun(op, args, **fields)
