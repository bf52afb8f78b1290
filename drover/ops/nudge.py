"""sessions.nudge and nudge.run: deliver a message only when it is safe -- once, or on the fleet's schedule.

A nudge is a message with four refusals in front of it (the nudger's `checkSafe`, whose reasons carry over):

- `not_live`: no live agent answers to the name -- the pane is gone or dead, or its agent exited and left a shell.
  Nudging it would mean starting an agent, and a nudge never does that.  The dispatcher's opposite,
  `--create-if-missing`, starts one (drover/ops/spawn.py) and then delivers.  A worker drover spawned that
  died is refused as `session_exited` instead, said as that (drover/ops/gone.py), not as a name nobody bears.
- `generating`: the session is live but busy with a turn.  A nudge is "when you have a moment", never a message
  that queues up behind work in progress; a schedule tries again at the entry's `retry`.
- `waiting_on_human`: a person is in the middle of something there -- Claude's registry says `waiting` (a
  permission prompt), the screen shows a dialog, or a person's draft sits in the input box: the same look `drover
  board` and a broadcast take (drover/remote/attention.py, asked with the host's `status`).  Claude's inbox would
  take the message anyway; a nudge does not put it in front of the question the person is answering.  (drover's
  own earlier message left unsent in the input box is `not_submitted`, as a broadcast says it.)
- `shared_cwd`: another live session on the host works in the same directory.  A nudge is about the work in that
  directory, and with two agents in it, it could land in the one that is not doing that work.

Each refusal is a message record of its own -- the `accepted` event and the `refused` outcome with its code, in one
write -- so `drover log` shows why a nudge did not go.  A go-ahead is an ordinary `sessions_message` (write-ahead
record, limits, guard, verification), pinned to the very session that was checked.

The race: the state is read, then the send resolves the session again and delivers.  A session that starts a turn
in between is caught by the tmux guard's own look right before the paste, but an engine that queues typed input
(Claude Code, Codex, the demo agent) then gets the message queued behind that turn instead of refused; the result
says so (`raced`).  The window is one request to the host plus the accepted event's write.

Schedules of nudges, `drover nudge run`, are in drover/ops/nudge_run.py.
"""

from __future__ import annotations

import os
import re
from typing import Any, Literal

from pydantic import Field

from drover.errors import OUTCOME_EXIT, DroverError, EmptyText, ExitCode, InvalidRequest, TargetError
from drover.fleet import LOCAL
from drover.ops.core import Context, Request, Result, op
from drover.ops.hosts import call_host
from drover.ops.send import MessageRequest, sessions_message
from drover.record import session_of
from drover.remote import protocol as P

Lane = Literal["auto", "inbox", "queue", "tmux"]


class NudgeRequest(Request):
    host: str = Field(LOCAL, description="the host the session is on")
    id: str = Field(..., description="pane id (%3), session:window.pane, or a unique name or prefix")
    text: str = Field(..., description="the message")
    actor: str | None = Field(None, description="who is sending (default: $DROVER_ACTOR, else user@host)")
    via: Lane = Field("auto", description="the lane: auto picks the best one the session has")
    create_if_missing: bool = Field(False, description="not live: start it (engine, cwd), then deliver")
    engine: str | None = Field(None, description="with create_if_missing: the engine a new session runs")
    cwd: str | None = Field(None, description="with create_if_missing: the directory a new session starts in")
    name: str | None = Field(None, description="with create_if_missing: the new session's name (default: id)")


# -- one nudge ---------------------------------------------------------------------------------------------------


def _refusal(code: str, detail: str, session: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"outcome": P.REFUSED, "lane": None, "code": code, "detail": detail}
    if session is not None:
        out["session"] = {k: session[k] for k in ("id", "server", "name", "engine", "cwd", "state") if k in session}
    return out


def _failure(exc: DroverError) -> dict[str, Any]:
    """Nothing was sent (the look failed): provably not delivered, never indeterminate."""
    return {
        "outcome": P.FAILED,
        "lane": None,
        "code": exc.code,
        "detail": exc.message + (f" ({exc.hint})" if exc.hint else ""),
        "error_class": "target" if isinstance(exc, TargetError) else None,
    }


def _exit(outcome: dict[str, Any]) -> int:
    if outcome.get("error_class") == "target":
        return ExitCode.TARGET
    return int(OUTCOME_EXIT.get(outcome.get("outcome", P.FAILED), ExitCode.FAILED))


def _is_record(session: dict[str, Any]) -> bool:
    """A live Claude Code session from its registry (its process is alive), as opposed to a tmux pane."""
    return "former_names" in session


def _pin(session: dict[str, Any]) -> str:
    """The name that resolves to exactly this session (as drover/remote/discovery.pin makes it)."""
    return str(session["id"]) if _is_record(session) else f"{session['server']}/{session['id']}"


def _live(session: dict[str, Any]) -> bool:
    """A live agent session: a Claude registry record, or a pane that runs an agent and has not died."""
    return _is_record(session) or (session.get("engine") not in (None, "shell") and not session.get("dead"))


def _place(cwd: Any) -> str | None:
    if not isinstance(cwd, str) or not cwd.strip():
        return None
    return os.path.normpath(cwd)


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.get("id") == b.get("id") and a.get("server") == b.get("server")


async def look(ctx: Context, host: str, target: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(session, None) when it is safe to nudge; (session or None, the refusal or failure outcome) when not.

    The listing comes first and the target's state last, so the state is as fresh as it can be when the send
    starts.  Only the other sessions' directories and liveness are needed from the listing (no screens read)."""
    try:
        listing = await call_host(ctx, host, "list", {"state": False})
        session = (await call_host(ctx, host, "status", {"target": target, "tail": 0}))["session"]
    except DroverError as exc:
        if exc.code == P.SESSION_NOT_FOUND:
            why = f"no session {target!r} on {host}: a nudge never starts one (--create-if-missing does)"
            return None, _refusal(P.NOT_LIVE, why)
        return None, _failure(exc)
    name = f"{host}:{session.get('name') or target}"
    if session.get("state") == "gone" or session.get("dead"):
        return session, _refusal(P.NOT_LIVE, f"{name} is not live: {session.get('reason') or 'its pane is dead'}", session)
    if not _live(session):
        why = (
            f"{name} runs no agent ({session.get('command') or 'a shell'}): its agent has exited, and a nudge never "
            "starts one (--create-if-missing does)"
        )
        return session, _refusal(P.NOT_LIVE, why, session)
    if session.get("state") == "busy":
        why = f"{name} is generating ({session.get('reason') or 'busy'}): a nudge waits until it is idle"
        return session, _refusal(P.GENERATING, why, session)
    human = session.get("human")
    if human:
        # Claude's registry `waiting` (a permission prompt), a dialog on screen, a person's draft: the host's
        # own look (drover/remote/attention.py), the one `drover board` and a broadcast take.  The inbox would
        # take the message anyway, to land in the middle of what the person is answering.
        code = P.NOT_SUBMITTED if human.get("kind") == "drover_text" else P.WAITING_ON_HUMAN
        why = f"{name} is waiting on a human ({human.get('reason')}): a nudge waits until they are done"
        refusal = _refusal(code, why, session)
        refusal["human"] = human
        return session, refusal
    here = _place(session.get("cwd"))
    if here is not None:
        others = [s for s in listing.get("sessions", []) if not _same(s, session) and _live(s) and _place(s.get("cwd")) == here]
        if others:
            names = ", ".join(f"{s.get('name')} ({s.get('engine')} {s.get('id')})" for s in others[:5])
            why = (
                f"{name} shares its directory {here} with {len(others)} other live session(s) on {host}: {names}; "
                "the nudge could land in the one not doing that work"
            )
            refusal = _refusal(P.SHARED_CWD, why, session)
            refusal["sharing"] = [{k: s.get(k) for k in ("id", "server", "name", "engine")} for s in others]
            return session, refusal
    return session, None


def _decided(
    ctx: Context, base: dict[str, Any], text: str, outcome: dict[str, Any], resolved: dict[str, Any] | None = None
) -> Result:
    """A nudge that did not go: recorded as a message (accepted + outcome, one write) with its reason.  With
    `resolved` (the live session the name resolved to), its spellings are recorded as a send records them: only
    `options.session`, never the `identity` and `pin` the limits count by and `drover retry` would deliver to (a
    nudge refused as unsafe is not a send to finish later)."""
    recorded = {k: v for k, v in outcome.items() if k != "error_class"}
    options: dict[str, Any] = {"nudge": True}
    if resolved is not None:
        options["session"] = session_of(resolved)
    msg_id, _ = ctx.truth.accept(
        actor=base["actor"],
        host=base["host"],
        target=base["target"],
        text=text,
        options=options,
        max_stored_chars=ctx.fleet.limits.max_chars,
        check=lambda _recent: recorded,
    )
    data = {"id": msg_id, **base, **recorded}
    exit_code = _exit(outcome)
    errors = [{"code": outcome.get("code") or outcome["outcome"], "message": outcome.get("detail", ""), "host": base["host"]}]
    return Result(data, errors, exit_code)


NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")  # what drover spawn takes as a name


async def _occupied(ctx: Context, req: NudgeRequest) -> dict[str, Any] | None:
    """--create-if-missing into a directory another live session already works in: the new session would make
    every later nudge to either of them a `shared_cwd` refusal.  Refused before anything starts.  (Only an
    absolute --cwd is compared: `~/…` is expanded on the host, by spawn.)"""
    here = _place(req.cwd) if req.cwd and req.cwd.startswith("/") else None
    if here is None:
        return None
    listing = await call_host(ctx, req.host, "list", {"state": False})
    others = [s for s in listing.get("sessions", []) if _live(s) and _place(s.get("cwd")) == here]
    if not others:
        return None
    names = ", ".join(f"{s.get('name')} ({s.get('engine')} {s.get('id')})" for s in others[:5])
    why = (
        f"{req.host}:{req.id} is not live, and starting it in {here} would put it beside {names}: every nudge to "
        "either would then be refused (shared_cwd); nudge that session, or start this one in a directory of its own"
    )
    refusal = _refusal(P.SHARED_CWD, why)
    refusal["sharing"] = [{k: s.get(k) for k in ("id", "server", "name", "engine")} for s in others]
    return refusal


async def _create(ctx: Context, req: NudgeRequest, actor: str, base: dict[str, Any]) -> Result:
    """--create-if-missing, the session not being live: spawn it with the nudge's text as its brief.  drover spawn
    delivers the brief through sessions_message once the session is ready (recorded as `spawn_briefed`)."""
    from drover.ops.spawn import spawn_session

    name = req.name or (req.id if NAME.match(req.id) else None)
    assert req.engine and req.cwd  # checked by nudge()
    try:
        spawned = await spawn_session(
            ctx, host=req.host, engine=req.engine, cwd=req.cwd, name=name, brief=req.text, actor=actor, alone=True, via=req.via
        )
    except DroverError as exc:
        if exc.code != P.SHARED_CWD:
            raise
        # The host's own look (its `~`, symlinks resolved) found what the path as given hid: refused, as above.
        why = f"{req.host}:{req.id} is not live, and starting it there would put it beside another session: {exc.message}"
        refusal = _refusal(P.SHARED_CWD, why + "; nudge that session, or start this one in a directory of its own")
        refusal["sharing"] = exc.details.get("sharing", [])
        return _decided(ctx, base, req.text, refusal)
    brief = dict(spawned.get("brief") or {})
    data = {**base, **brief, "spawned": {k: v for k, v in spawned.items() if k != "brief"}}
    if spawned.get("state") != "ready":
        where = f"{req.host}:{spawned.get('name')}"
        data.update(
            outcome=P.HELD,
            detail=f"started {where}, but it stopped at a dialog ({spawned.get('reason')}): "
            "drover never answers one, so the nudge was not delivered",
        )
        return Result(data, [{"code": P.HELD, "message": data["detail"], "host": req.host}], ExitCode.HELD)
    exit_code = _exit(brief)
    errors = []
    if exit_code != ExitCode.OK:
        errors.append({"code": brief.get("code") or brief.get("outcome"), "message": brief.get("detail", ""), "host": req.host})
    return Result(data, errors, exit_code)


async def nudge(ctx: Context, req: NudgeRequest) -> Result:
    """One nudge: look, then refuse (recorded) or deliver through sessions_message."""
    if not req.text.strip():
        raise EmptyText("the message text is empty", hint="give the text as an argument, or - to read it from stdin")
    if req.create_if_missing and not (req.engine and req.cwd):
        raise InvalidRequest(
            "--create-if-missing needs --engine and --cwd: what to start, and where, if the session is not live",
            hint="e.g. drover nudge box-a:webapp 'status?' --create-if-missing --engine claude --cwd ~/webapp",
        )
    if req.create_if_missing:
        from drover.ops.spawn import template_for

        # An engine drover cannot start is a usage error before anything is looked at or recorded: not a
        # refusal that depends on whether the directory happens to be shared.
        assert req.engine
        template_for(ctx, req.engine)
    if req.create_if_missing and not req.name and not NAME.match(req.id):
        raise InvalidRequest(
            f"--create-if-missing needs --name here: {req.id!r} cannot name a new session, so the next nudge to it "
            "would not find the one this starts (and would start another)",
            hint="e.g. --name webapp; then nudge HOST:webapp",
        )
    actor = ctx.who(req.actor)
    base: dict[str, Any] = {"host": req.host, "target": req.id, "actor": actor, "nudge": True}
    # The session the name means, as a send finds it: the live one that bears it, else (a name that handed its
    # work over) the newest live generation of its chain -- never a stranger that the name merely prefixes.
    from drover.ops.handoff import address

    where = await address(ctx, req.host, req.id)
    session: dict[str, Any] | None
    refusal: dict[str, Any] | None
    if where.error is not None:
        from drover.ops import gone

        told = await gone.explain(ctx, req.host, req.id, where.error, what="nothing was sent (a nudge never starts one)")
        if told.code == P.SESSION_EXITED:
            # A worker drover spawned that died: said as that (not a typo), refused as not live, hint and all.
            session, refusal = None, _refusal(P.SESSION_EXITED, f"{told.message} ({told.hint})")
        elif where.error.code in (P.SESSION_NOT_FOUND, P.HANDOFF_BROKEN):
            why = where.error.message if where.error.code == P.HANDOFF_BROKEN else f"no session {req.id!r} on {req.host}"
            why += ": a nudge never starts one (--create-if-missing does)"
            session, refusal = None, _refusal(P.NOT_LIVE, why)
        else:
            session, refusal = None, _failure(where.error)
    else:
        assert where.answer is not None
        base["host"] = where.host
        session, refusal = await look(ctx, where.host, where.answer["pin"])
    if refusal is not None and refusal.get("code") in (P.NOT_LIVE, P.SESSION_EXITED) and req.create_if_missing:
        if (occupied := await _occupied(ctx, req)) is not None:
            return _decided(ctx, base, req.text, occupied)
        return await _create(ctx, req, actor, base)
    if refusal is not None:
        return _decided(ctx, base, req.text, refusal, where.answer)
    assert session is not None
    tags: dict[str, Any] = {"nudge": True, "addressed": f"{req.host}:{req.id}", **where.redirect}
    tags.pop("handoff_chain", None)
    message = MessageRequest(host=where.host, id=_pin(session), text=req.text, actor=actor, via=req.via)
    sent = await sessions_message(ctx, message, tags=tags)
    data = dict(sent.data or {})
    data["nudge"] = True
    data["addressed"] = req.id  # what the caller typed; `target` is the session that was checked, pinned
    if where.redirect:
        data.update(where.redirect)
    data["checked"] = {"state": session.get("state"), "cwd": session.get("cwd")}
    if data.get("outcome") == P.QUEUED and session.get("state") == "idle":
        data["raced"] = True
        data["detail"] = (
            f"{data.get('detail', '')} (it was idle when the nudge looked and started a turn before the paste: "
            "queued behind it, not interrupting)"
        )
    return Result(data, sent.errors, sent.exit_code)


@op(
    "sessions.nudge",
    NudgeRequest,
    "deliver only if safe: refuse a session that is not live, is generating, waits on a human, or shares its directory",
    "drover nudge",
)
async def sessions_nudge(ctx: Context, req: NudgeRequest) -> Result:
    return await nudge(ctx, req)
