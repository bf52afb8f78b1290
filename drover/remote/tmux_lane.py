"""The tmux lane: the guarded paste.

Load the text into a uniquely named buffer, look at the pane one last time, paste it (`paste-buffer -p -r -d`),
wait for it to settle, look again, and only then press Enter on its own.  Every look can refuse.
"""

import time
import uuid
from typing import Any, Dict, Optional, Tuple

from . import procs
from . import protocol as P
from .discovery import Profiles, Session, public
from .protocol import HelperError
from .screen import classify, paste_allowed
from .tmux import capture, pane_flags, tmux

Outcome = Dict[str, Any]


def refusal(code: str, detail: str, session: Session, state: str = "") -> Outcome:
    out = {"outcome": P.REFUSED, "lane": "tmux", "code": code, "detail": detail, "session": public(session)}
    if state:
        out["state"] = state
    return out


def check_pane(session: Session, profiles: Profiles, expect_engine: str) -> Tuple[Optional[Outcome], str, Dict[str, str]]:
    """Everything that must hold right before keys go to a pane; returns (refusal or None, screen, state)."""
    socket, pane_id = session["socket"], session["id"]
    flags = pane_flags(socket, pane_id)
    if flags["pane_dead"] == "1":
        return refusal(P.PANE_DEAD, "the pane's program has exited", session), "", {}
    if flags["pane_in_mode"] == "1":
        return refusal(P.COPY_MODE, "the pane is in copy mode: a paste would go to tmux, not the program", session), "", {}
    if flags["pane_input_off"] == "1":
        return refusal(P.INPUT_OFF, "input to the pane is turned off (select-pane -d)", session), "", {}
    engine, _pid = procs.detect_engine(int(flags["pane_pid"] or 0), procs.proc_table(), profiles)
    if engine != expect_engine:
        detail = "the pane now runs %s, not the %s that was resolved" % (engine, expect_engine)
        return refusal(P.ENGINE_CHANGED, detail, session), "", {}
    screen = capture(socket, pane_id)
    return None, screen, classify(screen, profiles[expect_engine])


def _settle(socket: str, pane_id: str, before: str, max_wait: float) -> str:
    """Wait until the paste has shown on screen and the screen stopped changing (or max_wait passed)."""
    deadline = time.monotonic() + max_wait
    last = before
    changed = False
    while time.monotonic() < deadline:
        time.sleep(0.03)
        now = capture(socket, pane_id)
        if now != before:
            if changed and now == last:
                return now
            changed = True
        last = now
    return last


def _verdict(seen: Dict[str, str], profile: Dict[str, Any], engine: str) -> Tuple[Optional[str], str]:
    """May a paste go to a pane in this state?  (refusal code, detail) or (None, "")."""
    if paste_allowed(seen, profile):
        return None, ""
    state = seen["state"]
    if state == "dialog":
        return P.DIALOG, "refused: " + seen["reason"]
    if state == "busy":
        return P.BUSY, "refused: %s, and %s does not queue typed input" % (seen["reason"], engine)
    return P.UNRECOGNISED_SCREEN, "refused: " + seen["reason"]


def _paste(session: Session, payload: str, profiles: Profiles) -> Tuple[Optional[Outcome], str, str]:
    """Load the text, look at the pane one last time, paste.  (refusal or None, screen before, state before)."""
    socket, pane_id, engine = session["socket"], session["id"], session["engine"]
    buffer = "drover-%s" % uuid.uuid4().hex
    # Load first, check last: the gap between the guard's look and the paste is a single tmux call.
    tmux(socket, ["load-buffer", "-b", buffer, "-"], data=payload.encode("utf-8"))
    pasted = False
    try:
        refused, screen, seen = check_pane(session, profiles, engine)
        if refused is not None:
            return refused, screen, ""
        code, detail = _verdict(seen, profiles[engine], engine)
        if code:
            return refusal(code, detail, session, seen["state"]), screen, seen["state"]
        try:
            tmux(socket, ["paste-buffer", "-p", "-r", "-d", "-b", buffer, "-t", pane_id])
        except HelperError as exc:
            pasted = True  # or not: tmux did not say; don't touch the buffer either
            raise HelperError(
                P.PASTE_UNCERTAIN, "tmux paste-buffer failed (%s): the text may or may not be in the pane" % exc.message
            ) from None
        pasted = True
        return None, screen, seen["state"]
    finally:
        if not pasted:
            try:
                tmux(socket, ["delete-buffer", "-b", buffer])
            except HelperError:
                pass


def deliver(session: Session, payload: str, args: Dict[str, Any], profiles: Profiles) -> Outcome:
    """Paste the payload (already neutralised and enveloped) into the session's pane and submit it, guarded."""
    engine = session["engine"]
    refused, before, state = _paste(session, payload, profiles)
    if refused is not None:
        return refused
    socket, pane_id = session["socket"], session["id"]
    try:
        _settle(socket, pane_id, before, float(args.get("settle_s", 3.0)) + len(payload) / 200000.0)
        # Re-check before Enter: the pane may have turned into a dialog while the text landed.  Lines of our own
        # text on screen are not a dialog, even if the text quotes one.
        refused, after, _seen = check_pane(session, profiles, engine)
        if refused is None:
            now = classify(after, profiles[engine], ignore_text=payload)
            if now["state"] == "dialog":
                detail = "a dialog appeared while the text was landing (%s): Enter was not sent, nothing was submitted"
                refused = refusal(P.DIALOG_AFTER_PASTE, detail % now["reason"], session, "dialog")
        if refused is not None:
            refused["pasted"] = True
            return refused
        tmux(socket, ["send-keys", "-t", pane_id, "Enter"])
    except HelperError as exc:
        # The text is in the pane; whether Enter went is unknown. Say so, never "delivered".
        return {
            "outcome": P.FAILED,
            "lane": "tmux",
            "code": exc.code,
            "detail": "the text was pasted, then %s: it may sit unsent in the input" % exc.message,
            "pasted": True,
            "indeterminate": True,
            "session": public(session),
        }
    idle = state == "idle"
    return {
        "outcome": P.DELIVERED if idle else P.QUEUED,
        "lane": "tmux",
        "detail": "pasted and submitted into an idle pane" if idle else "pasted while busy; %s queues it" % engine,
        "state": state,
        "chars": len(payload),
        "session": public(session),
    }
