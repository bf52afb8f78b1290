"""sessions.spawn: start a new agent session on a host, wait until it is ready, hand it its brief; sessions.spawns:
who started which session, for whom.

A spawn is recorded before anything starts (`spawn_requested`: drover starts nothing it cannot record), then as
`spawned` (the session, its identity, whether it is ready or waiting at a dialog) or `spawn_failed`, and, once its
brief went through `sessions_message` like any other message, `spawn_briefed` (the brief's message id and
outcome).  drover never answers a dialog: a session that stops at one (an untrusted folder's trust dialog) is
reported as waiting and gets no brief; a person answers it, and `drover send` can brief it then.
"""

from __future__ import annotations

import difflib
import os
import re
import time
import uuid
from typing import Any

from pydantic import Field

from drover import limits
from drover.errors import DroverError, EmptyText, ExitCode, InvalidRequest, Refused
from drover.fleet import BUILTIN_SPAWN_ENGINES, CONTROL_CHARS, LOCAL, SpawnEngine
from drover.ops.core import Context, Request, Result, op
from drover.ops.hosts import call_host
from drover.ops.outcome import exit_code_for
from drover.ops.send import LOOK, MessageRequest, sender_session, sessions_message
from drover.record import ReadStats, now_iso, spawn_matches
from drover.remote import protocol as P
from drover.remote.profiles import BUILTIN_PROFILES

# The engines drover can start with no [spawn.ENGINE] table: their own commands, found on the host's PATH.
DEFAULT_TEMPLATES = {"claude": "claude --name {name}", "codex": "codex"}
assert set(DEFAULT_TEMPLATES) == set(BUILTIN_SPAWN_ENGINES)  # what the fleet's [[nudge]] entries are checked against
# What the screen shows once the engine takes input, beyond an idle input box (Claude: its registry says so).
# Codex 0.169 draws its composer within a second, while its app-server still starts; `← for agents` follows.
DEFAULT_READY = {"codex": "← for agents"}
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")  # \Z, not $: `$` lets a final newline through


class SpawnRequest(Request):
    host: str = Field(LOCAL, description="the host to start it on")
    engine: str = Field(..., description="claude, codex, or an engine with a [spawn.ENGINE] template in the fleet")
    cwd: str = Field(..., description="the directory it starts in (absolute, or ~/... on the host)")
    name: str | None = Field(None, description="its name (a new tmux session of that name); default DIR-ENGINE-xxxx")
    brief: str = Field(..., description="its first message, sent after a snapshot of where and why it was started")
    actor: str | None = Field(None, description="who is dispatching it (default: $DROVER_ACTOR, else user@host)")
    parent_msg: str | None = Field(None, description="the message id this spawn answers (recorded as its parent)")
    args: list[str] | None = Field(
        None, description="arguments appended to the engine's command line for this spawn only, each one argv element"
    )
    headless: bool = Field(False, description="Claude Code (or Codex) with no terminal, held on the host by drover's holder")
    resume: str | None = Field(None, description="with headless: start a new holder for this headless session (its name)")


class SpawnsRequest(Request):
    host: str | None = Field(None, description="only sessions spawned on these hosts: a name, list or range (h[1-3],!h2)")
    parent: str | None = Field(None, description="only those dispatched by this actor, or for this message id (or prefix)")
    target: str | None = Field(
        None, description="only the session named so (HOST:ID or ID): its name, id or 8+ hex prefix, pane, pid, identity"
    )
    limit: int = Field(50, ge=1, le=10000, description="the newest N")
    live: bool = Field(True, description="ask each host for each session's live state (one list request per host)")


MSG_ID = re.compile(r"msg_[0-9a-f]{1,64}")


def check_parent_msg(ctx: Context, parent_msg: str | None) -> str | None:
    """A parent that is not a message id (msg_ + hex) is refused: a typo or a pasted tag would be kept as the
    parent for good.  A well-formed id the record does not hold is allowed (it may be another home's), and said:
    the warning it returns."""
    if parent_msg is None:
        return None
    if not MSG_ID.fullmatch(parent_msg):
        raise InvalidRequest(
            f"--parent-msg {parent_msg[:80]!r} is not a message id (msg_ followed by hex digits)",
            hint="give the id `drover send` printed, as `drover log` shows it (msg_…)",
        )
    try:
        hits, _count, _stats = ctx.truth.find(parent_msg)
    except DroverError:
        hits = []
    if any(getattr(h, "id", None) == parent_msg for h in hits):
        return None
    return f"--parent-msg {parent_msg} is not a message in this record: recorded as given"


def default_name(cwd: str, engine: str) -> str:
    """DIR-ENGINE-xxxx, in the characters a name may hold."""
    base = re.sub(r"[^A-Za-z0-9_-]", "-", os.path.basename(cwd.rstrip("/")) or "root")[:40].lstrip("-_") or "s"
    return re.sub(r"[^A-Za-z0-9_-]", "-", f"{base}-{engine}")[:59] + "-" + uuid.uuid4().hex[:4]


# tmux hands a new pane's command to its server in one message (at most 16 KiB): the arguments must fit with room.
MAX_ARGS_BYTES = 8192


def check_args(args: list[str] | None) -> list[str]:
    """The spawn's own engine arguments, refused before anything is recorded when no argv could carry them."""
    args = list(args or [])
    for a in args:
        if "\x00" in a:
            raise InvalidRequest(f"the engine argument {a!r} holds a NUL byte, which no argv element can carry")
    size = sum(len(a.encode("utf-8", "surrogateescape")) + 1 for a in args)
    if size > MAX_ARGS_BYTES:
        raise InvalidRequest(
            f"the engine's arguments are {size} bytes: at most {MAX_ARGS_BYTES} fit in the new pane's command",
            hint="put long text (a system prompt) in a file and pass its path",
        )
    return args


def template_for(ctx: Context, engine: str) -> SpawnEngine:
    """How to start `engine`; an engine drover could not start or would not know once started is refused here,
    before anything is recorded: it needs a command (a [spawn] table or a built-in one) and a profile (built in or
    an [engines] table) -- the host refuses one without a profile, after the spawn was recorded."""
    profiled = {*BUILTIN_PROFILES, *ctx.fleet.engines} - {"unknown"}
    spec = ctx.fleet.spawn.get(engine)
    if spec is None and engine in DEFAULT_TEMPLATES:
        spec = SpawnEngine(command=DEFAULT_TEMPLATES[engine])
    if spec is not None and engine in profiled:
        return spec
    startable = sorted(e for e in {*DEFAULT_TEMPLATES, *ctx.fleet.spawn} if e in profiled)
    close = difflib.get_close_matches(engine, startable, n=1)
    typo = f"did you mean {close[0]!r}? " if close else ""
    needs = [] if spec is not None else [f'[spawn.{engine}] command = "..."']
    needs += [] if engine in profiled else [f'[engines.{engine}] commands = ["..."]']
    added = " and ".join(needs)
    raise InvalidRequest(
        f"drover does not know how to start engine {engine!r}"
        + ("" if spec is None else f": [spawn.{engine}] says how to start it, but no [engines.{engine}] says how to know it"),
        code=P.UNKNOWN_ENGINE,
        hint=f"{typo}engines it can start: {', '.join(startable)}; for another, add {added} to the fleet "
        "(its profile names the program and says how its screen reads its input box and idle state)",
    )


def report_command(host: str, parent_session: dict[str, Any] | None) -> str | None:
    """The exact command the new session reports its end with, or None (no session dispatched it).  On this
    machine its own `drover done` finds its parent in the record; elsewhere the record is not there, so `--to`
    names the parent by this machine's name and the parent's own id."""
    if not parent_session:
        return None
    cmd = 'drover done --summary "..."'
    if host != LOCAL:
        machine = parent_session.get("machine") or parent_session.get("host")
        cmd += f" --to {machine}:{parent_session.get('pin') or parent_session.get('id')}"
    return cmd


def snapshot_text(
    host: str,
    data: dict[str, Any],
    actor: str,
    parent_msg: str | None,
    spawn_id: str,
    parent_session: dict[str, Any] | None = None,
) -> str:
    """The context the new session is told before its brief: where it runs, on what code, for whom, and (when a
    session dispatched it) how to tell that session it has finished."""
    git = data.get("git")
    if git:
        where = f"branch {git.get('branch') or '(detached HEAD)'} at {git.get('commit') or '(no commit yet)'}"
        code = f"git: {where}" + (" with uncommitted changes" if git.get("dirty") else "")
    else:
        code = "git: not a git repository"
    parent = f", for message {parent_msg}" if parent_msg else ""
    text = (
        f"drover started this session: {data['name']} ({data['engine']}) on host {host}, in {data['cwd']}.\n"
        f"{code}\n"
        f"dispatched by {actor}{parent} (spawn {spawn_id}).\n"
    )
    report = report_command(host, parent_session)
    if report:
        where = f"{parent_session.get('machine') or parent_session.get('host')}:{parent_session.get('id')}"  # type: ignore[union-attr]
        text += (
            f"when the task is finished, report to the session that dispatched you ({where}) by running: {report} "
            "(add --failed if it could not be done, --evidence TEXT for what shows it).\n"
        )
        if host != LOCAL:
            machine = parent_session.get("machine") or parent_session.get("host")  # type: ignore[union-attr]
            text += (
                f"({machine} is the dispatching machine's own name: if this host's drover fleet names it otherwise, "
                "use that name in --to.)\n"
            )
    return text


def _event(kind: str, spawn_id: str, **fields: Any) -> dict[str, Any]:
    ts = time.time()
    return {"v": 1, "event": kind, "id": spawn_id, "ts": ts, "time": now_iso(ts), **fields}


def _brief_fits(
    ctx: Context,
    spawn_id: str,
    host: str,
    engine: str,
    cwd: str,
    name: str,
    brief: str,
    actor: str,
    parent_msg: str | None,
    parent_session: dict[str, Any] | None = None,
) -> None:
    """Refuse, before anything starts, a brief the size limit would refuse once the session is up (it would be left
    running, unbriefed).  Counted as sessions_message counts it: the snapshot and the brief, in characters; the
    snapshot with what is known before the start (the directory as given, no git line yet).  The refusal is
    recorded like a refused message (accepted + outcome, the text stored as its head) and as spawn_failed."""
    lim = ctx.fleet.limits
    known = {"name": name, "engine": engine, "cwd": cwd}
    text = snapshot_text(host, known, actor, parent_msg, spawn_id, parent_session) + brief
    refusal = limits.check(lim, host, name, text, time.time(), [])
    if refusal is None:
        return
    msg_id, _ = ctx.truth.accept(
        actor=actor,
        host=host,
        target=name,
        text=text,
        options={"via": "auto", "spawn": spawn_id},
        max_stored_chars=lim.max_chars,
        check=lambda _recent: refusal,
    )
    code = str(refusal.get("code") or P.REFUSED)
    detail = f"the brief was refused before the session was started: {refusal.get('detail', '')}"
    ctx.truth.append(_event("spawn_failed", spawn_id, host=host, code=code, message=detail, brief_msg=msg_id))
    raise Refused(
        detail,
        code=code,
        host=host,
        hint="nothing was started; put the long part in a file and brief the session with its path",
        details={"spawn_id": spawn_id, "brief_msg": msg_id},
    )


def _bounds(ctx: Context, host: str, ready_timeout_s: float) -> tuple[float, float]:
    """(how long the host waits for the session to get ready, the bound of the whole request).

    The host does the waiting, so the request must outlive it: by default it is given the wait plus the
    host's request_timeout.  A command's --timeout bounds the whole request instead, as it bounds every other
    request: the wait is cut to leave the host time to answer within it (a host that never answers is then
    reported after --timeout, not after ready_timeout_s more)."""
    if ctx.timeout_s is None:
        return ready_timeout_s, ready_timeout_s + ctx.timeout(host)
    ready_s = min(ready_timeout_s, max(ctx.timeout_s - 1.0, ctx.timeout_s / 2))
    return ready_s, ctx.timeout_s


async def spawn_session(
    ctx: Context,
    *,
    host: str,
    engine: str,
    cwd: str,
    name: str | None,
    brief: str,
    actor: str,
    parent_msg: str | None = None,
    alone: bool = False,
    via: str = "auto",
    args: list[str] | None = None,
    sender: Any = LOOK,
    headless: bool = False,
    resume: str | None = None,
) -> dict[str, Any]:
    """Start `engine` in `cwd` on `host`, wait until it is ready, brief it (`alone`: refused, `shared_cwd`, when a
    live session works in that directory already, as the host resolves it).  Bad input, an unreachable host, an
    engine that exits at once or never gets ready raise DroverError (nothing is briefed); a session at a dialog
    comes back with state "waiting" and brief None."""
    if resume:
        name, cwd = resume, cwd or "~"  # the host knows its directory; a resume needs no brief
    elif not brief.strip():
        raise EmptyText("the brief is empty", hint="give the new session something to do: --brief TEXT, or - for stdin")
    if name is not None and not NAME.match(name):
        raise InvalidRequest(
            f"the name {name!r} must be letters, digits, '_' or '-' (at most 64, starting with a letter or digit)",
            hint="it becomes the tmux session's name, which ':' and '.' would break",
        )
    if not cwd.strip():
        raise InvalidRequest("the directory is empty", hint="--cwd /path or ~/path on the host")
    if CONTROL_CHARS.search(cwd):
        # Written raw into the engine's settings, a newline would corrupt them; tmux and discovery read it as two lines.
        raise InvalidRequest(
            f"the directory {cwd!r} holds a control character (a newline, CR, ESC, ...): drover starts nothing there",
            hint="rename the directory, or start the session by hand",
        )
    extra = check_args(args)
    unknown_parent = check_parent_msg(ctx, parent_msg)
    # Named here, not on the host, so that even a spawn whose outcome is never recorded names its tmux session.
    name = name or default_name(cwd, engine)
    cfg = ctx.route(host).config
    spec = template_for(ctx, engine)
    spawn_id = "spawn_" + uuid.uuid4().hex[:20]
    parent: dict[str, Any] = {"actor": actor, "msg": parent_msg}
    # Run from inside a session: that session is the parent, which the worker's `drover done` reports to.
    me = await sender_session(ctx) if sender is LOOK else sender
    parent_session: dict[str, Any] | None = None
    if me is not None:
        parent_session = {**me.record(), "pin": me.pin}
        parent["session"] = parent_session
    # Write-ahead, as for a message: nothing starts that cannot be recorded (a full disk raises here).
    # The spawn's own engine arguments are part of what was asked for: recorded with it (only when there are some).
    more = {"args": extra} if extra else {}
    ctx.truth.append(
        _event("spawn_requested", spawn_id, host=host, engine=engine, cwd=cwd, name=name, actor=actor, parent=parent, **more)
    )
    _brief_fits(ctx, spawn_id, host, engine, cwd, name, brief, actor, parent_msg, parent_session)
    ready_s, bound = _bounds(ctx, host, spec.ready_timeout_s)
    request = {
        "engine": engine,
        "cwd": cwd,
        "name": name,
        "command": spec.command,
        "server": cfg.spawn_server or "default",
        "trusted": cfg.trusted,
        "trust_file": spec.trust_file,
        "timeout_s": ready_s,
        "ready": spec.ready if spec.ready is not None else DEFAULT_READY.get(engine),
        "alone": alone,
        "args": extra,
    }
    if headless or resume:
        request.update(headless=True, resume=resume)
    try:
        data = await call_host(ctx, host, "spawn", request, timeout=bound)
    except DroverError as exc:
        if exc.code == P.SPAWN_TIMEOUT:
            exc.exit_code = ExitCode.TIMEOUT  # a helper error of the timeout class: `drover wait`'s exit code
            slower = (
                f"give a longer --timeout (its wait was cut to {ready_s:g}s to fit --timeout {ctx.timeout_s:g})"
                if ready_s < spec.ready_timeout_s
                else "raise [spawn.ENGINE] ready_timeout_s"
            )
            exc.hint = f"it is left running: `drover status` shows it; {slower} if it is slow"
        ctx.truth.append(_event("spawn_failed", spawn_id, host=host, code=exc.code, message=exc.message, **exc.details))
        raise
    result: dict[str, Any] = {
        "spawn_id": spawn_id,
        "host": host,
        "id": data["id"],
        "name": data["name"],
        "engine": data["engine"],
        "cwd": data["cwd"],
        "state": data["state"],
        "reason": data["reason"],
        "identity": data.get("identity"),
        "pane": data.get("pane"),
        "server": data.get("server"),
        "pid": data.get("pid"),
        "target": data.get("target"),
        "headless": bool(data.get("headless")),
        "git": data.get("git"),
        "pretrusted": data.get("pretrusted", False),
        "parent": parent,
        "args": extra,
        "tail": data.get("tail", []),
        "brief": None,
    }
    for key in ("trust_file", "trust_written", "pretrust_note", "warnings"):
        if key in data:
            result[key] = data[key]
    if unknown_parent:
        result["warnings"] = [*result.get("warnings", []), unknown_parent]
    # The event's own `id` is the spawn's; the session's id is `session`.
    recorded = {k: result[k] for k in ("host", "identity", "engine", "cwd", "name", "state", "reason", "pane", "server", "pid")}
    if result.get("target"):
        recorded["target"] = result["target"]  # session:window.pane, one more spelling `spawns --target` matches
    ctx.truth.append(_event("spawned", spawn_id, session=result["id"], actor=actor, parent=parent, git=result["git"], **recorded))
    if result["state"] != "ready" or not brief.strip():
        return result  # at a dialog: drover never answers one, and a brief would only wait behind it (or answer it)
    # No blank line between them: Codex's composer ends at a blank line, so the guard would not see the whole paste.
    text = snapshot_text(host, result, actor, parent_msg, spawn_id, parent_session) + brief
    # `via` as the caller asked (nudge --create-if-missing --via tmux): the host refuses a paste to a native lane.
    brief_req = MessageRequest(host=host, id=result["id"], text=text, actor=actor, via=via)
    sent = await sessions_message(ctx, brief_req, sender=me)
    result["brief"] = sent.data
    outcome = sent.data or {}
    ctx.truth.append(
        _event("spawn_briefed", spawn_id, brief_msg=outcome.get("id"), outcome=outcome.get("outcome"), code=outcome.get("code"))
    )
    return result


@op("sessions.spawn", SpawnRequest, "start a new agent session in tmux, wait until it is ready, brief it", "drover spawn")
async def sessions_spawn(ctx: Context, req: SpawnRequest) -> Result:
    data = await spawn_session(
        ctx,
        host=req.host,
        engine=req.engine,
        cwd=req.cwd,
        name=req.name,
        brief=req.brief,
        actor=ctx.who(req.actor),
        parent_msg=req.parent_msg,
        args=req.args,
        headless=req.headless,
        resume=req.resume,
    )
    where = f"{data['name']} ({data['engine']}, {data['id']})"
    if data["state"] == "waiting":
        message = (
            f"{where} started but stopped at a dialog ({data['reason']}); drover never answers one, so it was not "
            "briefed: a person must"
        )
        hint = f"answer it there (tmux attach -t {data['name']}), or pre-trust the folder in the fleet: trusted = [...]"
        return Result(data, [{"code": P.HELD, "message": message, "hint": hint, "host": req.host}], ExitCode.HELD)
    if data["brief"] is None:
        return Result(data)  # a resumed headless session, given no brief
    brief = data["brief"]
    if data["headless"] and brief.get("outcome") == P.DELIVERED and not brief.get("verified"):
        # Ready means the stream took the brief into a turn: a command that never answers is not a session.
        data.update(state="unanswered", reason="its stream never acknowledged the brief")
        message = (
            f"{where} started but its stream did not acknowledge the brief (no turn took it): the command may not "
            f"speak stream-json; its stderr: {brief.get('stderr_tail') or '(none)'}"
        )
        return Result(data, [{"code": P.SPAWN_TIMEOUT, "message": message, "host": req.host}], ExitCode.TIMEOUT)
    exit_code = exit_code_for(brief.get("outcome"))
    if exit_code != ExitCode.OK:
        message = f"{where} is ready but its brief was {brief.get('outcome')}: {brief.get('detail', '')}"
        return Result(
            data, [{"code": brief.get("code") or brief.get("outcome"), "message": message, "host": req.host}], exit_code
        )
    return Result(data)


def fold(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every spawn, from its events, in the order they were requested."""
    spawns: dict[str, dict[str, Any]] = {}
    for ev in events:
        kind, sid = ev.get("event"), ev.get("id")
        if not isinstance(sid, str) or not isinstance(kind, str) or not kind.startswith("spawn"):
            continue
        if kind == "spawn_requested":
            spawns[sid] = {
                "spawn_id": sid,
                "time": ev.get("time"),
                "state": "requested",
                "brief_msg": None,
                "brief_outcome": None,
            }
            for key in ("host", "engine", "cwd", "name", "actor", "parent"):
                spawns[sid][key] = ev.get(key)
            spawns[sid]["args"] = ev.get("args") or []
            continue
        row = spawns.get(sid)
        if row is None:
            continue
        if kind == "spawned":
            row["id"] = ev.get("session")
            for key in ("identity", "name", "cwd", "state", "reason", "pane", "server", "pid", "git", "target"):
                row[key] = ev.get(key)
        elif kind == "spawn_failed":
            row.update(state="failed", code=ev.get("code"), reason=ev.get("message"))
            if ev.get("brief_msg"):
                row.update(brief_msg=ev.get("brief_msg"), brief_outcome=P.REFUSED)
        elif kind == "spawn_briefed":
            row.update(brief_msg=ev.get("brief_msg"), brief_outcome=ev.get("outcome"))
    return list(spawns.values())


def _parent_matches(row: dict[str, Any], parent: str) -> bool:
    p = row.get("parent")
    if not isinstance(p, dict):
        return False
    msg = p.get("msg")
    return p.get("actor") == parent or (isinstance(msg, str) and msg.startswith(parent))


@op("sessions.spawns", SpawnsRequest, "the sessions drover started: where, who dispatched them, their brief", "drover spawns")
async def sessions_spawns(ctx: Context, req: SpawnsRequest) -> Result:
    """The newest `limit` matching spawns, oldest first, read from the end of the truth file backwards: a spawn's
    events all follow its spawn_requested, so a spawn is whole once that is met, and the read stops at the
    `limit + 1`th match.  Lines without the word "spawn are passed over unparsed.  `total` counts the matches
    found; `complete` says whether that is all of them (the read reached the start of the file)."""
    later: dict[str, list[dict[str, Any]]] = {}  # events of spawns whose spawn_requested is still ahead, newest first
    rows: list[dict[str, Any]] = []
    stats = ReadStats(str(ctx.truth.path))
    complete = True
    from drover.hostsets import matcher

    target, target_host = req.target, None
    if target and ":" in target:  # HOST:ID, as drover log reads it (with --host as well: both must hold)
        head, rest = target.split(":", 1)
        if head in ctx.fleet.host_names():
            target_host, target = head, rest
    on_host = matcher([req.host]) if req.host else None  # the record's hosts: no fleet check (as drover log)
    for ev in ctx.truth.backward(stats, skip=lambda raw: b'"spawn' not in raw):
        kind, sid = ev.get("event"), ev.get("id")
        if not isinstance(sid, str) or not isinstance(kind, str) or not kind.startswith("spawn"):
            continue
        if kind != "spawn_requested":
            later.setdefault(sid, []).append(ev)
            continue
        folded = fold([ev, *reversed(later.pop(sid, []))])
        if not folded:
            continue
        row = folded[0]
        if on_host is not None and not on_host(str(row.get("host") or "")):
            continue
        if req.parent and not _parent_matches(row, req.parent):
            continue
        if target and not (spawn_matches(target, row) and target_host in (None, row.get("host"))):
            continue
        if len(rows) == req.limit:
            complete = False  # one more than asked for: there are more
            break
        rows.append(row)
    rows.reverse()
    total = len(rows) + (0 if complete else 1)
    warnings = stats.warnings()
    if req.live:
        from drover.ops.live_state import live_spawns

        await live_spawns(ctx, rows, warnings)
        from drover.ops import sightings

        sightings.note(ctx, [str(r["spawn_id"]) for r in rows if r.get("state") not in ("exited", "unknown")])
    return Result({"spawns": rows, "total": total, "complete": complete, "warnings": warnings})
