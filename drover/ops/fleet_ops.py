"""fleet.check: per host, is it reachable, is its key right, does auth work, what does it run?"""

from __future__ import annotations

import time
from typing import Any

from pydantic import Field

from drover.errors import DroverError
from drover.ops.core import Context, Request, Result, op
from drover.ops.sessions import fan_exit, fan_out_each

# Which step a transport error code means failed; the steps before it passed.
STEPS = ["reachable", "host_key", "auth", "python"]
FAILED_STEP = {
    "connection_refused": "reachable",
    "connect_timeout": "reachable",
    "dns": "reachable",
    "unreachable": "reachable",
    "connection_lost": "reachable",
    "unknown_host_key": "host_key",
    "host_key_changed": "host_key",
    "host_key": "host_key",
    "auth_failed": "auth",
    "ssh_error": "auth",
    "python_missing": "python",
    "python_too_old": "python",
}


class CheckRequest(Request):
    hosts: list[str] | None = Field(None, description="hosts to check (default: every host of the fleet)")
    tags: list[str] | None = Field(None, description="only hosts with one of these tags")


def _row(host: str, data: Any, err: DroverError | None, seconds: float, connect: float | None) -> dict[str, Any]:
    row: dict[str, Any] = {"host": host, "ok": err is None}
    failed = FAILED_STEP.get(err.code, "python") if err else None
    passed = True
    for step in STEPS:
        if step == failed:
            passed = False
        row[step] = passed if (passed or step == failed) else None
    if data:
        row.update(
            python=data.get("python"),
            tmux=data.get("tmux"),
            engines=data.get("engines", {}),
            user=data.get("user"),
            stale_claude_sessions=data.get("stale_claude_sessions", []),
            warnings=data.get("warnings", []),
        )
    row["rtt_ms"] = round((seconds - (connect or 0)) * 1000, 1) if err is None else None
    row["connect_ms"] = round(connect * 1000, 1) if connect is not None else None
    if err is not None:
        row["error"] = err.to_dict()
    return row


@op(
    "fleet.check",
    CheckRequest,
    "per host: reachable, host key, auth, python, tmux, engines, round-trip time",
    "drover fleet check",
)
async def fleet_check(ctx: Context, req: CheckRequest) -> Result:
    hosts = ctx.fleet.select(req.hosts, req.tags)
    timings: dict[str, float] = {}

    async def hello(host: str) -> Any:
        started = time.monotonic()
        try:
            return await ctx.transport(host).call("hello", {}, timeout=ctx.timeout(host))
        finally:
            timings[host] = time.monotonic() - started

    rows = await fan_out_each(ctx, hosts, hello)
    out = []
    for host, data, err in rows:
        connect = ctx.connect_seconds(host)
        out.append(_row(host, data, err, timings.get(host, 0.0), connect))
    errors = [err.to_dict() for _h, _d, err in rows if err is not None]
    return Result({"hosts": out}, errors, fan_exit(rows))
