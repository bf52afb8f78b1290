"""The host plumbing every op that asks hosts shares: one helper request to a host, the same request to many hosts
at once (bounded, a failing host a row rather than an exception), and the exit code of such a fan-out.

Each host is reached through its route and transport on the Context (drover/route.py, drover/ops/core.py): resolved
once per command, whichever op asks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from drover.errors import DroverError, ExitCode
from drover.ops.core import Context


def fd_bound(concurrency: int) -> int:
    """The fan-out's concurrency as configured, but never more connections than this process may have open: each
    takes a descriptor (two through a ProxyJump), and a few dozen are drover's own."""
    import resource

    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return concurrency
    return max(1, min(concurrency, (soft - 64) // 2))


async def fan_out_each(
    ctx: Context, hosts: list[str], work: Callable[[str], Awaitable[Any]]
) -> list[tuple[str, Any, DroverError | None]]:
    """Run `work(host)` for every host concurrently (bounded); a failing host is a row, never an exception.

    At most `concurrency` hosts are at work at once, and so at most that many connections are open: when the hosts
    outnumber the bound, each host's connection is closed as soon as its work is done (its slot is freed only
    then); when they fit under it, the connections stay open for the op's next request to the same hosts."""
    concurrency = fd_bound(ctx.fleet.defaults.concurrency)
    limit = asyncio.Semaphore(concurrency)
    keep = len(set(hosts)) <= concurrency
    done = 0

    async def one(host: str) -> tuple[str, Any, DroverError | None]:
        nonlocal done
        async with limit:
            try:
                result: tuple[str, Any, DroverError | None] = (host, await work(host), None)
            except DroverError as exc:
                exc.host = exc.host or host
                result = (host, None, exc)
            finally:
                if not keep:
                    await ctx.release(host)
        done += 1
        if ctx.progress:
            ctx.progress(host, done, len(hosts))
        return result

    return list(await asyncio.gather(*(one(h) for h in hosts)))


async def call_host(ctx: Context, host: str, helper_op: str, args: dict[str, Any], timeout: float | None = None) -> Any:
    """One helper request; what the transport noticed on the way (a noisy login shell) joins the data's warnings."""
    transport = ctx.transport(host)
    data = await transport.call(helper_op, args, timeout=timeout or ctx.timeout(host))
    noticed = getattr(transport, "warnings", None)
    if noticed and isinstance(data, dict):
        data["warnings"] = [*data.get("warnings", []), *noticed]
        noticed.clear()
    return data


async def fan_out(
    ctx: Context, hosts: list[str], helper_op: str, args: dict[str, Any]
) -> list[tuple[str, Any, DroverError | None]]:
    """The same helper request to every host."""

    async def call(host: str) -> Any:
        return await call_host(ctx, host, helper_op, args)

    return await fan_out_each(ctx, hosts, call)


def fan_exit(rows: list[tuple[str, Any, DroverError | None]]) -> int:
    """0 when every host answered, PARTIAL when some did, FAILED when none did."""
    failed = sum(1 for _h, _d, err in rows if err is not None)
    if not failed:
        return ExitCode.OK
    return ExitCode.PARTIAL if failed < len(rows) else ExitCode.FAILED
