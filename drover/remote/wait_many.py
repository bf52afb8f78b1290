"""Waiting on several sessions of this host at once: one request, one watcher, every target looked at each round.

`drover wait A B C --any|--all` sends one such request to each host (drover/ops/wait_many.py); the waiting happens
here, on the host, never as a loop of requests over SSH.  Each round reads the host's sessions once (tmux's panes,
Claude's registry) and each target's state from them: the same evidence `drover ls` and `drover status` read.

A target is named by its identity (what the resolve step answered), never again by the name the user typed: a
name taken over by a newcomer while we wait is not the session we were asked about -- that session has exited.
"""

import json
import os
import time
from typing import Any, Dict, List, Optional, Tuple

from . import caller
from . import protocol as P
from .attention import waiting_on_human
from .discovery import Profiles, Session, discover, find, identity, public, with_state
from .protocol import HelperError

UNTILS = ("idle", "exited", "waiting", "stalled")
ROUND_S = 0.25  # between two looks at the host: local work (tmux, /proc), never a request over the network
TAIL_BYTES = 1 << 16  # how much of a transcript's end is read for its last timestamped entry


def _resolve(targets: List[str], profiles: Profiles) -> List[Dict[str, Any]]:
    """Every target named, or an error before anything is waited on."""
    out = []
    for target in targets:
        session = find({"target": target}, profiles, [])
        row = {"target": target, "identity": identity(session)}  # type: Dict[str, Any]
        row.update(_state(session, session["engine"], profiles))  # how it is as the wait starts
        row["session"] = public(session)
        out.append(row)
    return out


def last_progress(session: Session) -> Tuple[Optional[float], Optional[str]]:
    """(time of the transcript's last timestamped entry, its path): the progress evidence a stall is judged by.
    (None, path) when it has no such entry; (None, None) when the session keeps no transcript drover can read."""
    from . import transcripts

    try:
        path, _engine = transcripts.transcript_for(session, str(session.get("id") or ""))
    except HelperError:
        return None, None
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - TAIL_BYTES))
            tail = f.read(TAIL_BYTES)
    except OSError:
        return None, path
    for line in reversed(tail.splitlines()):
        try:
            rec = json.loads(line.decode("utf-8", "replace"))
        except ValueError:
            continue  # a torn line (the first of the tail, or one being written)
        if not isinstance(rec, dict):
            continue
        # Claude and Codex stamp each record with an ISO `timestamp`; the demo agent with a Unix `t`.
        ts = transcripts.parse_ts(rec.get("timestamp"))
        if ts is None and isinstance(rec.get("t"), (int, float)):
            ts = float(rec["t"])
        if ts is not None:
            return ts, path
    return None, path


def _stall(row: Dict[str, Any], session: Session, stall_after: float) -> None:
    """A working session whose last progress is more than `stall_after` seconds old is stalled.  The evidence is
    what `drover status` judges by (progress.py: the engine's own record, else the pane's last output), so the two
    never disagree; with no evidence at all it stays working (never stalled on a guess)."""
    ts, path, evidence = _progress(row, session)
    if not isinstance(ts, (int, float)):
        row["how"] = (row.get("how") or "") + "; no progress evidence to judge a stall by (%s)" % (path or "no transcript")
        return
    quiet = time.time() - ts
    if quiet > stall_after:
        row.update(state="stalled", how="working, and its last progress is %.0fs old (%s)" % (quiet, evidence))


def _progress(row: Dict[str, Any], session: Session) -> Tuple[Any, Optional[str], Optional[str]]:
    """The session's progress as `status` reads it, put in the row: (its time, the record's path, the evidence)."""
    from . import progress

    try:
        prog = progress.of(session)
    except OSError as exc:
        prog = {"source": None, "last_progress": None, "error": str(exc)}
    ts = prog.get("last_progress")
    path = progress._record_of(session)[0] if prog.get("source") not in (None, "pane") else None
    evidence = path or ("the pane's last output" if prog.get("source") == "pane" else None)
    row["progress"] = prog
    row["progress_evidence"] = evidence
    row["last_progress"] = ts
    return ts, path, evidence


def _state(session: Optional[Session], engine: Any, profiles: Profiles) -> Dict[str, Any]:
    """(state, how) of one target this round; `session` is None when its identity is no longer on the host."""
    if session is None:
        return {"state": "exited", "how": "its identity is no longer live on the host"}
    if session["engine"] != engine:
        return {"state": "exited", "how": "the %s in the pane exited (the pane now runs %s)" % (engine, session["engine"])}
    with_state(session, profiles)
    state = session.get("state", "unknown")
    if state == "gone":
        return {"state": "exited", "how": session.get("reason") or "the pane's program exited"}
    kind, reason, _since, _source = waiting_on_human(session, profiles)
    if kind is not None:
        return {"state": "waiting", "how": reason, "screen_state": state}
    if state == "idle":
        how = "Claude's registry says idle" if "_record" in session else "the pane's screen is idle"
        if "_headless" in session:
            how = "its holder's stream says no turn runs"
        return {"state": "idle", "how": how, "screen_state": state}
    return {"state": "working" if state == "busy" else state, "how": session.get("reason") or "", "screen_state": state}


def _settled(row: Dict[str, Any], until: str) -> bool:
    """Nothing more will change for this target: it reached the state, or it exited (it will never reach it), or
    (asked with `done`) this host's own record says it is done."""
    return row["state"] in (until, "exited", "done")


class _Record(object):
    """This host's own drover record, looked at for `done`/`failed` about the targets when it changed (a stat a
    round; read only when its size or inode moved): a worker's `drover done` on this host is written there."""

    def __init__(self, identities: List[str], since: float) -> None:
        self.identities = identities
        self.since = since
        self.last = None  # type: Optional[Tuple[int, int]]
        self.warned = False

    def look(self) -> Tuple[Dict[str, Dict[str, Any]], List[str]]:
        from . import own_record

        try:
            st = os.stat(os.path.join(own_record.home(), own_record.NAME))
            now = (st.st_ino, st.st_size)  # type: Optional[Tuple[int, int]]
        except OSError:
            now = None
        if now is None or now == self.last:
            return {}, []
        self.last = now
        got = own_record.events(self.identities, ("done", "failed"), since=self.since, newest_only=True)
        warnings = [] if self.warned else got["warnings"]
        self.warned = self.warned or bool(got["warnings"])
        return {ev["session"]["identity"]: ev for ev in got["events"]}, warnings


def wait_many(args: Dict[str, Any], profiles: Profiles) -> Dict[str, Any]:
    """`resolve`: the sessions `targets` name (every one, or an error); else wait on `watch`, each target pinned
    to the identity and engine its resolve answered."""
    if args.get("resolve"):
        targets = args.get("targets")
        if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
            raise HelperError(P.BAD_REQUEST, "targets must be a non-empty list of session names")
        return {"sessions": _resolve(targets, profiles)}
    watch = args.get("watch")
    if not isinstance(watch, list) or not watch or not all(isinstance(w, dict) and w.get("identity") for w in watch):
        raise HelperError(P.BAD_REQUEST, "watch must be a non-empty list of {target, identity, engine}")
    until = args.get("until", "idle")
    if until not in UNTILS:
        raise HelperError(P.BAD_REQUEST, "until must be one of %s, not %r" % (", ".join(UNTILS), until))
    mode = args.get("mode", "any")
    if mode not in ("any", "all"):
        raise HelperError(P.BAD_REQUEST, "mode must be any or all, not %r" % mode)
    timeout = float(args.get("timeout_s", 600))
    # Each target's own stall_after (the fleet's for its host and engine), else the request's.
    stall_after = {w["identity"]: float(w.get("stall_after_s") or args.get("stall_after_s") or 600) for w in watch}
    engines = [w.get("engine") for w in watch]
    started = time.monotonic()
    rows = [{"target": w.get("target"), "identity": w["identity"], "state": "unknown", "how": "not looked at yet"} for w in watch]
    # `done`: a done/failed in this host's own record settles a target as done (asked by a coordinator elsewhere,
    # whose record never sees a `drover done` run here).  `done_since`: an end recorded before it is another's.
    record = _Record([w["identity"] for w in watch], float(args.get("done_since") or 0)) if args.get("done") else None
    warnings = []  # type: List[str]
    while True:
        caller.check()  # a wait nobody awaits any more ends here
        by_identity = {}  # type: Dict[str, Session]
        for s in discover(profiles, []):
            by_identity.setdefault(identity(s), s)
        now = time.time()
        ends = {}  # type: Dict[str, Dict[str, Any]]
        if record is not None:
            ends, said = record.look()
            warnings.extend(said)
        for row, engine in zip(rows, engines):
            if row.get("settled_at") is not None:
                continue  # what it reached stands: an idle that turned busy again was still reached first
            session = by_identity.get(row["identity"])
            end = ends.get(row["identity"])
            if end is not None:
                row.update(state="done", how="a `%s` event in this host's record (%s)" % (end["event"], end.get("record")))
                row.update(event=end, settled_at=now, reached=True, waited_s=round(time.monotonic() - started, 3))
                continue
            row.update(_state(session, engine, profiles))
            if until == "stalled" and row["state"] == "working" and session is not None:
                _stall(row, session, stall_after[row["identity"]])
            if _settled(row, until):
                row["settled_at"] = now
                row["reached"] = row["state"] == until
                row["waited_s"] = round(time.monotonic() - started, 3)
        reached = [r for r in rows if r.get("reached")]
        settled = [r for r in rows if r.get("settled_at") is not None]
        # --any: one reached is the answer, and when every one has settled none ever will.  --all: every one reached,
        # and one that exited without reaching it means the answer is already no.
        if mode == "any":
            finished = bool(reached) or len(settled) == len(rows)
        else:
            finished = len(reached) == len(rows) or any(not r.get("reached") for r in settled)
        if finished or time.monotonic() - started >= timeout:
            break
        time.sleep(ROUND_S)
    for row in rows:
        row.setdefault("reached", False)
        if until != "stalled" and row["state"] == "working" and row["identity"] in by_identity:
            _progress(row, by_identity[row["identity"]])  # so the caller names it as `status` does (stalled or not)
    return {
        "sessions": rows,
        "reached": (bool(reached) if mode == "any" else len(reached) == len(rows)),
        "timed_out": not finished,
        "waited_s": round(time.monotonic() - started, 3),
        "warnings": warnings,
    }
