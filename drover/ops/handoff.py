"""sessions.handoff, and following a handoff chain: a message to a session that is gone reaches its successor.

`drover handoff HOST:OLD HOST:NEW` appends a `handoff` event to the truth file naming both sessions as they are
(the name typed, the session's id, name, pin and identity).  A send whose target resolves to no live session on
its host asks `follow`: the chain that starts at that name, generation by generation, and the newest generation
that is live now.  The message goes there and its outcome says `redirected_from`.

What it never does: redirect a message away from a session that is live (a send looks here only after its target
failed to resolve), or guess past a hole in the chain (every generation is checked by its identity, not its name:
a stranger that took a generation's name or pane is not that generation).  A chain with no live generation is a
clear failure that shows the chain.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from drover.errors import DroverError, ExitCode, InvalidRequest, TargetError, UsageError
from drover.fleet import LOCAL
from drover.ops.core import Context, Request, Result, op
from drover.ops.hosts import call_host
from drover.record import now_iso
from drover.remote import protocol as P

# A chain longer than this is a loop that slipped past the checks, or a mistake: stop and say so.
MAX_GENERATIONS = 1000


class HandoffRequest(Request):
    host: str = Field(LOCAL, description="the host of the session that hands its work over")
    id: str = Field(..., description="the session that hands over (it may have exited already)")
    to: str = Field(..., description="its successor: a live session")
    to_host: str | None = Field(None, description="the successor's host (default: the same host)")
    note: str | None = Field(None, max_length=2000, description="why, in a few words (kept in the record)")
    actor: str | None = Field(None, description="who records it (default: $DROVER_ACTOR, else user@host)")


class ChainRequest(Request):
    host: str = Field(LOCAL, description="the host the name was on")
    id: str = Field(..., description="a session name (or id) that may have handed its work over")


@dataclass
class Generation:
    """One session of a chain, as the handoff event recorded it."""

    host: str
    ref: str
    id: str | None = None
    name: str | None = None
    pin: str | None = None
    identity: str | None = None

    @classmethod
    def of(cls, side: Any) -> Generation | None:
        if not isinstance(side, dict) or not isinstance(side.get("host"), str) or not isinstance(side.get("ref"), str):
            return None
        keep = {k: side.get(k) if isinstance(side.get(k), str) else None for k in ("id", "name", "pin", "identity")}
        return cls(side["host"], side["ref"], **keep)

    def names(self) -> set[str]:
        return {n for n in (self.ref, self.id, self.name, self.pin) if n}

    def is_(self, other: Generation) -> bool:
        """The same session: by identity when both have one, else by a name on the same host."""
        if self.host != other.host:
            return False
        if self.identity and other.identity:
            return self.identity == other.identity
        return bool(self.names() & other.names())

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if v is not None}

    def label(self) -> str:
        shown = self.name or self.ref
        return f"{self.host}:{shown}" + (f" ({self.id})" if self.id and self.id != shown else "")


def _side(host: str, ref: str, resolved: dict[str, Any] | None) -> dict[str, Any]:
    side: dict[str, Any] = {"host": host, "ref": ref}
    if resolved is not None:
        session = resolved.get("session") or {}
        side.update(id=session.get("id"), name=session.get("name"), pin=resolved.get("pin"), identity=resolved.get("identity"))
    return side


def _handoffs(ctx: Context) -> list[tuple[Generation, Generation, dict[str, Any]]]:
    """Every handoff in the record, newest first (lines without the word are passed over unparsed)."""
    out = []
    for ev in ctx.truth.backward(skip=lambda raw: b'"handoff"' not in raw):
        if ev.get("event") != "handoff":
            continue
        old, new = Generation.of(ev.get("from")), Generation.of(ev.get("to"))
        if old is not None and new is not None:
            out.append((old, new, ev))
    return out


def chain_from(ctx: Context, host: str, ref: str) -> list[Generation]:
    """The chain that starts at `ref` on `host`: [the named one, its successor, ...]; [] when it handed nothing over.

    Each step takes the newest handoff out of the generation before it (a session that handed over twice meant the
    second)."""
    events = _handoffs(ctx)
    first = next((old for old, _new, _ev in events if old.host == host and ref in old.names()), None)
    if first is None:
        return []
    chain = [first]
    while True:
        step = next((new for old, new, _ev in events if old.is_(chain[-1])), None)
        if step is None or any(step.is_(g) for g in chain):
            return chain  # the end, or a loop (refused when recorded; stop here all the same)
        if len(chain) == MAX_GENERATIONS:
            raise TargetError(
                f"the handoff chain of {host}:{ref} is longer than {MAX_GENERATIONS} generations: {show(chain, {})}, and more",
                code=P.HANDOFF_BROKEN,
                hint="record a handoff from the name you use to the newest generation directly",
            )
        chain.append(step)


def show(chain: list[Generation], live: dict[int, str]) -> str:
    shown = [f"{g.label()} [{live.get(i, 'not checked')}]" for i, g in enumerate(chain)]
    if len(shown) > 8:  # a long chain: its ends, which are what a reader acts on
        shown = [*shown[:3], f"… {len(shown) - 6} more …", *shown[-3:]]
    return " → ".join(shown)


async def _alive(ctx: Context, g: Generation) -> tuple[dict[str, Any] | None, str]:
    """(the resolve answer, 'live') when generation g is live now, as itself; else (None, why not)."""
    if not g.pin:
        return None, "never resolved"
    try:
        resolved = await call_host(ctx, g.host, "resolve", {"target": g.pin})
    except TargetError as exc:
        if exc.code == P.SESSION_NOT_FOUND:
            return None, "gone"
        raise
    if g.identity and resolved.get("identity") != g.identity:
        return None, "gone (another session has its place now)"
    return resolved, "live"


async def follow(ctx: Context, host: str, ref: str) -> tuple[Generation, dict[str, Any], list[Generation], bool] | None:
    """For a target that no live session bears by name: (the generation the message goes to, its resolve answer,
    the chain, whether that is a redirect), or None when `ref` handed nothing over.

    The named generation first: if it is live (as itself), the message is its own -- never redirected away.  Then
    newest first; a generation whose host cannot be asked stops the search with that host's error (an older live
    generation is not where the work went, so drover does not deliver there when it cannot see the newer one).
    No generation live: HANDOFF_BROKEN, showing the chain."""
    chain = chain_from(ctx, host, ref)
    if len(chain) < 2:
        return None
    live: dict[int, str] = {}
    for i in [0, *range(len(chain) - 1, 0, -1)]:
        try:
            resolved, why = await _alive(ctx, chain[i])
        except DroverError as exc:
            live[i] = f"cannot tell: {exc.code}"
            exc.message = (
                f"{host}:{ref} is gone and handed its work over, but drover cannot see generation {i + 1} of its "
                f"chain ({exc.message}): {show(chain, live)}"
            )
            exc.hint = "retry when that host answers; drover will not deliver to an older generation instead"
            exc.details["chain"] = [g.to_dict() for g in chain]
            raise
        live[i] = why
        if resolved is not None:
            return chain[i], resolved, chain, i > 0
    raise TargetError(
        f"{host}:{ref} is gone and so is every session it handed its work to: {show(chain, live)}",
        code=P.HANDOFF_BROKEN,
        hint="`drover ls` shows the live sessions; `drover handoff` records a new successor",
        details={"chain": [g.to_dict() for g in chain]},
    )


@dataclass
class Addressed:
    """Where a message addressed to HOST:REF goes: the host and resolve answer, or the error; and the redirect."""

    host: str
    answer: dict[str, Any] | None = None
    error: DroverError | None = None
    redirect: dict[str, Any] = field(default_factory=dict)  # {} or {"redirected_from", "handoff_chain"}


def _no_name(error: DroverError | None, answer: dict[str, Any] | None) -> bool:
    """No live session bears the name: nothing found, or only sessions the name is a prefix of."""
    if error is not None:
        return error.code == P.SESSION_NOT_FOUND or (
            error.code == P.AMBIGUOUS_SESSION and error.details.get("matched") == "prefix"
        )
    return answer is not None and answer.get("matched") == "prefix"


async def address(ctx: Context, host: str, ref: str) -> Addressed:
    """Resolve HOST:REF as a send does: the live session that bears the name; else, when the name handed its work
    over, the newest live generation of its chain (a redirect, said so); else what resolving said (a unique prefix
    match, or the error).  Used by every op that delivers to one named session (send, nudge)."""
    answer: dict[str, Any] | None = None
    error: DroverError | None = None
    try:
        answer = await call_host(ctx, host, "resolve", {"target": ref})
    except DroverError as exc:
        error = exc
    if _no_name(error, answer):
        try:
            hop = await follow(ctx, host, ref)
        except DroverError as exc:
            return Addressed(host, None, exc)
        if hop is not None:
            generation, resolved, chain, redirected = hop
            redirect = {"redirected_from": f"{host}:{ref}", "handoff_chain": [g.to_dict() for g in chain]}
            return Addressed(generation.host, resolved, None, redirect if redirected else {})
    if answer is not None and answer.get("redirected_from"):  # a name it bore before (Claude's formerNames)
        return Addressed(host, answer, None, {"redirected_from": f"{host}:{ref}", "handoff_chain": []})
    return Addressed(host, answer, error)


@op("sessions.handoff", HandoffRequest, "record that a session handed its work to a successor", "drover handoff")
async def sessions_handoff(ctx: Context, req: HandoffRequest) -> Result:
    to_host = req.to_host or req.host
    ctx.route(req.host)  # unknown hosts are usage errors before anything is asked
    ctx.route(to_host)
    new = await call_host(ctx, to_host, "resolve", {"target": req.to})  # the successor must be live: raises if not
    try:
        old: dict[str, Any] | None = await call_host(ctx, req.host, "resolve", {"target": req.id})
    except DroverError as exc:
        if isinstance(exc, UsageError) or (isinstance(exc, TargetError) and not _no_name(exc, None)):
            raise  # ambiguous by name, or a bad request: say so rather than record a guess
        old = None  # exited already, or its host is down (the likeliest reason for a handoff): recorded by name
    if old is not None and old.get("matched") not in ("id", "name"):
        old = None  # no session bears that name (it only prefixes one, or was another's former name): by name
    old_side, new_side = _side(req.host, req.id, old), _side(to_host, req.to, new)
    if old is not None and old["identity"] == new["identity"]:
        raise InvalidRequest(f"{req.host}:{req.id} and {to_host}:{req.to} are the same session: nothing to hand over")
    old_gen, new_gen = Generation.of(old_side), Generation.of(new_side)
    assert old_gen is not None and new_gen is not None
    onward = chain_from(ctx, to_host, new_side.get("name") or req.to)
    for g in [new_gen, *onward]:
        if g.is_(old_gen) or (g.host == old_gen.host and req.id in g.names()):
            loop = " → ".join(x.label() for x in [old_gen, new_gen, *onward[1:]])
            raise InvalidRequest(
                f"this handoff would make a loop: {loop}",
                hint="a chain goes one way; record the handoff from the newest generation instead",
            )
    event = {
        "v": 1,
        "event": "handoff",
        "ts": time.time(),
        "time": now_iso(),
        "actor": ctx.who(req.actor),
        "from": old_side,
        "to": new_side,
        "note": req.note,
    }
    ctx.truth.append(event)
    chain = chain_from(ctx, req.host, req.id)
    data = {**{k: v for k, v in event.items() if k not in ("v", "event", "ts")}, "chain": [g.to_dict() for g in chain]}
    data["old_live"] = old is not None
    return Result(data)


@op("sessions.chain", ChainRequest, "a session's handoff chain, each generation live or gone", "drover handoff --show")
async def sessions_chain(ctx: Context, req: ChainRequest) -> Result:
    chain = chain_from(ctx, req.host, req.id)
    rows = []
    # A host that did not answer leaves the chain unknown there: the answer says so and fails, as every command
    # fails a host it could not ask (the rows alone would read as "no generation is live").
    unasked: list[DroverError] = []
    for g in chain:
        try:
            _resolved, why = await _alive(ctx, g)
        except DroverError as exc:
            why = f"cannot tell: {exc.message}"
            unasked.append(exc)
        rows.append({**g.to_dict(), "live": why == "live", "state": why})
    errors = [{"code": e.code, "message": e.message, "host": e.host} for e in unasked]
    exit_code = unasked[0].exit_code if unasked else ExitCode.OK
    # Where a message to this name would go now, found exactly as a send finds it.
    where = await address(ctx, req.host, req.id)
    goes_to: dict[str, Any] | None = None
    if where.answer is not None:
        goes_to = {**_side(where.host, req.id, where.answer), "redirected": bool(where.redirect)}
    elif where.error is not None:
        data = {"host": req.host, "id": req.id, "chain": rows, "delivers_to": None, "error": where.error.to_dict()}
        if where.error.code not in (P.HANDOFF_BROKEN, P.SESSION_NOT_FOUND):  # not an answer: a host that gave none
            if not any(e["host"] == where.error.host for e in errors):
                errors.append({"code": where.error.code, "message": where.error.message, "host": where.error.host})
            exit_code = exit_code or where.error.exit_code
        return Result(data, errors, exit_code)
    return Result({"host": req.host, "id": req.id, "chain": rows, "delivers_to": goes_to}, errors, exit_code)
