"""The daemon's pool: one SSH transport per host in persistent mode (one connection, long-lived helpers), on the
daemon's loop, and the Context through which a request's ops reach it.  A library client (drover/api.py) keeps a
Pool of its own, on its loop, reached through LinkedTransport."""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass
from typing import Any

from drover.daemon.request import Request

HELPERS_PER_HOST = 8  # below OpenSSH's MaxSessions (10 channels per connection)


def trust_files(cfg: Any) -> list[str]:
    """What decides whether a host is trusted and how it is reached, besides its fleet entry: the known_hosts
    files (the user's, the system's, drover's own, the host's), ~/.ssh/config and the host's identity file."""
    from drover.transport.host_keys import drover_known_hosts

    files = [
        os.path.expanduser("~/.ssh/known_hosts"),
        "/etc/ssh/ssh_known_hosts",
        str(drover_known_hosts()),
        os.path.expanduser("~/.ssh/config"),
        "/etc/ssh/ssh_config",
    ]
    for name in ("known_hosts", "identity"):
        value = getattr(cfg, name, None)
        if value:
            files.append(os.path.expanduser(str(value)))
    return files


def trust_stamp(cfg: Any) -> list[Any]:
    """Each trust file's identity and state (a few stats, per request): any change -- a key removed from
    known_hosts, an edited ssh config -- and the host's pooled connection is not used again."""
    stamp: list[Any] = []
    for path in trust_files(cfg):
        try:
            st = os.stat(path)
            stamp.append([path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns])
        except OSError as exc:
            stamp.append([path, exc.errno])
    return stamp


def max_links() -> int:
    """How many hosts may keep a connection: half of what is left of the descriptor limit after drover's own few
    dozen (a ProxyJump host takes two).  The daemon raises its soft limit to the hard one when it starts."""
    import resource

    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 4096
    return max(1, (soft - 64) // 2)


def raise_descriptor_limit(ceiling: int = 65536) -> None:
    """The soft descriptor limit up to the hard one (at most `ceiling`): the daemon holds a connection per host."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = ceiling if hard == resource.RLIM_INFINITY else min(hard, ceiling)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (OSError, ValueError):
            pass  # kept as it was: max_links() follows whatever the limit is


class Pool:
    """One SSHTransport per host (persistent mode), on the daemon's loop; requests reach it from their threads."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.links: dict[str, tuple[str, Any]] = {}
        self.stamps: dict[str, list[Any]] = {}  # per host: the trust files as they were when it last connected
        self.closing: set[asyncio.Future[None]] = set()  # old links being closed (kept referenced until done)
        self.used: dict[str, float] = {}  # per host: when a request last used its link (least recently used goes first)
        self.calls: dict[Any, int] = {}  # per transport: requests at work on it (never evicted; retired: closed at zero)
        self.retired: set[Any] = set()  # replaced transports finishing their requests
        self.evicted = 0

    def _retire(self, transport: Any) -> None:
        """A link no request will be given again.  Its idle helpers go now; the requests at work on it finish there
        (a changed known_hosts or fleet entry must not cut a send half-way, which then landed all the same), and
        it closes when the last one does."""
        transport.close_idle()
        if self.calls.get(transport):
            self.retired.add(transport)
            return
        closing = asyncio.ensure_future(transport.close())
        self.closing.add(closing)
        closing.add_done_callback(self.closing.discard)

    def _evict(self, keep: str) -> None:
        """At most max_links() hosts keep a connection: past that, the least recently used ones with no request at
        work are closed (a fleet of thousands would otherwise hold a descriptor per host it ever reached, until the
        daemon ran out).  A host evicted is connected again when next asked."""
        over = len(self.links) - max_links()
        if over <= 0:
            return
        idle = sorted((self.used.get(h, 0.0), h) for h, (_k, t) in self.links.items() if h != keep and not self.calls.get(t))
        for _when, host in idle[:over]:
            _key, transport = self.links.pop(host)
            self.stamps.pop(host, None)
            self.used.pop(host, None)
            self._retire(transport)
            self.evicted += 1

    def _link(self, host: str, cfg: Any, defaults: Any, profiles: dict[str, Any]) -> Any:
        from drover.transport.openssh import transport_class

        # The fleet file is read again for every request; a host whose settings changed gets a new connection.
        key = json.dumps([cfg.model_dump(mode="json"), defaults.connect_timeout, profiles], sort_keys=True, default=str)
        known = self.links.get(host)
        stamp = trust_stamp(cfg)
        if known is not None and known[0] == key and self.stamps.get(host) == stamp:
            return known[1]
        # A replacement shares the old link's helper slots: its requests still at work count against the host's
        # bound of HELPERS_PER_HOST until they finish.
        slots = known[1]._slots if known is not None else None
        if known is not None:
            self._retire(known[1])
        transport = transport_class(cfg)(host, cfg, defaults, profiles, helpers=HELPERS_PER_HOST, slots=slots)
        self.links[host] = (key, transport)
        self.stamps[host] = stamp
        self._evict(keep=host)
        return transport

    async def call(self, host: str, cfg: Any, defaults: Any, profiles: dict[str, Any], op: str, args: Any, timeout: float) -> Any:
        transport = self._link(host, cfg, defaults, profiles)
        connects = transport.connects
        self.calls[transport] = self.calls.get(transport, 0) + 1
        try:
            data = await transport.call(op, args, timeout=timeout)
        finally:
            self.used[host] = time.monotonic()
            self.calls[transport] -= 1
            if not self.calls[transport]:
                del self.calls[transport]
                if transport in self.retired:
                    self.retired.discard(transport)
                    self._retire(transport)
            if transport.connects != connects and self.links.get(host, (None, None))[1] is transport:
                # It (re)connected during this call: the trust files as they are now are what it was checked
                # against (accept_new may have added the host's key), not a reason to connect again.
                self.stamps[host] = trust_stamp(cfg)
        noticed, transport.warnings[:] = list(transport.warnings), []
        return data, noticed, transport.connect_seconds

    def status(self) -> list[dict[str, Any]]:
        rows = []
        for host, (_key, t) in sorted(self.links.items()):
            rows.append(
                {
                    "host": host,
                    "connected": t.connected,
                    "helpers": t.idle_helpers + t.busy,
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
        if self.request.interrupted:
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


class LinkedTransport:
    """What a library Context holds for an SSH host (drover/api.py): calls go to a pool on the same loop, so a
    script's ops share one connection per host across calls, as the daemon's requests do."""

    def __init__(self, pool: Pool, host: str, cfg: Any, defaults: Any, profiles: dict[str, Any]) -> None:
        self.pool = pool
        self.host = host
        self.cfg, self.defaults, self.profiles = cfg, defaults, profiles
        self.warnings: list[str] = []
        self.connect_seconds: float | None = None

    async def call(self, op: str, args: dict[str, Any], *, timeout: float) -> Any:
        data, noticed, self.connect_seconds = await self.pool.call(
            self.host, self.cfg, self.defaults, self.profiles, op, args, timeout
        )
        self.warnings.extend(noticed)
        return data

    async def close(self) -> None:
        return None  # the pool's: it stays for the next call


def context_class() -> type:
    """A Context whose SSH hosts go through the pool and whose truth file tells the client about a send's
    write-ahead record as it is made.  (Built on first use: importing the ops costs the daemon's start only.)"""
    from drover.ops.core import Context
    from drover.truth import TruthFile

    class NotifyingTruth(TruthFile):
        request: Request

        def accept(self, **kwargs: Any) -> Any:
            if not self.request.begin_delivery():
                raise asyncio.CancelledError  # interrupted, or the client went away first: nothing recorded, nothing sent
            # From here the command runs to its end even if its client disappears: a message recorded is followed
            # to its real outcome, never cut off and left as `interrupted` when it may well have arrived.
            self.request.send_now({"t": "accepting"})
            result = super().accept(**kwargs)
            # In the client's socket before anything is delivered: if the daemon dies now, the client knows the id.
            self.request.send_now({"t": "accepted", "id": result[0]})
            return result

        def working_on(self, msg_id: str, exclusive: bool) -> Any:
            # A retry (`drover op messages.retry`) takes its message exclusively before it looks and delivers: from
            # there it is a send on its way, followed to its end as a send is from its accepted event.
            if exclusive and not self.request.begin_delivery():
                raise asyncio.CancelledError
            return super().working_on(msg_id, exclusive)

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
                route = self.route(host)
                if route.local:
                    return super().transport(host)
                # The entry as the fleet wrote it: the pool keys its connections by it.
                self._transports[host] = PooledTransport(self.request, host, route.config, route.defaults, dict(route.profiles))
            return self._transports[host]

    return DaemonContext
