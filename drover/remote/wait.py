"""Waiting for a session: Claude's own idle notice where it can send one; otherwise watching the host.

Either way the waiting happens here, on the host -- never as a loop of requests over SSH.
"""

import time
from typing import Any, Dict

from . import caller, claude, inbox, procs
from . import protocol as P
from .discovery import Profiles, Session, brief, find, pane_of, public
from .protocol import HelperError
from .screen import classify
from .tmux import capture, pane_flags


def wait_claude(session: Session, until: str, timeout: float) -> Dict[str, Any]:
    rec = session["_record"]
    started = time.monotonic()
    if until == "exited":
        while time.monotonic() - started < timeout:
            caller.check()
            if not claude.alive(rec):
                return {"reached": True, "state": "exited", "how": "watched the process on the host"}
            time.sleep(0.2)
        return {"reached": False, "state": session["state"], "how": "watched the process on the host"}
    if rec.get("status") == "idle":
        return {"reached": True, "state": "idle", "how": "already idle"}
    with inbox.ReplySocket(rec["messagingSocketPath"]) as reply:
        msg_id = inbox.subscribe_idle(rec, reply)
        # It may have gone idle between our look and the subscription: look once more.
        now = claude.record_now(rec)
        if now is not None and now.get("status") == "idle":
            return {"reached": True, "state": "idle", "how": "went idle while subscribing"}
        # A session that dies sends no notice: listen in slices and look at its process between them, so a wait
        # on a killed session ends at once instead of at its timeout.
        notice = None
        while notice is None:
            caller.check()  # a wait nobody awaits ends here (its reply socket is removed on the way out)
            left = timeout - (time.monotonic() - started)
            if left <= 0:
                return {"reached": False, "state": session["state"], "how": "notify_when_idle (no notice before the timeout)"}
            notice = reply.wait_for(
                lambda m: m.get("action") == "peer_idle_notice" and m.get("orig_msg_id") == msg_id, min(left, 0.5)
            )
            if notice is None and not claude.alive(rec):
                return {"reached": False, "state": "exited", "how": "the session's process ended while waiting"}
    state = notice.get("state") or "idle"
    return {"reached": state == until, "state": state, "finished_at": notice.get("finished_at"), "how": "notify_when_idle"}


def wait_pane(session: Session, until: str, timeout: float, profiles: Profiles) -> Dict[str, Any]:
    started = time.monotonic()
    state = "unknown"
    while True:
        caller.check()
        try:
            flags = pane_flags(session["socket"], session["id"])
        except HelperError:
            return {"reached": until == "exited", "state": "exited", "how": "the pane is gone"}
        if flags["pane_dead"] == "1":
            return {"reached": until == "exited", "state": "exited", "how": "the pane's program exited"}
        engine, _pid = procs.detect_engine(int(flags["pane_pid"] or 0), procs.proc_table(), profiles)
        if engine != session["engine"]:
            # The agent ran inside a shell and has exited: its shell is back, the session is over.
            return {"reached": until == "exited", "state": "exited", "how": "the %s in the pane exited" % session["engine"]}
        if until == "idle":
            state = classify(capture(session["socket"], session["id"]), profiles[session["engine"]])["state"]
            if state == "idle":
                return {"reached": True, "state": "idle", "how": "watched the pane on the host"}
        if time.monotonic() - started > timeout:
            return {"reached": False, "state": state, "how": "watched the pane on the host"}
        time.sleep(0.25)


def wait_headless(session: Session, until: str, timeout: float) -> Dict[str, Any]:
    """A headless session: its holder's word on its stream, asked every quarter second (on this host)."""
    from . import headless

    started = time.monotonic()
    state = session["state"]
    while True:
        caller.check()
        now = headless.session_at(session["_headless"], [])
        state = (now or {}).get("state", "gone")
        if state == "gone":
            return {"reached": until == "exited", "state": "exited", "how": (now or {}).get("reason", "its directory is gone")}
        if until == "idle" and state == "idle":
            return {"reached": True, "state": "idle", "how": "the holder's stream: no turn runs"}
        if time.monotonic() - started > timeout:
            return {"reached": False, "state": state, "how": "asked the holder on the host"}
        time.sleep(0.25)


def wait(args: Dict[str, Any], profiles: Profiles) -> Dict[str, Any]:
    until = args.get("until", "idle")
    if until not in ("idle", "exited"):
        raise HelperError(P.BAD_REQUEST, "until must be idle or exited, not %r" % until)
    timeout = float(args.get("timeout_s", 600))
    session = find(args, profiles, [])
    started = time.monotonic()
    claude_session = "_record" in session
    if "_headless" in session:
        result = wait_headless(session, until, timeout)
    elif claude_session and (until == "exited" or "inbox" in session["lanes"]):
        # Exit is watched on the process; idle comes as Claude's own notice through the inbox.
        result = wait_claude(session, until, timeout)
    else:
        pane = pane_of(session)
        if pane is None:
            raise HelperError(P.BAD_REQUEST, "%s has neither an inbox nor a pane to watch" % brief(session))
        result = wait_pane(pane, until, timeout, profiles)
    result["waited_s"] = round(time.monotonic() - started, 3)
    result["session"] = public(session)
    return result
