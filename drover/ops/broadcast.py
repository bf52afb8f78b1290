"""sessions.broadcast: the same text to every agent session a selector matches, skipping those waiting on a human.

Who is addressed: the agent sessions (a pane that runs no agent is never addressed: a broadcast is no way to type
into shells) on the selected hosts (--host, --tag), narrowed by engine, name glob and cwd glob.  A selector, or an
explicit `all`, is required: a bare broadcast to the whole fleet by accident is refused.

Each host is asked once who is there and who waits on a person (drover/remote/attention.py, the same look `drover
board` takes).  A session in a dialog, in Claude's `waiting`, or with a person's draft in its input box is skipped
and recorded as refused (`waiting_on_human`) with its reason, so `drover log` shows every session the broadcast
meant.  Every other session gets the message through `sessions_message` -- its own message id, limits, the
write-ahead record and the guard, whose own last look right before the paste still applies.  The messages of one
broadcast share its id (`broadcast` in each message's options).  A host that cannot be asked is a failed row.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from fnmatch import fnmatchcase
from typing import Any, Literal

from pydantic import Field

from drover.errors import DroverError, EmptyText, ExitCode, UsageError, exit_code_of
from drover.ops.core import Context, Request, Result, op
from drover.ops.hosts import call_host, fan_out_each
from drover.ops.send import MessageRequest, sessions_message
from drover.record import session_of
from drover.remote import protocol as P
from drover.targets import check_engine

SKIPPED = "skipped"  # a broadcast's own outcome: not sent, because a person is in the middle of something there
NOT_AGENTS = ("shell",)
# Deliveries at once on one host: each is a channel of the host's one SSH connection, and OpenSSH's sshd opens at
# most 10 per connection by default (MaxSessions).
PER_HOST = 8
# Which outcome is worse, for the exit code: a failure beats a missing session beats a refusal beats a hold.
SEVERITY: list[int] = [ExitCode.OK, ExitCode.HELD, ExitCode.REFUSED, ExitCode.TARGET, ExitCode.FAILED]


class BroadcastRequest(Request):
    text: str = Field(..., description="the message, the same for every session")
    hosts: list[str] | None = Field(None, description="only these hosts")
    tags: list[str] | None = Field(None, description="only hosts with one of these tags")
    engine: str | None = Field(None, description="only sessions running this engine (claude, codex, gemini, demo, ...)")
    name: str | None = Field(None, description="only sessions whose name matches this glob (webapp-*)")
    cwd: str | None = Field(None, description="only sessions whose directory matches this glob (/srv/*/api)")
    all: bool = Field(False, description="every agent session of the fleet (required when no other selector is given)")
    actor: str | None = Field(None, description="who is sending (default: $DROVER_ACTOR, else user@host)")
    via: Literal["auto", "inbox", "queue", "tmux"] = Field("auto", description="the lane for each session: auto picks its best")


def new_broadcast_id() -> str:
    return f"bc_{int(time.time() * 1000):012x}{secrets.token_hex(3)}"


def _selected(req: BroadcastRequest, s: dict[str, Any]) -> bool:
    if s.get("engine") in NOT_AGENTS:
        return False
    if req.engine and s.get("engine") != req.engine:
        return False
    if req.name and not fnmatchcase(s.get("name") or "", req.name):
        return False
    return not (req.cwd and not fnmatchcase(s.get("cwd") or "", req.cwd))


def _brief(s: dict[str, Any]) -> dict[str, Any]:
    return {k: s.get(k) for k in ("id", "name", "engine", "cwd", "server", "target") if s.get(k) is not None}


def _skip(ctx: Context, broadcast: str, actor: str, host: str, s: dict[str, Any], text: str) -> dict[str, Any]:
    """A session waiting on a person: recorded as refused (accepted and refused in one write), shown as skipped."""
    human = s["human"]
    # drover's own earlier message left unsent in the input box is nobody's draft: said as what it is.
    code = P.NOT_SUBMITTED if human.get("kind") == "drover_text" else P.WAITING_ON_HUMAN
    refusal = {"outcome": P.REFUSED, "code": code, "detail": f"skipped: {human['reason']}", "skipped": True}
    lim = ctx.fleet.limits
    options = {"broadcast": broadcast, "identity": s.get("identity"), "pin": s.get("pin")}
    options["session"] = session_of({"session": s, "identity": s.get("identity")})  # found by any of its names
    msg_id, _ = ctx.truth.accept(
        actor=actor,
        host=host,
        target=s["pin"],
        text=text,
        options=options,
        max_stored_chars=lim.max_chars,
        check=lambda _r: refusal,
    )
    return {
        "id": msg_id,
        "host": host,
        "target": s["pin"],
        "outcome": SKIPPED,
        "code": code,
        "detail": human["reason"],
        "lane": None,
        "session": _brief(s),
        "exit_code": int(ExitCode.REFUSED),
    }


def _not_recorded(host: str, s: dict[str, Any], exc: DroverError) -> dict[str, Any]:
    """The truth file could not take the accepted event: nothing was sent (drover sends nothing it cannot record)."""
    return {
        "id": None,
        "host": host,
        "target": s["pin"],
        "outcome": P.FAILED,
        "code": exc.code,
        "detail": exc.message,
        "session": _brief(s),
        "exit_code": int(exc.exit_code),
    }


async def _send(ctx: Context, req: BroadcastRequest, broadcast: str, actor: str, host: str, s: dict[str, Any]) -> dict[str, Any]:
    message = MessageRequest(host=host, id=s["pin"], text=req.text, actor=actor, via=req.via)
    try:
        result = await sessions_message(ctx, message, tags={"broadcast": broadcast})
    except DroverError as exc:
        return _not_recorded(host, s, exc)
    data = dict(result.data)
    row = {k: data.get(k) for k in ("id", "host", "target", "outcome", "code", "detail", "lane", "verified")}
    row["session"] = data.get("session") or _brief(s)
    row["exit_code"] = int(result.exit_code)
    if data.get("warnings"):
        row["warnings"] = data["warnings"]
    return row


def _host_failed(host: str, err: DroverError) -> dict[str, Any]:
    detail = err.message + (f" ({err.hint})" if err.hint else "")
    return {"id": None, "host": host, "target": None, "outcome": P.FAILED, "code": err.code, "detail": detail, "session": None}


def natural(text: str) -> tuple[Any, ...]:
    """A sort key that orders the numbers inside a text as numbers: pane %9 before %10."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text))


def _worst(codes: list[int]) -> int:
    def rank(code: int) -> int:
        return SEVERITY.index(code) if code in SEVERITY else len(SEVERITY)

    return max(codes, key=rank) if codes else ExitCode.OK


def summary_line(broadcast: str, rows: list[dict[str, Any]], hosts: int) -> str:
    counts = Counter(r["outcome"] for r in rows)
    order = [P.DELIVERED, P.QUEUED, SKIPPED, P.HELD, P.REFUSED, P.DROPPED, P.FAILED]
    parts = [f"{counts[o]} {o}" for o in order if counts.get(o)]
    sessions = sum(1 for r in rows if r.get("session") is not None)
    where = f"{sessions} session{'s' if sessions != 1 else ''} on {hosts} host{'s' if hosts != 1 else ''}"
    return f"broadcast {broadcast}: " + (", ".join(parts) or "nothing sent") + f" ({where})"


@op(
    "sessions.broadcast",
    BroadcastRequest,
    "the same text to every agent session a selector matches, skipping those waiting on a human",
    "drover broadcast",
)
async def sessions_broadcast(ctx: Context, req: BroadcastRequest) -> Result:
    if not req.text.strip():
        raise EmptyText("the message text is empty", hint="give the text as an argument, or - to read it from stdin")
    for field, given in (("hosts", req.hosts), ("tags", req.tags)):
        if given is not None and not given:
            raise UsageError(
                f"{field} is empty: name at least one {field[:-1]}, or use all",
                hint="an empty list selects nobody; leave it out (with all) for the whole fleet",
            )
    for field, glob in (("engine", req.engine), ("name", req.name), ("cwd", req.cwd)):
        if glob is not None and not glob.strip():
            raise UsageError(
                f"{field} is empty: an empty selector matches nothing and filters nothing",
                hint=f"leave --{field} out, or give a glob ('*' for any)" if field != "engine" else "leave --engine out",
            )
    if not (req.all or req.hosts or req.tags or req.engine or req.name or req.cwd):
        raise UsageError(
            "a broadcast needs a selector: --host, --tag, --engine, --name or --cwd, or --all for every agent session",
            hint="drover broadcast --all TEXT sends to the whole fleet; say so if you mean it",
        )
    check_engine(ctx.fleet, req.engine)
    if req.engine in NOT_AGENTS:
        raise UsageError(
            f"a broadcast goes to agent sessions only: panes that run no agent ({req.engine}) get nothing",
            hint="send to one such pane with `drover send --raw`",
        )
    actor = ctx.who(req.actor)
    hosts = ctx.select(req.hosts, req.tags)
    broadcast = new_broadcast_id()
    matched = 0
    begun = time.time()
    # What is known as it happens, for a broadcast interrupted half-way (Ctrl-C): the rows already finished, and
    # the sessions each answering host listed.
    finished: list[dict[str, Any]] = []
    listed: dict[str, list[dict[str, Any]]] = {}

    async def one(host: str, s: dict[str, Any]) -> dict[str, Any]:
        if not s.get("human"):
            row = await _send(ctx, req, broadcast, actor, host, s)
        else:
            try:
                row = _skip(ctx, broadcast, actor, host, s, req.text)
            except DroverError as exc:  # the truth file cannot take it: a row of its own, not the host's other rows lost
                row = _not_recorded(host, s, exc)
        finished.append(row)
        return row

    async def on_host(host: str) -> list[dict[str, Any]]:
        """Who is there, then the message to each chosen session at once: one host's work, in one connection slot."""
        nonlocal matched
        data = await call_host(ctx, host, "attention", {})
        # What the host said on the way (a tmux server that did not answer, a registry it could not read): its
        # sessions there may be missing from the rows, so the broadcast says so, as `ls` and `board` do.
        warnings.extend({"host": host, "message": w} for w in data.get("warnings", []) if isinstance(w, str))
        chosen = [s for s in data.get("sessions", []) if _selected(req, s)]
        matched += len(chosen)
        listed[host] = chosen
        channels = asyncio.Semaphore(PER_HOST)

        async def bounded(s: dict[str, Any]) -> dict[str, Any]:
            async with channels:
                return await one(host, s)

        return list(await asyncio.gather(*(bounded(s) for s in chosen)))

    rows: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    warnings: list[dict[str, Any]] = []
    try:
        with _one_interrupt(ctx):
            answers = await fan_out_each(ctx, hosts, on_host)
    except asyncio.CancelledError:
        # Ctrl-C: every send under way has recorded itself as interrupted on its way out; say what is known.
        return _interrupted(ctx, broadcast, actor, hosts, begun, finished, listed, warnings)
    for host, done, err in answers:
        if err is not None:
            rows.append({**_host_failed(host, err), "exit_code": int(ExitCode.FAILED)})
            errors.append(err.to_dict())
        else:
            rows += done
    # The unreachable hosts first, then by host and session, as `drover ls` orders them (%9 before %10).
    order = {h: i for i, h in enumerate(hosts)}
    rows.sort(key=lambda r: (r.get("session") is not None, order.get(r["host"], len(order)), natural(r.get("target") or "")))
    codes = [(r.pop("exit_code"), r.get("session") is not None) for r in rows]
    exit_code = _worst([code for code, of_a_session in codes if of_a_session])
    if errors:
        # A host that could not be asked: 5 when none answered or a message itself failed, else 8 -- a fan-out where
        # some hosts failed and others answered, as `ls` and `board` say it.
        partial = len(errors) < len(hosts) and exit_code != ExitCode.FAILED
        exit_code = ExitCode.PARTIAL if partial else ExitCode.FAILED
    if not matched and (not hosts or len(errors) < len(hosts)):
        where = f"{len(hosts)} host(s)" if hosts else "no host (no host has those tags)"
        errors.append(
            {
                "code": P.NO_MATCH,
                "message": f"no agent session matched the selector on {where}: nothing was sent",
                "hint": "`drover ls` shows the sessions, their names, engines and directories",
            }
        )
        exit_code = _worst([exit_code, exit_code_of(P.NO_MATCH)])
    counts = dict(Counter(r["outcome"] for r in rows))
    data = {
        "broadcast": broadcast,
        "actor": actor,
        "messages": rows,
        "counts": counts,
        "summary": summary_line(broadcast, rows, len(hosts)),
        "warnings": warnings,
    }
    return Result(data, errors, exit_code)


@contextlib.contextmanager
def _one_interrupt(ctx: Context) -> Iterator[None]:
    """Ctrl-C stops the broadcast once: the first SIGINT cancels it (as asyncio's own handler would), and the ones
    after it -- a person pressing again, a signal to the whole process group -- are let go until the rows are
    made, instead of cutting the report of what was sent short (asyncio raises KeyboardInterrupt at the second).
    Only on the main thread, where signals land; the handler before is put back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    hits = [0]

    def on_sigint(_signum: int, _frame: Any) -> None:
        hits[0] += 1
        if hits[0] == 1 and task is not None:
            loop.call_soon_threadsafe(task.cancel)

    before = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        if hits[0] and ctx.exit_on_interrupt:
            # The CLI, interrupted: the process is on its way out with exit 130, rows first.  Later Ctrl-Cs would
            # only cut them short (closing the connections, printing), so they are ignored from here on.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        else:
            signal.signal(signal.SIGINT, before)


def _interrupted(
    ctx: Context,
    broadcast: str,
    actor: str,
    hosts: list[str],
    begun: float,
    finished: list[dict[str, Any]],
    listed: dict[str, list[dict[str, Any]]],
    warnings: list[dict[str, Any]],
) -> Result:
    """A broadcast stopped half-way: a row for every session and host it reached, as honest as the record.

    Finished sends keep their rows.  A send that was on its way is read back from the truth file (it recorded
    itself `interrupted`, may-have-arrived, as it stopped), so its row carries its id for `drover retry`.  A session
    a host listed but whose send never started, and a host that had not answered yet, got nothing: said so."""
    rows = [{k: v for k, v in r.items() if k != "exit_code"} for r in finished]
    seen = {r["id"] for r in rows if r.get("id")}
    reached: set[tuple[str, str]] = {(r["host"], r["target"]) for r in rows if r.get("target")}
    try:
        recorded = [m for m in ctx.truth.query(10_000, begun).messages if m.options.get("broadcast") == broadcast]
    except DroverError:
        recorded = []  # the record cannot be read now: those sends show below as not known to have started
    briefs = {(host, s["pin"]): _brief(s) for host, chosen in listed.items() for s in chosen}
    for m in recorded:
        if m.id in seen:
            continue
        keys = ("id", "host", "target", "outcome", "code", "detail", "lane", "verified", "indeterminate")
        rows.append({**{k: m.to_dict().get(k) for k in keys}, "session": m.session or briefs.get((m.host, m.target))})
        reached.add((m.host, m.target))
    for host in hosts:
        if host not in listed:
            detail = "interrupted before this host said who is there: nothing was sent there"
            rows.append(_cut(host, None, None, detail))
            continue
        for s in listed[host]:
            if (host, s["pin"]) not in reached:
                rows.append(_cut(host, s["pin"], _brief(s), "interrupted before its turn: nothing was sent to it"))
    order = {h: i for i, h in enumerate(hosts)}
    rows.sort(key=lambda r: (r.get("session") is not None, order.get(r["host"], len(order)), natural(r.get("target") or "")))
    data = {
        "broadcast": broadcast,
        "actor": actor,
        "messages": rows,
        "counts": dict(Counter(r["outcome"] for r in rows)),
        "summary": "interrupted: " + summary_line(broadcast, rows, len(hosts)),
        "warnings": warnings,
        "interrupted": True,
    }
    error = {
        "code": P.INTERRUPTED,
        "message": f"broadcast {broadcast} was interrupted: {len(finished)} of its sends had finished",
        "hint": "the rows marked indeterminate may have arrived: `drover retry ID` finds out (`drover log --pending`)",
    }
    return Result(data, [error], ExitCode.INTERRUPTED)


def _cut(host: str, target: str | None, session: dict[str, Any] | None, detail: str) -> dict[str, Any]:
    row = {"id": None, "host": host, "target": target, "outcome": P.FAILED, "code": P.INTERRUPTED, "detail": detail}
    return {**row, "session": session}
