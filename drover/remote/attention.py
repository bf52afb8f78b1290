"""Who needs a human: every session on this host with the evidence that it waits on a person, if it does.

A session waits on a human when its engine says so -- Claude's registry `waiting` (a permission prompt, input
needed), a pane-less Codex thread's app-server `waitingOn...` -- when its screen's live region shows a dialog (a
trust or permission menu, a held message, a password prompt), or when its input box holds a person's unsent
draft.  `drover broadcast` skips such sessions and `drover board` lists the first two kinds; both ask this one
op, so they never disagree about who is waiting.

"Since when" is the time the state began where the host knows it: Claude's `statusUpdatedAt` for its own
`waiting`, the pane's last activity (the moment the dialog or the draft was drawn) for what the screen shows.
"""

from typing import Any, Dict, List, Optional, Tuple

from . import claude, discovery, tmux
from .discovery import Profiles, Session
from .protocol import HelperError
from .screen import classify

WAITING = "waiting"  # Claude's registry says so
DIALOG = "dialog"  # the screen shows one
DRAFT = "draft"  # a person's text sits in the input box
DROVER_TEXT = "drover_text"  # drover's own earlier message sits unsent in the input box (not a person's draft)
ENVELOPE = "<cross-session-message"


def _screen_seen(session: Session, profiles: Profiles) -> Dict[str, Any]:
    """What the screen says (state, reason, draft).  A pane session carries it already; a Claude session with a
    pane has only its screen, classified here with the full result (with_state keeps just the state)."""
    if "_record" not in session:
        return session
    screen = session.get("_screen") or ""
    if not screen:
        return {}
    return classify(screen, profiles["claude"])


def _pane_since(session: Session) -> Optional[int]:
    pane = discovery.pane_of(session)
    since = pane.get("since") if pane else None
    return since if isinstance(since, int) else None


def _delivery_in_progress(session: Session) -> bool:
    """Does another drover sender hold the pane's lock (a paste in the input box that is drover's, mid-delivery)?"""
    from .tmux_lane import PaneLock

    pane = discovery.pane_of(session)
    if not pane or not pane.get("socket") or not pane.get("id"):
        return False
    return PaneLock(pane["socket"], pane["id"], 0).held_by_another()


def waiting_on_human(session: Session, profiles: Profiles) -> Tuple[Optional[str], Optional[str], Any, Optional[str]]:
    """(kind, reason, since, since_source) for a session that waits on a person; (None, None, None, None) otherwise."""
    if "_record" in session and session.get("state") == "waiting":
        reason = "Claude is waiting: %s" % (session.get("waiting_for") or "for its human")
        return WAITING, reason, session.get("since"), "claude"
    if "_paneless" in session and session.get("state") == "waiting":  # a Codex thread's app-server says so
        flags = [f for f in session.get("thread_flags") or [] if isinstance(f, str) and f.startswith("waitingOn")]
        since = session.get("since")
        if isinstance(since, (int, float)) and since > 1e11:
            since = int(since / 1000)  # milliseconds
        return WAITING, "Codex is waiting: %s" % (", ".join(flags) or "for its human"), since, "codex"
    seen = _screen_seen(session, profiles)
    if seen.get("state") == "dialog":
        return DIALOG, str(seen.get("reason") or "dialog on screen"), _pane_since(session), "pane_activity"
    if seen.get("draft"):
        # Text in the input box is a person's draft only when drover did not put it there: a delivery in progress
        # (its pane lock held) is no one waiting -- a send waits for that lock -- and drover's own envelope left
        # unsent (left_in_input) is drover's, said so.
        if _delivery_in_progress(session):
            return None, None, None, None
        if ENVELOPE in str(seen.get("input") or ""):
            reason = "drover's own earlier message sits unsent in the input box (not a person's draft): clear it first"
            return DROVER_TEXT, reason, _pane_since(session), "pane_activity"
        return DRAFT, "draft in the input", _pane_since(session), "pane_activity"
    return None, None, None, None


# What Claude Code holds safely while it waits on its human, by its registry's `waitingFor`: a message sent then
# waits in its queue, the dialog stays up and its person's answer stays theirs.  Measured on 2.1.328 (docs/lanes.md):
# a tool's permission prompt (7 of 7 messages held, "1", "y", "1\r" among them; Esc still declined the tool) and
# the held-message dialog (it says "permission prompt" too: a second message was held behind the first).  Any other
# wait -- "dialog open" is Claude's word for the start-up "Make auto mode your default?" dialog (dismissed, not
# answered, by 4 of 4 messages) and for /model's menu (which held them) alike -- is not told apart, so refused.
CLAUDE_HOLDS_WHILE = ("permission prompt",)


def inbox_blocked(session: Session, profiles: Profiles) -> Optional[Dict[str, Any]]:
    """Why a message through Claude's inbox must not go now -- {"kind", "reason"} -- or None.

    The last look before the line is written, so it is taken fresh: Claude's own record as it is on disk now, the
    pane's screen now.  The record decides first: a wait Claude holds messages through (CLAUDE_HOLDS_WHILE) is
    Claude's to handle, whatever the screen shows (its prompt is on it); any other wait is refused.  A record that
    says idle or busy with a dialog on the pane's screen (drawn before Claude says so: 14-48 ms after its record went
    idle, measured at start-up) is refused too.  A session with no pane: the record alone.  A person's draft in
    the box is no reason here: the inbox never types into it."""
    rec = session.get("_record") or {}
    now = claude.record_now(rec) if rec else None
    fresh = dict(session)
    if now is not None:
        fresh["state"] = "waiting" if now.get("status") == "waiting" else str(now.get("status") or "unknown")
        fresh["waiting_for"] = now.get("waitingFor")
    pane = discovery.pane_of(session)
    fresh["_screen"] = ""
    if pane and not pane.get("dead") and pane.get("socket") and pane.get("id"):
        try:
            fresh["_screen"] = tmux.capture(pane["socket"], pane["id"])
        except HelperError:
            pass  # no screen to read: the record decides
    if fresh.get("state") == "waiting" and fresh.get("waiting_for") in CLAUDE_HOLDS_WHILE:
        return None
    kind, reason, _since, _source = waiting_on_human(fresh, profiles)
    if kind in (WAITING, DIALOG):
        return {"kind": kind, "reason": reason}
    return None


def row(session: Session, profiles: Profiles) -> Dict[str, Any]:
    out = discovery.public(session)
    out.pop("input", None)  # a person's draft is theirs: that there is one is enough
    kind, reason, since, source = waiting_on_human(session, profiles)
    out["human"] = {"kind": kind, "reason": reason, "since": since, "since_source": source} if kind else None
    out["pin"] = discovery.pin(session)
    out["identity"] = discovery.identity(session)
    if kind in (WAITING, DIALOG):  # on the board: when it last did anything (only those, so a broadcast stays cheap)
        from . import progress

        try:
            out["progress"] = progress.of(session)
        except OSError as exc:
            out["progress"] = {"source": None, "last_progress": None, "error": str(exc)}
    return out


def sessions(args: Dict[str, Any], profiles: Profiles) -> Dict[str, Any]:
    """Every session on this host with its state and, when it waits on a person, why and since when."""
    warnings: List[str] = []
    found = [discovery.with_state(s, profiles) for s in discovery.discover(profiles, warnings)]
    return {"sessions": [row(s, profiles) for s in found], "warnings": warnings}
