"""sessions.wait_many: wait on several sessions, across hosts, for the first (`any`) or every one (`all`) to be idle,
waiting on a human, exited or done.

The shape of it: every target is resolved first (one request per host; an unknown or ambiguous target is an error
before anything is waited on); then ONE request per host whose helper watches all that host's targets
(drover/remote/wait_many.py), while the local record is watched here for lifecycle events (`done`, `failed`,
`exited`) about them.  A host's answer that settles only some of its targets is followed by one more request for
the rest -- a request per event, never a polling loop over SSH.  A host that fails or never answers (each request is
bounded by the wait's timeout plus the host's request timeout) is a row with its error; the others' answers stand.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, Literal

from pydantic import Field

from drover import lifecycle
from drover import session_state as S
from drover.errors import DroverError, ExitCode, InvalidRequest, exit_code_of
from drover.ops import live_state
from drover.ops.core import Context, Request, Result, op
from drover.ops.hosts import call_host, fan_out_each
from drover.ops.live_state import own_record
from drover.remote import protocol as P
from drover.session_state import pulled
from drover.targets import parse_session

STALL_AFTER_S = 600.0  # until=stalled: how long working without a new transcript entry is a stall, by default
RECORD_LOOK_S = 0.2  # how often the record's size is looked at (a stat); it is read only when it grew


class WaitManyRequest(Request):
    targets: list[str] = Field(..., min_length=1, max_length=1000, description="HOST:ID of each session (ID alone: local)")
    mode: Literal["any", "all"] = Field("any", description="any: the first to get there; all: every one")
    until: Literal["idle", "done", "exited", "stalled", "waiting"] = Field("idle", description="the state to wait for")
    timeout_s: float = Field(600.0, gt=0, le=86400, description="give up after this many seconds (exit 9)")
    stall_after_s: float | None = Field(
        None, gt=0, le=86400, description="until=stalled: working with no progress this long (default: the fleet's stall_after)"
    )


def _row_of(host: str, resolved: dict[str, Any]) -> dict[str, Any]:
    s = resolved["session"]
    return {
        "host": host,
        "target": resolved["target"],
        "id": s.get("id"),
        "name": s.get("name"),
        "engine": s.get("engine"),
        "identity": resolved["identity"],
        "state": resolved.get("state") or "unknown",
        "how": resolved.get("how"),
        "reached": False,
        "settled": False,
        "_session": s,
    }


def _spellings(row: dict[str, Any]) -> list[str]:
    # By identity (a Claude id, a tmux pane with its process) and never by name alone: a name reused by a newcomer
    # must not carry an old session's `done` over to it.
    out = [row["identity"]]
    if row["identity"].startswith(("claude:", "codex:")) and row.get("id"):
        out.append(row["id"])
    return out


def _look_at_record(ctx: Context, rows: list[dict[str, Any]], until: str) -> bool:
    """Settle the rows the record has a terminal event for; whether any changed."""
    changed = False
    for row in rows:
        if row["settled"] or row["identity"] is None:
            continue
        ev = lifecycle.latest(ctx.truth, row["host"], _spellings(row))
        if ev is None:
            continue
        kind = ev["event"]
        if until == "exited" and kind != "exited":
            continue  # said it is done, but it may still be running: only its end ends a wait for its end
        if kind in ("done", "failed"):
            state, reached = "done", until == "done"
        else:  # exited
            state, reached = "exited", until == "exited"
        row.update(state=state, reached=reached, settled=True, how=f"a `{kind}` event in the record", event=ev)
        if kind == "failed":
            row["failed"] = True
        changed = True
    return changed


def _named_as_status_does(row: dict[str, Any], host: str, progress: Any) -> None:
    """A working row's state by the function `status` uses (session_state.fold) on the same progress evidence and
    the same stall_after: a session status calls stalled is stalled here too, never `working`."""
    if row["state"] not in ("working", "stalled") or not isinstance(progress, dict) or row.get("settled"):
        return
    facts = {"state": "busy", "progress": progress, "engine": row.get("engine")}
    folded = S.fold(facts, host=host, stall_after=row["_stall_after"])
    if folded["state"] == "stalled" and row["state"] == "working":
        quiet = folded["evidence"].get("no_progress_for")
        row.update(state="stalled", how=f"working, and its last progress is {quiet:.0f}s old ({row.get('progress_evidence')})")


def _finished(rows: list[dict[str, Any]], mode: str) -> bool:
    if mode == "any":
        return any(r["reached"] for r in rows) or all(r["settled"] for r in rows)
    return all(r["reached"] for r in rows) or any(r["settled"] and not r["reached"] for r in rows)


async def _resolve(ctx: Context, by_host: dict[str, list[str]], errors: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    async def one(host: str) -> Any:
        return await call_host(ctx, host, "wait_many", {"resolve": True, "targets": by_host[host]})

    answers = await fan_out_each(ctx, list(by_host), one)
    out: dict[str, list[dict[str, Any]]] = {}
    for host, data, err in answers:
        if err is not None and err.code == P.SESSION_NOT_FOUND:
            data, err = await _resolve_past_the_gone(ctx, host, by_host[host], err)
        if err is not None and err.exit_code in (ExitCode.TARGET, ExitCode.USAGE):
            raise err  # a target that names nothing (or names two) is an error before any waiting
        if err is not None:
            # The host could not be asked (unreachable, no answer in time): its targets are rows with its error,
            # settled as not reached, and the other hosts are waited on all the same.
            errors.append(err.to_dict())
            how = f"the host did not answer: {err.message}"
            out[host] = [
                {"host": host, "target": t, "identity": None, "state": "unknown", "how": how, "error": err.code}
                | {"reached": False, "settled": True}
                for t in by_host[host]
            ]
            continue
        out[host] = [r if r.get("_gone") else _row_of(host, r) for r in data["sessions"]]
    return out


def _gone_row(host: str, target: str, gone: dict[str, Any]) -> dict[str, Any]:
    """A target that is a session drover spawned, no longer live: exited from the start, with status's evidence."""
    seen = gone.get("last_seen")
    how = f"a session drover spawned ({gone.get('spawn_id')}), no longer live on its host"
    if isinstance(seen, (int, float)):
        how += f"; last seen {time.strftime('%H:%M:%S', time.localtime(seen))}"
    return {
        "host": host,
        "target": target,
        "id": gone.get("id"),
        "name": gone.get("name"),
        "engine": gone.get("engine"),
        "identity": gone.get("identity"),
        "state": "exited",
        "how": how,
        "evidence": gone.get("evidence"),
        "reached": False,
        "settled": False,  # settled once the record has been looked at (a `done` it left counts for --until done)
        "_gone": True,
        "_session": gone,
    }


async def _resolve_past_the_gone(
    ctx: Context, host: str, targets: list[str], err: DroverError
) -> tuple[dict[str, Any] | None, DroverError | None]:
    """A host's resolve failed on a name it does not know: the targets that are sessions drover spawned and that are
    gone (what `status` calls exited, live_state.exited_status) are rows of their own, and the rest is resolved
    again -- so a typo among them is still "no session", before anything is waited on."""
    gone: dict[str, dict[str, Any]] = {}
    for t in targets:
        if live_state.spawned_named(ctx, host, t) is None:
            continue  # no spawn bore this name: not worth asking the host
        row = await live_state.exited_status(ctx, host, t, err)
        if row is not None:
            gone[t] = row
    if not gone:
        return None, err
    rest = [t for t in targets if t not in gone]
    by_target: dict[str, dict[str, Any]] = {}
    if rest:
        try:
            data = await call_host(ctx, host, "wait_many", {"resolve": True, "targets": rest})
        except DroverError as exc:
            return None, exc
        by_target = dict(zip(rest, data["sessions"], strict=True))
    rows = [_gone_row(host, t, gone[t]) if t in gone else by_target[t] for t in targets]
    return {"sessions": rows}, None


@op(
    "sessions.wait_many",
    WaitManyRequest,
    "wait on several sessions across hosts: the first (any) or every one (all) idle, waiting, done or exited",
    "drover wait A B --any",
)
async def sessions_wait_many(ctx: Context, req: WaitManyRequest) -> Result:
    if req.stall_after_s is not None and req.until != "stalled":
        raise InvalidRequest("stall_after_s means nothing without until=stalled", hint="add --until stalled")
    parsed = [parse_session(t, ctx.fleet, "wait") for t in req.targets]
    seen: dict[tuple[str, str], str] = {}
    for text, t in zip(req.targets, parsed, strict=True):
        if (t.host, t.id) in seen:
            raise InvalidRequest(f"{t.host}:{t.id} is named twice ({text!r})", hint="name each session once")
        seen[(t.host, t.id)] = text
    by_host: dict[str, list[str]] = {}
    for t in parsed:
        by_host.setdefault(t.host, []).append(t.id)
    errors: list[dict[str, Any]] = []
    resolved = await _resolve(ctx, by_host, errors)
    rows = [r for host in by_host for r in resolved[host]]
    twice: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        if r["identity"] is None:
            continue  # its host could not say
        key = (r["host"], r["identity"])
        if key in twice:
            first = twice[key]
            raise InvalidRequest(
                f"{first['host']}:{first['target']} and {r['host']}:{r['target']} name the same session ({r['identity']})",
                hint="name each session once",
            )
        twice[key] = r
    gone = [r for r in rows if r.get("_gone")]
    if gone:
        # Exited before the wait began: for --until done the record may say it finished first (a `done` it left).
        if req.until == "done":
            _look_at_record(ctx, gone, req.until)
        for r in gone:
            if not r["settled"]:
                r.update(settled=True, reached=req.until == "exited")
    for r in rows:
        # The fleet's stall_after for the session's host and engine (what `status` uses), unless the request says.
        r["_stall_after"] = req.stall_after_s or ctx.fleet.stall_after(r["host"], r.get("engine"))
    started = time.monotonic()
    deadline = started + req.timeout_s
    host_until = "exited" if req.until == "done" else req.until
    wake = asyncio.Event()

    async def watch_host(host: str) -> None:
        mine = [r for r in rows if r["host"] == host]
        while True:
            left = [r for r in mine if not r["settled"]]
            remaining = deadline - time.monotonic()
            if not left or remaining <= 0 or _finished(rows, req.mode):
                return
            # `all` of a host's targets can be judged on the host; for `done` the host reports exits, one at a time.
            mode = req.mode if req.until != "done" else "any"
            args = {
                "watch": [
                    {"target": r["target"], "identity": r["identity"], "engine": r["engine"], "stall_after_s": r["_stall_after"]}
                    for r in left
                ],
                "until": host_until,
                "mode": mode,
                "timeout_s": remaining,
            }
            if req.until == "stalled":
                args["stall_after_s"] = req.stall_after_s or STALL_AFTER_S
            if req.until == "done" and own_record(host):
                # A worker's `drover done` on that host is written to the host's own record, never to ours: the
                # host's watcher looks there too, and a `done` it finds ends its wait (one request, as ever).
                args["done"] = True
            try:
                data = await call_host(ctx, host, "wait_many", args, timeout=remaining + ctx.timeout(host))
            except DroverError as exc:
                exc.host = exc.host or host
                errors.append(exc.to_dict())
                for r in left:
                    r.update(state="unknown", how=f"the host did not answer: {exc.message}", error=exc.code)
                wake.set()
                return
            for r, answer in zip(left, data["sessions"], strict=False):
                if r["settled"]:
                    continue  # the record settled it meanwhile
                r.update(state=answer["state"], how=answer.get("how"))
                for key in ("screen_state", "last_progress", "progress_evidence", "progress"):
                    if answer.get(key) is not None:
                        r[key] = answer[key]
                end = pulled(answer.get("event"), host)
                if end is not None:
                    r["event"] = end
                    if end["event"] == "failed":
                        r["failed"] = True
                if answer.get("settled_at") is not None:
                    r.update(settled=True, reached=bool(answer.get("reached")), waited_s=answer.get("waited_s"))
            for said in data.get("warnings") or []:
                for r in mine:
                    r.setdefault("warnings", []).append(said)
            wake.set()
            if data.get("timed_out"):
                return

    async def watch_record() -> None:
        # The record only grows: it is read again only when its size or inode changed (a stat every RECORD_LOOK_S).
        last: tuple[int, int] | None = None
        while not _finished(rows, req.mode) and time.monotonic() < deadline:
            try:
                st = os.stat(ctx.truth.path)
                now: tuple[int, int] | None = (st.st_ino, st.st_size)
            except FileNotFoundError:
                now = None
            if now != last:
                last = now
                if now is not None and _look_at_record(ctx, rows, req.until):
                    wake.set()
            await asyncio.sleep(RECORD_LOOK_S)

    tasks = [asyncio.ensure_future(watch_host(h)) for h in by_host]
    if req.until in ("done", "exited"):
        tasks.append(asyncio.ensure_future(watch_record()))
    try:
        while True:
            wake.clear()  # before the look: a wake-up set after it is not lost
            if _finished(rows, req.mode) or all(t.done() for t in tasks[: len(by_host)]):
                break
            try:
                await asyncio.wait_for(wake.wait(), timeout=max(0.05, deadline - time.monotonic() + 1))
            except TimeoutError:
                pass
            if time.monotonic() > deadline + max((ctx.timeout(h) for h in by_host), default=0) + 5:
                break  # every request has its own bound; this is only a guard against a bug holding us forever
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return _result(req, rows, errors, round(time.monotonic() - started, 3))


def _result(req: WaitManyRequest, rows: list[dict[str, Any]], errors: list[dict[str, Any]], waited: float) -> Result:
    for r in rows:
        _named_as_status_does(r, r["host"], r.pop("progress", None))
    reached_rows = [r for r in rows if r["reached"]]
    reached = bool(reached_rows) if req.mode == "any" else len(reached_rows) == len(rows)
    shown = [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]
    data = {
        "until": req.until,
        "mode": req.mode,
        "reached": reached,
        "which": [f"{r['host']}:{r['target']}" for r in reached_rows],
        "sessions": shown,
        "waited_s": waited,
    }
    if reached:
        return Result(data, errors)  # another host's failure is shown, but the answer asked for is here
    if errors:
        return Result(data, errors, exit_code_of(errors[0]["code"]))
    exited = [r for r in rows if r["settled"] and not r["reached"]]
    if exited and (req.mode == "all" or len(exited) == len(rows)):
        during = [f"{r['host']}:{r['target']}" for r in exited if not r.get("_gone")]
        before = [f"{r['host']}:{r['target']} ({r['how']})" for r in exited if r.get("_gone")]
        said = []
        if before:
            said.append(f"{', '.join(before)} had exited before the wait began: it can no longer be {req.until}")
        if during:
            said.append(f"{', '.join(during)} exited while waiting for {req.until}")
        error = {"code": P.SESSION_EXITED, "message": "; ".join(said)}
        return Result(data, [error], ExitCode.TARGET)
    waiting = [f"{r['host']}:{r['target']} ({r['state']})" for r in rows if not r["reached"]]
    error = {"code": P.WAIT_TIMEOUT, "message": f"after {req.timeout_s:g}s still not {req.until}: {', '.join(waiting)}"}
    return Result(data, [error], ExitCode.TIMEOUT)
