"""sessions.message, and finishing a message later: messages.verify and messages.retry.

A send: resolve the target on its host (its identity: a Claude session id, or a tmux server and pane) -> the
sender-side limits, counted by that identity -> the `accepted` event (write-ahead; it names the identity, the
pinned name and the ids the receiver's record will show) -> deliver to exactly that session -> the outcome, with
`verified` when the receiver's own record shows the message.  A crash anywhere leaves enough in the record for
`drover retry` to look for the message before it sends it again: never twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Any, Literal

from pydantic import Field

from drover import limits
from drover.errors import DroverError, EmptyText, ExitCode, TargetError, TruthFileError, UsageError
from drover.fleet import LOCAL
from drover.ops import endpoints, exited
from drover.ops.core import Context, Request, Result, op
from drover.ops.hosts import call_host
from drover.ops.outcome import DecidedThenCancelled, Outcome
from drover.record import session_of
from drover.remote import protocol as P
from drover.remote.faults import fault
from drover.route import Route
from drover.targets import check_engine
from drover.truth import Message


class MessageRequest(Request):
    host: str = Field(LOCAL, description="the host the session is on")
    id: str = Field(..., description="pane id (%3), session:window.pane, or a unique name or prefix")
    text: str = Field(..., description="the message; wrapped in the cross-session envelope for agent engines")
    actor: str | None = Field(None, description="who is sending (default: $DROVER_ACTOR, else user@host)")
    via: Literal["auto", "inbox", "queue", "tmux"] = Field(
        "auto", description="the lane: auto picks the best one the session has (inbox: Claude; queue: a Codex thread)"
    )
    expect_engine: str | None = Field(None, description="refuse unless the pane runs this engine")
    as_owner: bool = Field(
        False, description="relay the owner's own words: declare the target's permission class (needs owner_relay)"
    )
    raw: bool = Field(
        False, description="a pane that runs no agent may get the raw text, at a shell prompt only (else not_an_agent)"
    )


class VerifyRequest(Request):
    ids: list[str] | None = Field(None, description="message ids (default: the recent delivered or queued, unverified)")
    limit: int = Field(20, ge=1, le=1000, description="without ids: how many recent messages to check")


class RetryRequest(Request):
    id: str = Field(..., description="the message id (msg_...) or a unique prefix")


BRIEF = ("id", "server", "target", "name", "engine", "pid", "cwd")


def _brief(outcome: dict[str, Any]) -> dict[str, Any]:
    """The outcome as recorded: the receiving session named, not its whole description."""
    session = outcome.get("session")
    if isinstance(session, dict):
        outcome = {**outcome, "session": {k: session[k] for k in BRIEF if k in session}}
    return outcome


def _failure(exc: DroverError, sent: bool) -> Outcome:
    """A DroverError as an outcome.  `sent`: the request that delivers had left, so its fate may be unknown."""
    members: dict[str, Any] = {
        "outcome": P.FAILED,
        "lane": None,
        "code": exc.code,
        "detail": exc.message + (f" ({exc.hint})" if exc.hint else ""),
    }
    if sent and exc.code in P.INDETERMINATE:
        # The request left; whether the text arrived is unknown. Never report it as delivered, never retry blindly.
        members["indeterminate"] = True
        members["detail"] += "; the message may or may not have arrived: `drover retry ID` looks for it before resending"
    if exc.details.get("candidates"):
        members["candidates"] = exc.details["candidates"]
    return Outcome.of(members, target_error=isinstance(exc, TargetError))


def _record(ctx: Context, msg_id: str, outcome: Outcome) -> dict[str, Any] | None:
    return ctx.truth.outcome(msg_id, outcome.to_dict())


async def _deliver(ctx: Context, host: str, msg_id: str, text: str, actor: str, options: dict[str, Any]) -> Outcome:
    """One delivery attempt to the pinned session; every failure becomes an outcome.  Ctrl-C records `interrupted`."""
    fleet = ctx.fleet
    args = {
        "target": options["pin"],
        "text": text,
        "actor": actor,
        "lane": options.get("via") or "auto",
        "expect_engine": options.get("expect_engine"),
        "settle_s": fleet.defaults.settle_s,
        "receipt_wait_s": fleet.defaults.receipt_wait_s,
        "as_owner": options.get("as_owner", False),
        "raw": options.get("raw", False),
        "msg_id": msg_id,
        "receiver_msg_id": options.get("receiver_msg_id"),
        "finish": options.get("finish", False),
        # Where it was sent from (HOST:SESSION), named in the envelope so the receiver can answer; a retry keeps it.
        "sender": (options.get("sender") or {}).get("address") or "",
    }
    try:
        return Outcome.of(_brief(await call_host(ctx, host, "deliver", args)))
    except DroverError as exc:
        return _failure(exc, sent=True)
    except asyncio.CancelledError:
        _record_interrupted(ctx, msg_id)
        raise


LOOK: Any = object()  # sessions_message's default: find the sender's session


async def sender_session(ctx: Context) -> Any:
    """The session this send comes from, or None; a failure to look is no reason to fail the send.  Looked up once
    per Context: a broadcast's hundred sends come from one session, and each look lists the local sessions."""
    from drover import self_session

    cached = getattr(ctx, "_sender_session", LOOK)
    if cached is not LOOK:
        return cached
    try:
        me, _why = await self_session.find(ctx)
    except DroverError:
        me = None
    ctx._sender_session = me  # type: ignore[attr-defined]
    return me


def _record_interrupted(ctx: Context, msg_id: str) -> None:
    # Ctrl-C, SIGTERM (or the caller gave up) with the request out: said in the record before exiting 130.
    interrupted = {"outcome": P.FAILED, "code": P.INTERRUPTED, "indeterminate": True, "detail": INTERRUPTED}
    _record(ctx, msg_id, Outcome.of(interrupted))


INTERRUPTED = "interrupted while the message was on its way: it may or may not have arrived (`drover retry ID` finds out)"


def _result(ctx: Context, msg_id: str, base: dict[str, Any], outcome: Outcome, host: str, record: bool = True) -> Result:
    """The op's answer; with `record`, the outcome is written to the truth file first."""
    warning = _record(ctx, msg_id, outcome) if record else None
    data = {"id": msg_id, **base, **outcome.to_dict()}
    if warning:
        data["warnings"] = [*data.get("warnings", []), warning]
    exit_code = outcome.exit_code
    errors = []
    if exit_code != ExitCode.OK:
        errors.append({"code": outcome.code or outcome.outcome, "message": outcome.detail, "host": host})
    return Result(data, errors, exit_code)


@op("sessions.message", MessageRequest, "deliver text to one session, safely, with a record", "drover send")
async def sessions_message(ctx: Context, req: MessageRequest, tags: dict[str, Any] | None = None, sender: Any = LOOK) -> Result:
    """`tags`: what a caller inside drover adds to the recorded options (a broadcast's id, a nudge entry).
    `sender`: the session it is sent from (a SelfSession, or None for none), when the caller knows it already;
    by default drover looks (drover/self_session.py)."""
    if not req.text.strip():
        raise EmptyText("the message text is empty", hint="give the text as an argument, or - to read it from stdin")
    if req.host in endpoints.KINDS:
        return await _endpoint_message(ctx, req, tags)
    fleet = ctx.fleet
    check_engine(fleet, req.expect_engine)  # a typo there would refuse every send as a mismatch: said, not recorded
    actor = ctx.who(req.actor)
    lim = fleet.limits
    options: dict[str, Any] = {"via": req.via, "expect_engine": req.expect_engine, "as_owner": req.as_owner, "raw": req.raw}
    options.update(tags or {})
    me = await sender_session(ctx) if sender is LOOK else sender
    if me is not None:
        options["sender"] = {**me.record(), "address": me.address}
    resolved: dict[str, Any] | None = None
    unresolved: DroverError | None = None
    host, redirect = req.host, {}  # where it goes, and (after a handoff) where it was addressed
    route: Route | None
    try:
        route = ctx.route(req.host)  # the host resolved once: the transport and every timeout read it too
        options["raw"] = req.raw or route.raw_ok(req.id)
    except DroverError as exc:
        unresolved, route = exc, None  # nothing was sent: recorded as provably failed below
    if unresolved is None:
        # Which session is it, really?  Limits count by identity, and the delivery is pinned to this one.  A name
        # no live session bears may have handed its work over: then the newest live generation, said so.
        from drover.ops.handoff import address

        where = await address(ctx, req.host, req.id)
        host, resolved, unresolved, redirect = where.host, where.answer, where.error, where.redirect
        if unresolved is not None:
            from drover.ops import gone

            unresolved = await gone.explain(ctx, req.host, req.id, unresolved)  # a dead worker is not a typo
        route = ctx.route(host) if resolved is not None else None
    if resolved is not None:
        options.update(identity=resolved["identity"], pin=resolved["pin"], receiver_msg_id=str(uuid.uuid4()))
        # Every spelling of the session, so `drover log --target` finds the message by whichever one is typed.
        options["session"] = session_of(resolved)
        if redirect:
            options["redirected_from"] = redirect["redirected_from"]
    owner_ok = bool(req.as_owner and route is not None and route.owner_relay)

    def check(recent: list[dict[str, Any]]) -> dict[str, Any] | None:
        if unresolved is not None:  # only the size limit means anything for a session that was not found
            return limits.check(lim, host, req.id, req.text, time.time(), [])
        if req.as_owner and not owner_ok:
            return {
                "outcome": P.REFUSED,
                "code": P.OWNER_RELAY_OFF,
                "detail": f"--as-owner is not allowed for {req.host}: set owner_relay = true under [hosts.{req.host}]",
            }
        return limits.check(lim, host, options.get("identity") or req.id, req.text, time.time(), recent)

    fault("before_accept")
    # The lock a send holds from its accepted event to its outcome must be one drover can take: something planted
    # under the home's locks/ is refused here, before anything is recorded, rather than leave the message pending.
    ctx.truth.check_locks()
    # Write-ahead: the message has its id and its accepted event before anything touches a session.
    msg_id, refusal = ctx.truth.accept(
        actor=actor,
        host=host,
        target=req.id,
        text=req.text,
        options=options,
        max_stored_chars=lim.max_chars,
        check=check,
        window_s=limits.window_s(lim),
    )
    base: dict[str, Any] = {"host": host, "target": req.id, "actor": actor}
    if redirect:
        base["handoff_chain"] = redirect["handoff_chain"]
    if refusal is not None:
        # accept() wrote the refusal with its accepted event, in the same write
        return _result(ctx, msg_id, base, Outcome.of({"outcome": P.REFUSED, "lane": None, **refusal}), host, record=False)
    if unresolved is not None:
        return _result(ctx, msg_id, base, _failure(unresolved, sent=False), host)
    with contextlib.ExitStack() as holding:
        try:  # a retry of this message waits until it has its outcome
            holding.enter_context(ctx.truth.working_on(msg_id, exclusive=False))
        except TruthFileError as exc:  # planted since the check above: nothing was sent, and the record says so
            return _result(ctx, msg_id, base, _failure(exc, sent=False), host)
        fault("after_accept")
        outcome = await _deliver(ctx, host, msg_id, req.text, actor, options)
        if redirect:
            outcome.redirected_from = redirect["redirected_from"]
            outcome.detail = f"{outcome.detail} (redirected from {redirect['redirected_from']}, which is gone)"
        fault("before_outcome")
        return _result(ctx, msg_id, base, outcome, host)


async def _endpoint_message(ctx: Context, req: MessageRequest, tags: dict[str, Any] | None) -> Result:
    """A message to `bot:NAME` or `adapter:NAME` (drover/ops/endpoints.py): the same record as a session's --
    accepted first, then the receiver's answer -- with no session to resolve.  Session-only choices (a lane, an
    engine, the owner's words, raw text) do not apply and are refused rather than ignored."""
    kind, name = req.host, req.id
    misfit = [
        flag
        for flag, on in (
            ("--via", req.via != "auto"),
            ("--expect-engine", req.expect_engine),
            ("--as-owner", req.as_owner),
            ("--raw", req.raw),
        )
        if on
    ]
    if misfit:
        raise UsageError(f"{', '.join(misfit)} apply to sessions, not to {kind}:{name}", hint="send to it without them")
    actor = ctx.who(req.actor)
    lim = ctx.fleet.limits
    unknown: DroverError | None = None
    try:
        endpoints.check(ctx.fleet, kind, name)
    except DroverError as exc:
        unknown = exc  # recorded as provably failed, as a send to an unknown host is
    options = {**endpoints.options(kind, name), **(tags or {})}

    def check(recent: list[dict[str, Any]]) -> dict[str, Any] | None:
        return limits.check(
            lim, kind, options["identity"] if unknown is None else name, req.text, time.time(), [] if unknown else recent
        )

    ctx.truth.check_locks()
    msg_id, refusal = ctx.truth.accept(
        actor=actor,
        host=kind,
        target=name,
        text=req.text,
        options=options,
        max_stored_chars=lim.max_chars,
        check=check,
        window_s=limits.window_s(lim),
    )
    base: dict[str, Any] = {"host": kind, "target": name, "actor": actor}
    if refusal is not None:
        return _result(ctx, msg_id, base, Outcome.of({"outcome": P.REFUSED, "lane": None, **refusal}), kind, record=False)
    if unknown is not None:
        return _result(ctx, msg_id, base, _failure(unknown, sent=False), kind)
    with contextlib.ExitStack() as holding:
        try:
            holding.enter_context(ctx.truth.working_on(msg_id, exclusive=False))
        except TruthFileError as exc:
            return _result(ctx, msg_id, base, _failure(exc, sent=False), kind)
        outcome = await _endpoint_attempt(ctx, kind, name, msg_id, req.text, actor, 1)
        return _result(ctx, msg_id, base, outcome, kind)


async def _endpoint_attempt(ctx: Context, kind: str, name: str, msg_id: str, text: str, actor: str, attempt: int) -> Outcome:
    try:
        return await endpoints.deliver(ctx, kind, name, msg_id=msg_id, text=text, actor=actor, attempt=attempt)
    except DroverError as exc:
        return _failure(exc, sent=True)
    except DecidedThenCancelled as exc:  # stopped after the receiver had decided: what it decided is the record's
        _record(ctx, msg_id, exc.outcome)
        raise
    except asyncio.CancelledError:
        _record_interrupted(ctx, msg_id)
        raise


# -- finishing a message later -----------------------------------------------------------------------------------


def _one(ctx: Context, ref: str) -> Message:
    hits, count, _stats = ctx.truth.find(ref)
    if not hits:
        raise TargetError(f"no message {ref!r} in {ctx.truth.path}", code=P.MESSAGE_NOT_FOUND, hint="`drover log` lists them")
    if count > 1:
        raise TargetError(f"{ref!r} is a prefix of {count} messages", code=P.AMBIGUOUS_MESSAGE, hint="give more of the id")
    return hits[0]


async def _look(ctx: Context, m: Message) -> dict[str, Any]:
    """Ask the message's host whether its session's record shows it, and whether it sits in the input box."""
    if m.host in endpoints.KINDS:
        return endpoints.unseen(m.host)
    pin = m.options.get("pin")
    if not pin:
        raise TargetError(
            f"{m.id} names no resolved session (it was refused or failed before one was found)", code=P.SESSION_NOT_FOUND
        )
    lane = m.lane or ("inbox" if m.options.get("via") == "inbox" else "tmux")
    args = {"target": pin, "lane": lane, "msg_id": m.id, "receiver_msg_id": m.options.get("receiver_msg_id"), "since": m.ts}
    seen = await call_host(ctx, m.host, "verify", args)
    # A headless session has one lane, whatever the message recorded (its sender may have died before its outcome).
    seen["lane"] = "headless" if (seen.get("session") or {}).get("headless") else lane
    return dict(seen)


def _verified_outcome(m: Message, seen: dict[str, Any], why: str) -> Outcome:
    return Outcome.of(
        {
            "outcome": P.DELIVERED,
            "lane": seen["lane"],
            "detail": why,
            "verified": True,
            "verification": seen["how"],
            "session": _brief({"session": seen.get("session")}).get("session"),
        }
    )


@op("messages.verify", VerifyRequest, "look for messages in their receivers' own records; record the ones found", "drover verify")
async def messages_verify(ctx: Context, req: VerifyRequest) -> Result:
    if req.ids:
        todo = [_one(ctx, ref) for ref in req.ids]
    else:
        recent = ctx.truth.query(limit=max(req.limit * 5, 50)).messages
        todo = [
            m
            for m in recent
            if (m.outcome in (P.DELIVERED, P.QUEUED) and not m.verified)
            # A message resolved as session_exited has no receiver left to look in: `retry` is its way on.
            or (m.outcome == P.FAILED and m.indeterminate and m.code != P.SESSION_EXITED)
        ][-req.limit :]
    rows: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    for m in todo:
        row: dict[str, Any] = {"id": m.id, "host": m.host, "target": m.target, "outcome": m.outcome}
        if m.verified:
            row.update(verified=True, verification=m.verification)
        else:
            try:
                seen = await _look(ctx, m)
            except DroverError as exc:
                row.update(verified=False, verification=exc.message)
                errors.append({**exc.to_dict(), "id": m.id})
            else:
                row.update(verified=bool(seen["found"]), verification=seen["how"])
                if seen["found"]:
                    _record(ctx, m.id, _verified_outcome(m, seen, "found in the receiver's record by drover verify"))
                    row["outcome"] = P.DELIVERED
        rows.append(row)
    unverified = [r for r in rows if not r["verified"]]
    return Result({"messages": rows, "unverified": len(unverified)}, errors, ExitCode.OK if not errors else ExitCode.PARTIAL)


# Refused by drover's own policy: a retry would only undo that decision, not finish a delivery.
POLICY_REFUSALS = {P.DUPLICATE, P.RATE_LIMITED, P.TOO_LARGE, P.OWNER_RELAY_OFF}


def _not_now(m: Message, code: str, detail: str, lane: str | None = None, target_error: bool = False) -> Outcome:
    """A retry that does nothing: said to the caller, never recorded (it changes nothing about the message)."""
    return Outcome.of({"outcome": P.REFUSED, "lane": lane or m.lane, "code": code, "detail": detail}, target_error=target_error)


@op("messages.retry", RetryRequest, "finish a pending, failed or uncertain message: exactly once, never twice", "drover retry")
async def messages_retry(ctx: Context, req: RetryRequest) -> Result:
    m = _one(ctx, req.id)
    base = {"host": m.host, "target": m.target, "actor": m.actor, "retry": True}
    if m.outcome == P.FAILED and m.code == P.SESSION_EXITED:
        # Its session died with it queued (drover watch run): never to that session again; to its successor, once.
        return await offer_to_successor(ctx, m, base)
    with ctx.truth.working_on(m.id, exclusive=True) as mine:
        if not mine:
            busy = "the message is being sent right now (or retried): look again when that has finished"
            return _result(ctx, m.id, base, _not_now(m, P.BUSY, busy), m.host, record=False)
        m = _one(ctx, m.id)  # as it stands now that nobody else is working on it
        return await _retry(ctx, m, base)


async def _retry(ctx: Context, m: Message, base: dict[str, Any]) -> Result:
    if m.outcome in (P.DELIVERED, P.QUEUED) and m.verified:
        done = Outcome.of({"outcome": m.outcome, "lane": m.lane, "verified": True})
        done.detail = {
            # No record of a bot's or an adapter's to look in: what says it arrived is its own answer, recorded.
            "bot": "the bot's own 2xx answer (recorded) says it arrived: nothing to do",
            "adapter": "the adapter's exit 0 (recorded) says it arrived: nothing to do",
        }.get(m.host, "already in the receiver's record: nothing to do")
        return _result(ctx, m.id, base, done, m.host, record=False)
    if m.code in POLICY_REFUSALS:
        why = f"drover's own limits refused it ({m.code}): send it again with `drover send` if you mean it"
        return _result(ctx, m.id, base, _not_now(m, str(m.code), why), m.host, record=False)
    if len(m.text) < m.text_chars:
        raise DroverError(f"{m.id} was stored without its whole text (it was refused as too large): nothing to retry")
    if m.options.get("as_owner"):
        if not ctx.route(m.host).owner_relay:
            why = f"--as-owner is not allowed for {m.host} (owner_relay is off)"
            return _result(ctx, m.id, base, _not_now(m, P.OWNER_RELAY_OFF, why), m.host, record=False)
    if m.host in endpoints.KINDS:
        # No record of the receiver's to look in: the same id goes again, and the receiver tells a repeat by it.
        if m.outcome in (P.HELD, P.REFUSED):  # the receiver decided (its exit 3 / 4, a bot's own answer)
            why = f"the {m.host} {m.outcome} it: the receiver decided; send it again with `drover send` if you mean it"
            return _result(ctx, m.id, base, _not_now(m, str(m.code or m.outcome), why), m.host, record=False)
        endpoints.check(ctx.fleet, m.host, m.target)  # removed or renamed since: unknown_endpoint, with the names
        running = endpoints.busy(ctx, m.host, m.id)
        if running:
            return _result(ctx, m.id, base, _not_now(m, P.BUSY, running), m.host, record=False)
        attempts = 1 + sum(1 for e in ctx.truth.recent(m.ts) if e.get("event") == "outcome" and e.get("id") == m.id)
        outcome = await _endpoint_attempt(ctx, m.host, m.target, m.id, m.text, m.actor, attempts)
        outcome.attempt = "retry"
        return _result(ctx, m.id, base, outcome, m.host)
    seen = await _look(ctx, m)
    if m.options.get("identity") and seen.get("identity") != m.options["identity"]:
        why = (
            # Not "gone": the same live Claude can answer as a pane first and as its registry record later.
            f"{m.options.get('pin')} no longer answers as the session this message was for ({m.options['identity']}) "
            f"but as {seen.get('identity')}: drover never redirects a message to what may be another session"
        )
        return _result(ctx, m.id, base, _not_now(m, P.SESSION_EXITED, why, target_error=True), m.host, record=False)
    deadline = time.monotonic() + SETTLE_WAIT_S
    while seen["found"] is False and seen.get("status") == "idle" and not _settled(seen, m) and time.monotonic() < deadline:
        await asyncio.sleep(0.5)  # just went idle: give anything queued in it the moment it takes to reach the record
        seen = await _look(ctx, m)
    if seen["found"]:
        found = _verified_outcome(m, seen, "it had arrived after all (found in the receiver's record): not sent again")
        return _result(ctx, m.id, base, found, m.host)
    if seen.get("in_input"):
        # Pasted, never submitted (the sender died before Enter): submit that very text, if the box holds exactly it.
        finished = await _deliver(ctx, m.host, m.id, m.text, m.actor, {**m.options, "finish": True})
        finished.attempt = "finish"
        if finished.outcome == P.REFUSED:
            return _result(ctx, m.id, base, finished, m.host, record=False)
        return _result(ctx, m.id, base, finished, m.host)
    provably_unsent = not m.uncertain and (
        (m.outcome == P.REFUSED and not m.pasted) or (m.outcome == P.FAILED and not m.indeterminate)
    )
    if seen["found"] is None and not provably_unsent:
        why = f"drover cannot prove it did not arrive ({seen['how']}), so it will not risk sending it twice"
        return _result(ctx, m.id, base, _not_now(m, P.CANNOT_VERIFY, why, seen["lane"]), m.host, record=False)
    if seen["found"] is False and not _settled(seen, m):
        why = f"the session is {seen.get('status')}: a message queued in it may still arrive; retry when it is idle"
        return _result(ctx, m.id, base, _not_now(m, P.BUSY, why, seen["lane"]), m.host, record=False)
    outcome = await _deliver(ctx, m.host, m.id, m.text, m.actor, m.options)
    outcome.attempt = "retry"
    return _result(ctx, m.id, base, outcome, m.host)


SETTLE_WAIT_S = 10.0
# An idle Claude session takes a message from its inbox into a turn, and so into its transcript, within about a
# second; drover allows five before it believes a message that is not there never came.
ARRIVAL_S = 5.0


def _settled(seen: dict[str, Any], m: Message) -> bool:
    """Idle long enough, and long enough after the message was accepted, that nothing sent to the session can
    still be on its way into its record."""
    if seen.get("status") != "idle" or time.time() - m.ts < ARRIVAL_S:
        return False
    since = seen.get("status_since")
    return not isinstance(since, (int, float)) or time.time() - since / 1000.0 > 2.0


# -- a message whose session died with it (drover/ops/exited.py): offered to the successor, once --------------


def _offered_as(ctx: Context, m: Message) -> Message | None:
    """The message that already stands for `m` at its successor, if any (read back to `m`'s own time)."""
    for ev in reversed(ctx.truth.recent(m.ts)):
        if ev["event"] == "accepted" and (ev.get("options") or {}).get(exited.OFFERED) == m.id:
            hits, _count, _stats = ctx.truth.find(ev["id"])
            return hits[0] if hits else None
    return None


async def offer_to_successor(ctx: Context, m: Message, base: dict[str, Any]) -> Result:
    """`drover retry` of a message resolved as session_exited: the successor gets it once, or a clear refusal.
    Nothing else changes such a message (its outcome is final), so it needs no hold of its own slot."""

    # One offer at a time, across processes: the look for an earlier offer and the send are one hold.  A lock of
    # its own, not the message's slot: the offer's own send takes its new message's slot, which may be that one.
    with ctx.truth.slot_lock("offer", "offer", 1) as free:
        if not free:
            busy = "another retry is offering a message to a successor right now: look again when it has finished"
            return _result(ctx, m.id, base, _not_now(m, P.BUSY, busy), m.host, record=False)
        return await _offer(ctx, m, base)


async def _offer(ctx: Context, m: Message, base: dict[str, Any]) -> Result:
    from drover.ops.handoff import follow

    where = f"{m.host}:{m.target}"
    done = _offered_as(ctx, m)
    if done is not None:
        got = Outcome.of({"outcome": done.outcome or P.FAILED, "lane": done.lane, "code": done.code})
        got.detail = f"already offered to its successor as {done.id} ({done.outcome or 'pending'}): not sent again"
        # Said of the session that had the offer (a stranger's find: the line named the dead one as the receiver).
        answer = _result(ctx, m.id, {**base, "host": done.host, "target": done.target}, got, done.host, record=False)
        answer.data["offered_as"] = done.id
        return answer
    try:
        hop = await follow(ctx, m.host, m.target)
    except DroverError as exc:
        if exc.code != P.HANDOFF_BROKEN:
            raise  # a host that cannot be asked: said so, nothing decided
        why = (
            f"{m.id} was for {where}, which exited before it arrived, and no session of its handoff chain is live: {exc.message}"
        )
        return _result(ctx, m.id, base, _not_now(m, P.SESSION_EXITED, why, target_error=True), m.host, record=False)
    if hop is None or not hop[3]:
        why = (
            f"{m.id} was for {where}, which exited before it could arrive (session_exited); no successor is "
            f"recorded: `drover handoff {where} HOST:NEW` names one, then `drover retry {m.id}` offers it there"
        )
        return _result(ctx, m.id, base, _not_now(m, P.SESSION_EXITED, why, target_error=True), m.host, record=False)
    generation, resolved, _chain, _redirected = hop
    req = MessageRequest(host=generation.host, id=resolved["pin"], text=m.text, actor=m.actor, via="auto")
    sent = await sessions_message(ctx, req, tags={exited.OFFERED: m.id})
    data = dict(sent.data or {})
    data.update(offered_from=m.id, retry=True, redirected_from=where)
    return Result(data, sent.errors, sent.exit_code)
