"""When drover last saw each spawned session live: `watch-seen.json` beside the record, keyed by spawn id.

`drover watch run` writes it each run; `ls`, `status` and `spawns` that see a spawned session live refresh it too,
so a worker that dies later is told "last seen" from the newest sighting, not from the spawn record's own time.
Evidence, not a record: a lost write only makes "last seen" older, never wrong the other way."""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterable
from typing import Any

from drover.ops.core import Context

SEEN_FILE = "watch-seen.json"


def path(ctx: Context) -> str:
    return os.path.join(os.path.dirname(str(ctx.truth.path)), SEEN_FILE)


def load(ctx: Context) -> dict[str, float]:
    try:
        with open(path(ctx), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return {k: float(v) for k, v in data.items() if isinstance(v, (int, float))} if isinstance(data, dict) else {}


def save(ctx: Context, seen: dict[str, float]) -> None:
    target = path(ctx)
    tmp = f"{target}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(seen, f)
        os.replace(tmp, target)
    except OSError:
        pass  # a sighting is evidence, not a record: losing one only makes "last seen" older


def note(ctx: Context, spawn_ids: Iterable[str], now: float | None = None) -> None:
    """Mark these spawns seen live now.  Read, merge (newest wins) and write under a lock of its own, so two
    commands at once each keep the other's sightings."""
    ids = sorted({s for s in spawn_ids if isinstance(s, str) and s})
    if not ids:
        return
    now = time.time() if now is None else now
    try:
        fd = os.open(path(ctx) + ".lock", os.O_WRONLY | os.O_CREAT, 0o600)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        seen = load(ctx)
        for sid in ids:
            seen[sid] = max(now, seen.get(sid, 0.0))
        save(ctx, seen)
    finally:
        os.close(fd)


def newest(ctx: Context, spawn_id: Any, recorded: float | None) -> tuple[float | None, str]:
    """(the newest time the spawn was seen live, where that came from): a sighting when it is newer than what the
    record says (`recorded`), else the record's."""
    seen = load(ctx).get(str(spawn_id)) if spawn_id else None
    if seen is not None and (recorded is None or seen > recorded):
        return seen, "sighting"
    return recorded, "record"


def spawn_ids_by_identity(ctx: Context, host: str, identities: set[str]) -> dict[str, str]:
    """identity -> the newest spawn id on `host` that became it (one backward read over `spawned` lines only)."""
    found: dict[str, str] = {}
    if not identities:
        return found
    for ev in ctx.truth.backward(skip=lambda raw: b'"spawned"' not in raw):
        if ev.get("event") != "spawned" or ev.get("host") != host:
            continue
        ident = ev.get("identity")
        if ident in identities and ident not in found and isinstance(ev.get("id"), str):
            found[ident] = ev["id"]
            if len(found) == len(identities):
                break
    return found


def note_live(ctx: Context, host: str, sessions: list[dict[str, Any]]) -> None:
    """Sessions a host just answered for as live: those drover spawned are marked seen now."""
    live = {str(s["identity"]) for s in sessions if s.get("identity") and not s.get("dead") and s.get("state") != "gone"}
    try:
        note(ctx, spawn_ids_by_identity(ctx, host, live).values())
    except Exception:  # noqa: BLE001 -- a sighting is never worth failing the listing that saw it
        pass


def load_path(home: str | os.PathLike[str]) -> dict[str, float]:
    """The sightings of the home at `home` (for tools and tests that have no Context)."""
    try:
        with open(os.path.join(os.fspath(home), SEEN_FILE), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return {k: float(v) for k, v in data.items() if isinstance(v, (int, float))} if isinstance(data, dict) else {}
