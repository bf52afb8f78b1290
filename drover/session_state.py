"""A session's state, with the evidence that decided it: the host's facts, the fleet's `stall_after`, and the record.

The host says what it sees (drover/remote/): its own word (`idle`, `busy`, `waiting`, `dialog`, `gone`,
`unknown`; kept as `screen_state`), and the last progress of the session (drover/remote/progress.py).  This
module folds those with the truth file's lifecycle events into one of STATES:

| state | when |
|---|---|
| `exited` | the pane's program is gone; a Codex thread no pane runs (its app-server may keep it loaded); a session |
|          | drover spawned that is no longer live on its host |
| `waiting_on_human` | a dialog on screen, Claude's registry `waiting`, a person's copy mode |
| `done` | the newest terminal lifecycle event about this very session (by identity) is `done` or `failed` |
|        | (`failed: true` in the evidence) |
| `stalled` | working, and the newest progress evidence is older than `stall_after` |
| `working` | the engine says busy (Claude's registry, the screen's busy footer) |
| `idle` | the engine says idle |
| `unknown` | anything else -- never taken for done |

`stalled` needs a time: a busy session with no progress evidence at all stays `working` (no guess from silence).
Claude's retry entries (a 529 loop) are evidence, not progress: a session retrying for longer than `stall_after`
is stalled, with the retries in its evidence.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from drover.truth import TruthFile

STATES = ("working", "idle", "waiting_on_human", "stalled", "done", "exited", "unknown")
HOST_WORDS = {
    "busy": "working",
    "idle": "idle",
    "waiting": "waiting_on_human",
    "dialog": "waiting_on_human",
    "gone": "exited",
}
DONE_KINDS = ("done", "failed")
TERMINAL_SCAN = 100_000  # lifecycle events read, newest first, for `ls`: far more than a fleet's live sessions need


def terminal_events(truth: TruthFile, limit: int = TERMINAL_SCAN) -> list[dict[str, Any]]:
    """The newest `done` / `failed` events of the record, newest first (one backward read for a whole listing;
    lines without either word are passed over unparsed)."""
    needles = tuple(f'"event":"{k}"'.encode() for k in DONE_KINDS)
    out: list[dict[str, Any]] = []
    for ev in truth.backward(skip=lambda raw: not any(n in raw for n in needles)):
        if ev.get("event") in DONE_KINDS:
            out.append(ev)
            if len(out) >= limit:
                break
    return out


def about(ev: dict[str, Any], host: str, row: dict[str, Any]) -> bool:
    """Is this lifecycle event about this very session?  By identity where the event carries one: a name, a pane id,
    even a pid is reused by the next session, and an old worker's `done` must never be taken for the newcomer's."""
    if ev.get("host") != host:
        return False
    session = ev.get("session")
    if not isinstance(session, dict):
        return False
    if session.get("identity"):
        return bool(row.get("identity")) and session["identity"] == row.get("identity")
    # Older events with no identity: a Claude session id names one conversation, never a pane or a name.
    return bool(row.get("engine") == "claude" and session.get("id") and session.get("id") == row.get("id"))


def terminal_for(events: Iterable[dict[str, Any]], host: str, row: dict[str, Any]) -> dict[str, Any] | None:
    return next((ev for ev in events if about(ev, host, row)), None)


def pulled(ev: dict[str, Any] | None, host: str) -> dict[str, Any] | None:
    """A `done`/`failed` the host's own record holds about this session (the host's `lifecycle` answer: it writes
    its own sessions as `local`), as the coordinator calls the host, with which record it came from."""
    if not isinstance(ev, dict) or ev.get("event") not in DONE_KINDS or not isinstance(ev.get("session"), dict):
        return None
    return {**ev, "host": host, "record": {"host": host, "path": ev.get("record")}}


def newest(*found: dict[str, Any] | None) -> dict[str, Any] | None:
    """The newest of the terminal events found in several records (the coordinator's, the host's own): one end,
    counted once -- a copy pulled into the coordinator's record names the host's event it copies."""
    got = [ev for ev in found if ev is not None]
    if not got:
        return None
    return max(got, key=lambda ev: float(ev.get("ts") or 0))


def terminal_evidence(ev: dict[str, Any]) -> dict[str, Any]:
    """What a terminal event shows in a state's evidence: which end, when, what it said, and in which record."""
    out = {k: ev.get(k) for k in ("event", "id", "time", "summary") if ev.get(k)}
    out["record"] = ev.get("record") or (ev.get("pulled") or {}).get("record") or {"host": "local"}
    if isinstance(ev.get("pulled"), dict):
        out["pulled_from"] = ev["pulled"]  # copied into our record by `watch run` from the host's own
        out["time"] = ev["pulled"].get("time") or out.get("time")
    return out


def fold(
    row: dict[str, Any], *, host: str, stall_after: float, terminal: dict[str, Any] | None = None, now: float | None = None
) -> dict[str, Any]:
    """`row` (a session as the host's `list` or `status` answers it) with `state`, `since`, `last_progress`,
    `screen_state` and `evidence` set.  Pure: the caller has read the record (`terminal`) and the fleet."""
    now = time.time() if now is None else now
    word = row.get("state")
    progress: dict[str, Any] = row["progress"] if isinstance(row.get("progress"), dict) else {}
    last = progress.get("last_progress")
    last = float(last) if isinstance(last, (int, float)) and not isinstance(last, bool) else None
    evidence: dict[str, Any] = {"host_state": word, "reason": row.get("reason")}
    if row.get("engine") == "claude":
        evidence["claude_status"] = word  # the registry's own word (discovery reads it from ~/.claude/sessions)
    if row.get("screen_state"):
        evidence["screen"] = row.get("screen_state")
    if progress:
        evidence["progress"] = {k: v for k, v in progress.items() if v not in (None, 0, "")}
    if row.get("engine_pid"):
        evidence["process"] = row.get("engine_pid")
    human = row.get("human")
    if isinstance(human, dict) and human.get("kind") in ("waiting", "dialog"):
        evidence["human"] = human

    state = HOST_WORDS.get(str(word), "unknown")
    since: Any = row.get("since")
    if row.get("thread") and not row.get("server") and not row.get("pid") and state == "idle":
        # A Codex thread no pane runs: its app-server keeps it loaded after its TUI's window is killed, so "idle"
        # there is a worker that is gone, not one waiting for its next message.
        state = "exited"
        evidence["reason"] = "no process runs this Codex thread (its window is gone); its app-server keeps it loaded"
    if evidence.get("human"):
        state, since = "waiting_on_human", human.get("since") if isinstance(human, dict) else since
    if state == "working" and last is not None:
        idle_for = now - last
        evidence["stall_after"] = stall_after
        if idle_for > stall_after:
            state, since = "stalled", last
            evidence["no_progress_for"] = round(idle_for, 1)
    if terminal is not None and state not in ("exited", "waiting_on_human"):
        # The worker said it is done: that is its state while it stays, whatever the screen shows after it.
        state, since = "done", terminal.get("ts")
        evidence["terminal"] = terminal_evidence(terminal)
        if terminal.get("event") == "failed":
            evidence["failed"] = True
    elif terminal is not None:
        evidence["terminal"] = terminal_evidence(terminal)

    out = dict(row)
    out.pop("progress", None)
    out.pop("lifecycle", None)  # the host's own word about its end: folded into `terminal` above
    out.update(
        state=state,
        since=since,
        last_progress=last,
        progress_source=progress.get("source"),
        screen_state=row.get("screen_state") or word,
        evidence=evidence,
    )
    return out


def exited_row(spawned: dict[str, Any], last_seen: float | None, exited_ev: dict[str, Any] | None) -> dict[str, Any]:
    """A session drover spawned that is no longer live on its host, as `status` and `spawns` show it."""
    evidence: dict[str, Any] = {"spawn": spawned.get("id"), "host_state": None, "reason": "no longer live on its host"}
    if exited_ev is not None:
        evidence["exited_event"] = {k: exited_ev.get(k) for k in ("id", "time", "code", "last_seen") if exited_ev.get(k)}
    return {
        "id": spawned.get("session"),
        "name": spawned.get("name"),
        "engine": spawned.get("engine"),
        "cwd": spawned.get("cwd"),
        "pane": spawned.get("pane"),
        "server": spawned.get("server"),
        "identity": spawned.get("identity"),
        "spawn_id": spawned.get("id"),
        "state": "exited",
        "since": last_seen,
        "last_seen": last_seen,
        "last_progress": None,
        "screen_state": None,
        "evidence": evidence,
    }
