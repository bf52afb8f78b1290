"""board: who is waiting on a human across the fleet, oldest first.

Two lists.  `waiting`: sessions in a dialog (a trust or permission menu, a held message, a password prompt -- read
from the screen's live region) or in Claude's own `waiting` (its registry's `waitingFor`), each with what for and
since when, asked of every selected host at once (drover/remote/attention.py, the look `drover broadcast` skips
on).  `held`: messages drover sent that a receiver holds for its human -- outcome `held` in the truth file and not
since delivered (no host is asked for those).

"Since when" is when the state began where the host knows it: Claude's `statusUpdatedAt`, else, for a dialog on
screen, the pane's last activity at the board's first sighting of that dialog (that pane, that text) -- remembered,
since later output anywhere in the window moves the activity time on; when neither is known, when a board first
saw it (`first_seen`).  Sightings are kept between looks in DROVER_HOME/board-seen.json.
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Any

from pydantic import Field

from drover.errors import DroverError, ExitCode, TargetError, TruthFileError
from drover.fleet import ENDPOINT_KINDS
from drover.ops.broadcast import natural
from drover.ops.core import Context, Request, Result, op
from drover.ops.hosts import fan_exit, fan_out
from drover.remote import protocol as P

ON_BOARD = ("waiting", "dialog")  # a draft is a person at work, not a person awaited
SEEN_FILE = "board-seen.json"
HELD_SCAN = 100_000  # held messages read from the truth file, newest first (far more than anyone leaves held)


class BoardRequest(Request):
    hosts: list[str] | None = Field(None, description="hosts to ask (default: every host of the fleet)")
    tags: list[str] | None = Field(None, description="only hosts with one of these tags")
    held_since: str | None = Field(None, description="only held messages sent since: a duration (2h, 7d) or an ISO time")


class FirstSeen:
    """When the board first saw a waiting session whose start nobody knows: kept between looks in
    DROVER_HOME/board-seen.json (0600, never through a symlink), holding only what is waiting now.  At worst the
    file is lost or wrong and a `since` is off; nothing else reads it, so any trouble with it is ignored."""

    def __init__(self, home: Path) -> None:
        self.path = home / SEEN_FILE
        self.before = self._read()
        self.now: dict[str, float] = {}

    def _read(self) -> dict[str, float]:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    return {}
                data = json.loads(f.read(1 << 20))
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict):
            return {}
        return {k: float(v) for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}

    def since(self, key: str, now: float) -> float:
        self.now[key] = self.before.get(key, now)
        return self.now[key]

    def save(self, answered: set[str]) -> None:
        """Keep what the hosts that answered are waiting on now, and every other host's sightings as they were (a
        host that was not asked, or did not answer, has not stopped waiting)."""
        kept = {k: v for k, v in self.before.items() if k.split(" ", 1)[0] not in answered}
        self.now = {**kept, **self.now}
        if self.now == self.before:
            return
        tmp = self.path.with_name(f".{SEEN_FILE}.{os.getpid()}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(self.now, f)
            os.replace(tmp, self.path)
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _waiting(host: str, s: dict[str, Any], now: float, seen: FirstSeen) -> dict[str, Any]:
    human = s["human"]
    progress: dict[str, Any] = s["progress"] if isinstance(s.get("progress"), dict) else {}
    since, source = human.get("since"), human.get("since_source")
    who = s.get("identity") or s.get("id")
    if source == "pane_activity" or not isinstance(since, (int, float)):
        # The pane's activity time moves on with any output in its window (a neighbouring pane, a key press), so it
        # only bounds when a dialog appeared: the first sighting of this dialog (this pane, this text) is remembered
        # and kept while the same dialog stays.
        key = f"{host} {who} {human['kind']} {human.get('reason') or ''}"
        if isinstance(since, (int, float)):
            since = seen.since(key, min(float(since), now))
        else:
            since, source = seen.since(key, now), "first_seen"
    return {
        "host": host,
        "id": s.get("id"),
        "name": s.get("name"),
        "engine": s.get("engine"),
        "state": "waiting_on_human",  # the one vocabulary of ls, status and spawns (drover/session_state.py)
        "screen_state": human["kind"],  # what the host saw: a dialog, or Claude's own `waiting`
        "reason": human["reason"],
        "last_progress": progress.get("last_progress"),
        "evidence": {"human": human, "progress": {k: v for k, v in progress.items() if v not in (None, 0, "")}},
        "since": since,
        "since_source": source,
        "cwd": s.get("cwd"),
        "pane": s.get("pane") if s.get("pane") is not None else (s.get("id") if s.get("server") else None),
        "server": s.get("server"),
    }


def held_messages(ctx: Context, hosts: list[str], since: float | None) -> tuple[list[dict[str, Any]], list[Any]]:
    """Messages whose latest outcome is `held` (a later delivered, refused or expired outcome takes them off)."""
    found = ctx.truth.query(HELD_SCAN, since, outcome=P.HELD)
    wanted = set(hosts)
    rows = [
        {
            "id": m.id,
            "host": m.host,
            "target": m.target,
            "actor": m.actor,
            "time": m.time,
            "ts": m.ts,
            "held_at": m.outcome_time,
            "detail": m.detail,
            "text": m.text[:120],
        }
        for m in found.messages
        if m.host in wanted
    ]
    return rows, found.stats.warnings()


@op("board", BoardRequest, "who is waiting on a human across the fleet: dialogs, Claude's waiting, held messages", "drover board")
async def board(ctx: Context, req: BoardRequest) -> Result:
    from drover.ops.messages import since_ts

    hosts = ctx.select(req.hosts, req.tags)
    if req.tags and not hosts:  # as broadcast says: a tag no selected host has is a selector that matched nothing
        raise TargetError(
            f"no host has the tag(s) {', '.join(req.tags)}: nobody was asked",
            code=P.NO_MATCH,
            hint="`drover fleet show` lists the hosts and their tags",
        )
    cutoff = since_ts(req.held_since) if req.held_since else None
    answers = await fan_out(ctx, hosts, "attention", {})
    now = time.time()
    seen = FirstSeen(ctx.truth.home)
    waiting: list[dict[str, Any]] = []
    warnings: list[dict[str, Any]] = []
    hosts_out: list[dict[str, Any]] = []
    for host, data, err in answers:
        row: dict[str, Any] = {"host": host, "ok": err is None}
        if err is not None:
            row["error"] = err.to_dict()
        else:
            sessions = data.get("sessions", [])
            on = [_waiting(host, s, now, seen) for s in sessions if (s.get("human") or {}).get("kind") in ON_BOARD]
            waiting += on
            row.update(sessions=len(sessions), waiting=len(on))
            warnings += [{"host": host, "message": w} for w in data.get("warnings", [])]
        hosts_out.append(row)
    seen.save({host for host, _d, err in answers if err is None})
    waiting.sort(key=lambda w: (w["since"], w["host"], natural(str(w["id"]))))
    errors = [err.to_dict() for _h, _d, err in answers if isinstance(err, DroverError)]
    exit_code = fan_exit(answers)
    try:
        # Held by a receiver that is no host (`adapter:NAME`): on the board unless hosts were picked.
        kinds = [] if req.hosts or req.tags else list(ENDPOINT_KINDS)
        held, truth_warnings = held_messages(ctx, hosts + kinds, cutoff)
    except TruthFileError as exc:
        # The waiting sessions do not need the truth file: they are shown; the held list is said to be unknown.
        held, truth_warnings = [], [{"message": f"held messages unavailable: {exc.line()}"}]
        errors.append(exc.to_dict())
        exit_code = int(exc.exit_code) if exit_code == ExitCode.OK else exit_code
    held.sort(key=lambda h: h["ts"])
    data = {"waiting": waiting, "held": held, "hosts": hosts_out, "warnings": warnings + truth_warnings}
    return Result(data, errors, exit_code)
