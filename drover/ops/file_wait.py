"""files.wait: block until a file on a host exists or changes -- how a coordinator waits on its workers' status files.

The waiting happens on the host (drover/remote/files.py: inotify on Linux, a bounded poll elsewhere); the request
only has to outlive it, as sessions.wait's does.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from drover.errors import ExitCode, InvalidRequest
from drover.fleet import LOCAL
from drover.ops.core import Context, Request, Result, op
from drover.ops.hosts import call_host
from drover.remote import protocol as P


class WaitFileRequest(Request):
    host: str = Field(LOCAL, description="the host the file is on")
    path: str = Field(..., description="the file; relative to the home directory on that host, ~ expanded")
    changed: bool = Field(False, description="wait for a change even if it exists now (else: until it exists)")
    timeout_s: float = Field(600.0, gt=0, le=86400, description="give up after this many seconds (exit 9)")
    baseline: dict[str, Any] | None = Field(
        None, description="with changed: compare with an earlier answer's {device, inode, size, mtime_ns}, not with now"
    )
    poll: bool = Field(False, description="look with stat instead of inotify (a file system inotify cannot see into)")


@op("files.wait", WaitFileRequest, "block until a file on a host exists or changes (inotify on the host)", "drover wait-file")
async def files_wait(ctx: Context, req: WaitFileRequest) -> Result:
    if not req.host.strip():
        raise InvalidRequest("invalid request for files.wait: host: the host is empty", hint="name a host, or local")
    if not req.path.strip():
        raise InvalidRequest("invalid request for files.wait: path: the path is empty", hint="name the file to wait for")
    if "\0" in req.path:
        raise InvalidRequest("invalid request for files.wait: path: it holds a NUL character, which no file name can")
    if req.baseline is not None and not req.changed:
        raise InvalidRequest("invalid request for files.wait: a baseline means nothing without changed", hint="add --changed")
    args: dict[str, Any] = {"path": req.path, "changed": req.changed, "timeout_s": req.timeout_s, "poll": req.poll}
    if req.baseline is not None:
        args["baseline"] = req.baseline
    # The host does the waiting; the request only needs to outlive it.
    data = await call_host(ctx, req.host, "wait_file", args, timeout=req.timeout_s + ctx.timeout(req.host))
    data = {"host": req.host, **data}
    if data.get("reached"):
        return Result(data)
    verb = "change" if req.changed else "appear"
    error = {
        "code": P.WAIT_TIMEOUT,
        "message": f"{data.get('path', req.path)} did not {verb} within {req.timeout_s:g}s",
        "host": req.host,
    }
    return Result(data, [error], ExitCode.TIMEOUT)
