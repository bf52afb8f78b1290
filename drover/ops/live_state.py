"""The live state of sessions as ls, status and spawns report it: the host's facts folded with the fleet's
`stall_after` and the record's lifecycle events (drover/session_state.py), and a session drover spawned that is
gone told as `exited` instead of "no session"."""

from __future__ import annotations

import time
from typing import Any

from drover import lifecycle
from drover import session_state as S
from drover.errors import DroverError
from drover.fleet import LOCAL
from drover.ops.core import Context
from drover.ops.hosts import call_host, fan_out_each
from drover.remote import protocol as P


def terminal_events(ctx: Context, warnings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The record's done/failed events; a record that cannot be read costs the `done` state, never the listing."""
    try:
        return S.terminal_events(ctx.truth)
    except DroverError as exc:
        warnings.append({"message": f"done/failed states unavailable: {exc.message}"})
        return []


def own_record(host: str) -> bool:
    """Does the host keep a drover record of its own to ask?  `local`'s is the coordinator's own record, read here
    already: asking for it again would read it twice (and could count one end twice)."""
    return host != LOCAL


def list_args(host: str, state: bool, identities: list[str] | None = None) -> dict[str, Any]:
    """A `list` request that, for a host with its own record, also brings its `done`s (the same round trip)."""
    args: dict[str, Any] = {"state": state}
    if own_record(host):
        args["lifecycle"] = True
        if identities:
            args["lifecycle_of"] = identities
    return args


async def list_each(
    ctx: Context, hosts: list[str], state: bool, identities: dict[str, list[str]] | None = None
) -> list[tuple[str, Any, DroverError | None]]:
    async def one(host: str) -> Any:
        return await call_host(ctx, host, "list", list_args(host, state, (identities or {}).get(host)))

    return await fan_out_each(ctx, hosts, one)


def fold_rows(
    ctx: Context, host: str, rows: list[dict[str, Any]], events: list[dict[str, Any]], now: float | None = None
) -> list[dict[str, Any]]:
    now = time.time() if now is None else now
    return [
        S.fold(
            row,
            host=host,
            stall_after=ctx.fleet.stall_after(host, row.get("engine")),
            terminal=S.newest(S.terminal_for(events, host, row), S.pulled(row.get("lifecycle"), host)),
            now=now,
        )
        for row in rows
    ]


def spawned_named(ctx: Context, host: str, target: str) -> dict[str, Any] | None:
    """The newest `spawned` event on `host` whose session bore `target` (its name, session id, pane or identity)."""
    for ev in ctx.truth.backward(skip=lambda raw: b'"spawned"' not in raw):
        if ev.get("event") != "spawned" or ev.get("host") != host:
            continue
        if target in {str(ev.get(k)) for k in ("name", "session", "pane", "identity") if ev.get(k)}:
            return ev
    return None


def last_seen(ctx: Context, host: str, spawned: dict[str, Any]) -> tuple[float | None, dict[str, Any] | None]:
    """(when the record last saw the session alive, its `exited` event if one was written).  An `exited` event's
    own `last_seen` when it has one; else the newest record of its spawn (spawned, briefed)."""
    identity = spawned.get("identity")
    exited = lifecycle.latest(ctx.truth, host, [identity], ("exited",), since_ts=spawned.get("ts")) if identity else None
    if exited is not None and isinstance(exited.get("last_seen"), (int, float)):
        return float(exited["last_seen"]), exited
    newest = spawned.get("ts")
    for ev in ctx.truth.backward(skip=lambda raw: str(spawned.get("id")).encode() not in raw):
        if ev.get("id") == spawned.get("id") and str(ev.get("event", "")).startswith("spawn"):
            newest = ev.get("ts")
            break
        if isinstance(ev.get("ts"), (int, float)) and ev["ts"] < (spawned.get("ts") or 0):
            break
    return (float(newest) if isinstance(newest, (int, float)) else None), exited


async def exited_status(ctx: Context, host: str, target: str, error: DroverError) -> dict[str, Any] | None:
    """`status` of a name the host does not know: the spawned session it named, told as exited -- when the record
    has a spawn by that name whose identity is not live on the host.  None: no such spawn (a typo stays a typo)."""
    if error.code != P.SESSION_NOT_FOUND:
        return None
    spawned = spawned_named(ctx, host, target)
    if spawned is None or not spawned.get("identity"):
        return None
    [(_h, data, err)] = await list_each(ctx, [host], False, {host: [spawned["identity"]]})
    if err is not None:
        return None
    if any(s.get("identity") == spawned["identity"] for s in data.get("sessions", [])):
        return None  # alive under another name: not exited, and not the session this name names now
    seen, exited = last_seen(ctx, host, spawned)
    row = S.exited_row(spawned, seen, exited)
    theirs = S.pulled((data.get("lifecycle") or {}).get(spawned["identity"]), host)
    done = S.newest(S.terminal_for(S.terminal_events(ctx.truth), host, row), theirs)
    if done is not None:
        row["evidence"]["terminal"] = S.terminal_evidence(done)
    return {"host": host, **row}


async def live_spawns(ctx: Context, rows: list[dict[str, Any]], warnings: list[dict[str, Any]]) -> None:
    """Each spawn row's live state, in place: one `list` per host, each row matched by identity.  The state at spawn
    time stays as `spawn_state`."""
    hosts = sorted({str(r.get("host")) for r in rows if r.get("identity") and r.get("host")})
    known = set(ctx.fleet.host_names())
    asked = [h for h in hosts if h in known]
    identities: dict[str, list[str]] = {}
    for r in rows:
        if r.get("identity") and r.get("host") in known:
            identities.setdefault(str(r["host"]), []).append(str(r["identity"]))
    answers = {h: (d, e) for h, d, e in await list_each(ctx, asked, True, identities)} if asked else {}
    for host, (data, _err) in answers.items():
        # A host's record it would not trust (a link, another owner): its `done`s are not taken, and that is said.
        said = [w for w in (data or {}).get("warnings", []) if isinstance(w, str) and "drover record" in w]
        warnings += [{"host": host, "message": w} for w in said]
    events = terminal_events(ctx, warnings)
    now = time.time()
    for row in rows:
        row["spawn_state"] = row.get("state")
        host, identity = str(row.get("host")), row.get("identity")
        data, err = answers.get(host, (None, None))
        if not identity:
            row.update(state="unknown", evidence={"reason": f"spawn {row.get('spawn_state')}: no session recorded"})
            continue
        if data is None:
            why = err.message if err is not None else f"host {host!r} is not in the fleet"
            row.update(state="unknown", evidence={"reason": f"host not asked or did not answer: {why}"})
            continue
        live = next((s for s in data.get("sessions", []) if s.get("identity") == identity), None)
        if live is None:
            row.update(state="exited", since=None, evidence={"reason": "no longer live on its host"})
            theirs = S.pulled((data.get("lifecycle") or {}).get(identity), host)
            done = S.newest(S.terminal_for(events, host, row), theirs)
            if done is not None:
                row["evidence"]["terminal"] = S.terminal_evidence(done)
            continue
        folded = fold_rows(ctx, host, [live], events, now)[0]
        for key in ("state", "since", "last_progress", "progress_source", "screen_state", "evidence"):
            row[key] = folded.get(key)
