"""Sessions: every pane of every tmux server and every live Claude Code session, and naming one of them."""

import os
import re
from typing import Any, Dict, List

from . import claude, procs, tmux
from .protocol import AMBIGUOUS_SESSION, BAD_REQUEST, SESSION_NOT_FOUND, HelperError
from .screen import classify, last_line

Session = Dict[str, Any]
Profiles = Dict[str, Dict[str, Any]]


def _session_from_pane(pane: Dict[str, str], table: procs.ProcTable, profiles: Profiles) -> Session:
    server = os.path.basename(pane["socket"])
    target = "%s:%s.%s" % (pane["session_name"], pane["window_index"], pane["pane_index"])
    engine, engine_pid = procs.detect_engine(int(pane["pane_pid"] or 0), table, profiles)
    single = pane["window_panes"] == "1" and pane["session_windows"] == "1"
    try:
        since: Any = int(pane["window_activity"])
    except ValueError:
        since = None
    return {
        "id": pane["pane_id"],
        "server": server,
        "socket": pane["socket"],
        "target": target,
        "name": pane["session_name"] if single else target,
        "engine": engine,
        "pid": int(pane["pane_pid"] or 0),
        "engine_pid": engine_pid,
        "command": pane["pane_current_command"],
        "cwd": pane["pane_current_path"],
        "title": pane["pane_title"],
        "since": since,
        "dead": pane["pane_dead"] == "1",
        "in_mode": pane["pane_in_mode"] == "1",
        "input_off": pane["pane_input_off"] == "1",
        "lanes": ["tmux"],
        "_tmux_session": pane["session_name"],
        "aliases": [pane["pane_id"], "%s/%s" % (server, pane["pane_id"]), target, "%s/%s" % (server, target)],
    }


def discover(profiles: Profiles, warnings: List[str]) -> List[Session]:
    """Every session on this host: live Claude Code sessions (with their pane, if any), then the other panes."""
    panes = tmux.list_panes(warnings)
    table = procs.proc_table() if panes else procs.ProcTable()
    pane_sessions = [_session_from_pane(p, table, profiles) for p in panes]
    if any(s["engine"] == "codex" for s in pane_sessions):
        from . import codex

        codex.attach(pane_sessions, warnings)  # each Codex pane's thread, from its CODEX_HOME's app-server
    claudes = [s for s in pane_sessions if s["engine"] == "claude"]
    for s in claudes + [s for s in pane_sessions if s["engine"] == "codex"]:
        # By its package, not by a name the fleet vouches for: a real Claude or Codex whose own lane drover cannot
        # find is refused a paste (delivery.lane_unknown); a program of the user's own keeps it.
        s["_package"] = procs.by_package(int(s["engine_pid"]), profiles.get(s["engine"], {}))
    # Each Claude's registry is where the process says (its CLAUDE_CONFIG_DIR or HOME), not only the helper's.
    dirs = [procs.claude_dir_of(int(s["engine_pid"])) for s in claudes]
    records, _stale = claude.records(warnings, [d for d in dirs if d])
    by_pid = {s["engine_pid"]: s for s in claudes}
    # Keyed by process, not sessionId: `claude --resume ID` beside the running session is a second process.
    placed = {}  # type: Dict[Any, Session]
    for rec in records:  # the pane that runs the record's very process first (a Claude started inside another's)
        if rec["pid"] in by_pid:
            placed[(rec["sessionId"], rec["pid"])] = by_pid.pop(rec["pid"])
    for rec in records:
        # Then the pane whose process tree holds it: Anthropic's `node cli-wrapper.cjs` runs the binary as its
        # child, and one Claude must not show up as a paneless inbox session plus a pane to paste into.
        if (rec["sessionId"], rec["pid"]) not in placed:
            near = next((p for p in procs.ancestors(rec["pid"]) if p in by_pid), None)
            if near is not None:
                placed[(rec["sessionId"], rec["pid"])] = by_pid.pop(near)
    sessions, used = [], set()
    for rec in records:
        pane = placed.get((rec["sessionId"], rec["pid"]))
        if pane is not None:
            used.add(id(pane))
        sessions.append(claude.session_from_record(rec, pane))
    from . import headless  # sessions with no terminal, held on this host (headless.py)

    held = headless.sessions(warnings)
    # A held claude registers in Claude's registry too (measured on 2.1.328): one session, reached through its holder.
    ids = set(h["id"] for h in held)
    sessions = [s for s in sessions if not ("_record" in s and s["id"] in ids and s.get("_pane") is None)]
    return sessions + [s for s in pane_sessions if id(s) not in used] + held


def pane_of(session: Session) -> Any:
    """The tmux pane a session lives in (itself, for a pane session), or None."""
    if "_headless" in session:
        return None  # a headless session never gets a paste
    return session.get("_pane") if "_record" in session or "_paneless" in session else session


def with_state(session: Session, profiles: Profiles) -> Session:
    """The session's state with its evidence. Claude's own record is authoritative; the screen is evidence."""
    if "_headless" in session:  # its holder's word, asked when it was found
        return session
    if "_paneless" in session:  # a Codex thread no pane runs: its app-server's word is all there is
        from . import codex

        return codex.state(session)
    pane = session.get("_pane")
    if session["engine"] == "claude" and "_record" in session:
        if pane is not None and not pane["dead"]:
            try:
                screen = tmux.screen(pane["socket"], pane["id"])
            except HelperError:
                screen = ""
            session["_screen"] = screen
            session["last_line"] = last_line(screen)
            session["screen_state"] = classify(screen, profiles["claude"])["state"] if screen else "unknown"
        return session
    if session["dead"]:
        session.update(state="gone", reason="the pane's program has exited (pane is dead)")
        return session
    try:
        screen = tmux.screen(session["socket"], session["id"])
    except HelperError as exc:
        session.update(state="unknown", reason=exc.message)
        return session
    session.update(classify(screen, profiles[session["engine"]]))
    if session["in_mode"] and session["state"] != "dialog":
        session.update(state="waiting", reason="pane is in copy mode")
    session["last_line"] = last_line(screen)
    session["_screen"] = screen
    return session


def _tmux_session(session: Session) -> Any:
    return (pane_of(session) or {}).get("_tmux_session")


def brief(session: Session) -> str:
    return "%s (%s, %s)" % (session["id"], session["name"], session["engine"])


# How a target named its session, by tier: a handoff chain that starts at a name outranks a mere prefix match.
MATCHED = ("id", "name", "former_name", "prefix")
# A prefix that names a session by its id: 8 or more hex digits (and dashes, as a UUID is written).
ID_PREFIX = re.compile(r"^[0-9a-f]{8}[0-9a-f-]*$")


def resolve(target: str, sessions: List[Session]) -> Session:
    """One session for what the user typed: exact id/alias, then exact name, then a former name, then a unique
    prefix of a Claude session's id (8+ hex characters)."""
    if not target:
        raise HelperError(BAD_REQUEST, "no session named: give a pane id (%3), session:window.pane, or a name")
    tiers = (
        ("matches", lambda s: target == s["id"] or target in s["aliases"]),
        # A Claude session keeps answering to its tmux session's name once it registers (and takes Claude's own).
        # A tmux session's name names every pane in it (a Claude in window 0, a shell in window 1): more than one is
        # ambiguous, never resolved to whichever pane a name happens not to shadow.
        ("matches", lambda s: target in (s["name"], (s.get("_pane") or {}).get("name"), _tmux_session(s))),
        # A name the session bore before (Claude's formerNames): the newest generation of that name.  Only when no
        # live session bears it now, so a message is never redirected away from a session that is still live.
        ("is a former name of", lambda s: target in (s.get("former_names") or ())),
        # Only a Claude session's id, by 8+ hex characters (what `drover ls` shows): a name never matches by its
        # prefix, so a typo or a shortened name is an error, never a message to whichever session it happens to start.
        ("is an id prefix of", lambda s: bool("_record" in s and ID_PREFIX.match(target) and s["id"].startswith(target))),
    )
    for tier, (how, match) in enumerate(tiers):
        hits = [s for s in sessions if match(s)]
        if tier == 1 and len(hits) == 1 and ID_PREFIX.match(target):
            # A pane named like a prefix of a Claude session's id (what `drover ls` shows) must not take its mail.
            shadowed = [s for s in sessions if s is not hits[0] and "_record" in s and s["id"].startswith(target)]
            hits += shadowed
            how = "names one session and is an id prefix of another: " + how if shadowed else how
        if len(hits) == 1:
            if tier == 2:
                hits[0]["redirected_from"] = target
            hits[0]["_matched"] = MATCHED[tier]
            return hits[0]
        if hits:
            # Two tmux servers each with a %0: only server/%0 tells them apart, so that is how they are shown.
            servers = len(set(s.get("server") for s in hits)) > 1
            shown = [("%s/%s" % (s["server"], brief(s)) if servers and s.get("server") else brief(s)) for s in hits[:10]]
            raise HelperError(
                AMBIGUOUS_SESSION,
                "%r %s %d sessions: %s" % (target, how, len(hits), ", ".join(shown)),
                candidates=[{"id": s["id"], "server": s["server"], "name": s["name"]} for s in hits],
                matched=MATCHED[tier],  # "prefix": no session bears that name (a handoff chain may start there)
            )
    known = ", ".join(brief(s) for s in sessions[:8]) or "none"
    if len(sessions) > 8:  # said, so that a list cut short is not taken for every session there is
        known += " and %d more: drover ls" % (len(sessions) - 8)
    near = [s["name"] for s in sessions if s["name"].startswith(target)]
    said = "; names match exactly, did you mean %s?" % " or ".join(repr(n) for n in near[:3]) if near else ""
    raise HelperError(SESSION_NOT_FOUND, "no session %r on this host (sessions here: %s)%s" % (target, known, said))


def find(args: Dict[str, Any], profiles: Profiles, warnings: List[str]) -> Session:
    """The session args["target"] names; when there is none, the host's warnings (no tmux, ...) say why."""
    sessions: List[Session] = []
    try:
        sessions = discover(profiles, warnings)
        return resolve(args.get("target", ""), sessions)
    except HelperError as exc:
        if exc.code == SESSION_NOT_FOUND:
            from . import codex

            thread = codex.dormant(args.get("target", ""), sessions)  # a Codex thread id that no pane runs
            if thread is not None:
                return thread
        if exc.code == SESSION_NOT_FOUND and warnings:
            exc.message += "; note: " + "; ".join(warnings)
        raise


def identity(session: Session) -> str:
    """What a session is, however it was named: a Claude session's id, else its tmux server and pane."""
    if "_headless" in session:  # itself across holders (--resume): its engine's session or thread id
        return "%s:%s" % (session["engine"], session["id"])
    if "_record" in session:
        return "claude:%s" % session["id"]
    if "_paneless" in session:
        return "codex:%s" % session["id"]
    # With the pane's process: a new tmux server reuses `%0`, and a message is never redirected to the newcomer.
    return "tmux:%s/%s@%s" % (session["server"], session["id"], session.get("pid"))


def pin(session: Session) -> str:
    """A name that resolves to exactly this session and nothing else (for the request that delivers)."""
    if "_record" in session or "_paneless" in session or "_headless" in session:
        return str(session["id"])
    return "%s/%s" % (session["server"], session["id"])


def public(session: Session) -> Session:
    return {k: v for k, v in session.items() if not k.startswith("_") and k not in ("aliases", "socket")}
