"""Delivery: every decision about one message in one place -- which lane, which permission class is declared,
and what the text looks like when it leaves (neutralised, and enveloped for agents).  The lanes only carry it.
"""

from typing import Any, Dict, Optional, Tuple

from . import attention, claude, codex_queue, inbox, tmux_lane, verify
from . import protocol as P
from .discovery import Profiles, Session, brief, find, pane_of, public
from .protocol import HelperError
from .text import envelope, neutralise


def declared_class(session: Session, args: Dict[str, Any]) -> Tuple[str, Dict[str, Any]]:
    """The permission class drover declares, and the evidence for it.

    A message is information, never authority: `prompting`, unless the owner relays their own words (--as-owner,
    allowed per host by the client), in which case the class the target session really runs in.
    """
    if args.get("as_owner") and session["engine"] == "codex" and session.get("thread"):
        from . import codex_policy

        mode, seen_mode, seen_in = codex_policy.permission_class(session)
        return mode, {"target_permission_mode": seen_mode, "permission_mode_source": seen_in}
    if not args.get("as_owner") or "_record" not in session:
        return "prompting", {}
    mode, seen_mode, seen_in = claude.permission_class(session)
    return mode, {"target_permission_mode": seen_mode, "permission_mode_source": seen_in}


def _wants_envelope(session: Session, profiles: Profiles) -> bool:
    return bool(profiles.get(session["engine"], {}).get("envelope"))


def native_lane(session: Session) -> Optional[str]:
    """The engine's own way in, when this session has one: `inbox` (a Claude Code session whose registry record names
    its inbox socket) or `queue` (a Codex TUI whose loaded thread drover found).  An engine too old to have one -- a
    Claude whose record names no socket, a Codex with no app-server -- has none, and keeps the guarded paste."""
    for lane in ("inbox", "queue"):
        if lane in session["lanes"]:
            return lane
    return None


NATIVE = {
    "inbox": (
        "%s is a Claude Code session with an inbox of its own: Claude decides what it takes, holds for its human or "
        "refuses -- its permission class, plan mode, a shift+tab since its last turn, crossSessionInbound, held "
        "messages -- and a paste would go around all of that, arriving as its human's own typing"
    ),
    "queue": (
        "%s is a Codex TUI whose thread is loaded: `codex queue` is its own way in (the thread runs the message as a "
        "turn of its own and leaves its dialogs alone), and a paste would type into its composer instead"
    ),
}
NATIVE_NAME = {"inbox": "its inbox", "queue": "its thread's queue"}
OWNER = "only the owner's own words go by paste (--as-owner --via tmux, where the host allows owner relay)"


def native_only(session: Session, native: str, finishing: bool) -> Dict[str, Any]:
    """The refusal of a paste to a session that has a lane of its own: why, and how to reach it instead."""
    why = NATIVE[native] % brief(session)
    if finishing:
        how = (
            "a message left pasted in its input box is not submitted by drover either: clear it or submit it there; "
            "send again without --via tmux to reach it through %s" % NATIVE_NAME[native]
        )
    else:
        how = "reach it through %s: drop --via tmux" % NATIVE_NAME[native]
    return tmux_lane.refusal(P.NATIVE_LANE, "refused: %s. %s; %s" % (why, how, OWNER), session)


def lane_unknown(session: Session) -> Optional[str]:
    """Why this session may have a lane of its own that drover cannot find, or None.

    The paste is a last resort that refuses on doubt: it goes to a Claude Code only on positive evidence that it
    has no inbox (its own registry record, naming no socket: an older Claude), and to a Codex TUI only when its
    thread is found.  A real Claude or Codex (known by its package path) with neither may have one drover cannot
    see -- a registry elsewhere, a record removed, its own pid namespace, an app-server not answering right now, two
    TUIs started together in one folder -- and a paste would go around it."""
    if "_record" in session or "_paneless" in session or not session.get("_package"):
        return None
    if session["engine"] == "claude":
        return (
            "drover cannot find this Claude Code's inbox (no registry record for it: its registry may be in a config "
            "dir drover cannot see, the record removed, or the session in a pid namespace of its own); it does not "
            "paste into a Claude that may have one"
        )
    if session["engine"] == "codex" and not session.get("thread"):
        return (
            "drover cannot find this Codex TUI's thread (its app-server did not answer, or another TUI started beside "
            "it in the same folder so their threads cannot be told apart), and nothing shows that its version lacks "
            "`codex queue`; it does not paste into a Codex that may have one.  Send again once its app-server "
            "answers, or start the TUI as `codex resume THREAD_ID` (its command line then names its thread)"
        )
    return None


def _no_lane(session: Session, lane: str, why: str) -> HelperError:
    native = native_lane(session)
    how = "use %s (drop --via)" % NATIVE_NAME[native] if native else "use --via tmux"
    return HelperError(P.BAD_LANE, "%s has no %s: %s; %s" % (brief(session), lane, why, how))


# What to do when the session's own lane cannot be used right now: said with the failure, never a paste instead.
UNUSABLE = {
    P.SOCKET_MISSING: (
        "; Claude Code listens there for as long as the session runs, so it is exiting or something removed the file "
        "(a /tmp cleaner?): nothing was sent, and drover does not paste instead, the inbox being this session's way "
        "in. Restart the session (claude --resume) for a new inbox and send again; "
    ),
    P.SOCKET_FOREIGN: (
        "; drover sends a session's inbox nothing unless its own process listens there, and does not paste instead. "
        "Restart the session (claude --resume) for a new inbox, and look at what replaced the socket; "
    ),
    P.QUEUE_UNAVAILABLE: (
        "; drover does not paste instead, the thread's queue being this session's way in. Put a `codex` that has "
        "`codex queue` on the PATH the TUI runs with (or the helper's) and send again; "
    ),
}


def _unusable(outcome: Dict[str, Any]) -> Dict[str, Any]:
    what = UNUSABLE.get(str(outcome.get("code")))
    if what:
        outcome["detail"] = "%s%s%s" % (outcome.get("detail", ""), what, OWNER)
    return outcome


def deliver(args: Dict[str, Any], profiles: Profiles) -> Dict[str, Any]:
    text = args.get("text")
    if not isinstance(text, str) or not text.strip():
        raise HelperError(P.EMPTY_TEXT, "the message text is empty")
    session = find(args, profiles, [])
    lane = args.get("lane") or "auto"
    if lane not in ("auto", "inbox", "tmux", "queue", "headless"):
        raise HelperError(P.BAD_LANE, "unknown lane %r: auto, inbox, queue, headless or tmux" % lane)
    expect = args.get("expect_engine")
    if expect and expect != session["engine"]:
        detail = "the session runs %s, not %s" % (session["engine"], expect)
        return tmux_lane.refusal(P.ENGINE_MISMATCH, detail, session)
    if "_headless" in session:
        return _headless(session, text, lane, args)
    # Native first, and only: where the engine has a lane of its own, it decides; no paste goes around it, whatever
    # drover itself would make of the screen or the transcript.  The owner relaying their own words is the exception.
    native = native_lane(session)
    if native and (lane == "tmux" or args.get("finish")) and not args.get("as_owner"):
        return native_only(session, native, bool(args.get("finish")))
    doubt = lane_unknown(session)
    if doubt and lane in ("auto", "tmux") and not args.get("as_owner"):
        detail = "refused: %s is %s. %s; %s" % (session["id"], session["engine"], doubt, OWNER)
        return tmux_lane.refusal(P.LANE_UNKNOWN, detail, session)
    actor = args.get("actor") or "unknown"
    sender = args.get("sender") or ""  # HOST:SESSION the client found the message was sent from (drover/self_session.py)
    mode, evidence = declared_class(session, args)
    # Not keystrokes on the inbox lane, but the receiver draws the text in a terminal: neutralised on every lane.
    body = neutralise(text)
    pane = pane_of(session)

    if args.get("finish"):
        if pane is None:
            raise HelperError(P.BAD_LANE, "%s has no pane whose input box could hold the message" % brief(session))
        return verified(session, _paste(session, pane, body, actor, mode, args, profiles), args)
    if lane == "inbox" or (lane == "auto" and native == "inbox"):
        if "inbox" not in session["lanes"]:
            raise _no_lane(session, "inbox", "only Claude Code sessions whose registry names an inbox socket have one")
        base = dict(evidence, session=public(session), declared_mode=mode)
        guard = lambda: human_busy(session, profiles)  # noqa: E731 - looked at right before the write
        outcome = inbox.deliver(
            session, lambda reply: envelope(body, actor, mode, from_addr=reply, sender=sender), args, base, guard
        )
        return verified(session, _unusable(outcome), args)
    if lane == "queue" or (lane == "auto" and native == "queue"):
        if "queue" not in session["lanes"]:
            why = "drover knows no Codex thread for it (only Codex sessions whose app-server names their thread have one)"
            raise _no_lane(session, "queue", why)
        # The thread's refusals stand on `auto` too: a thread that would never run the message gets no paste instead.
        payload = envelope(body, actor, mode, session=args.get("msg_id") or "", sender=sender)
        outcome = codex_queue.deliver(session, payload, args)
        if outcome.get("outcome") in (P.DELIVERED, P.QUEUED):
            outcome.update(evidence, enveloped=True, declared_mode=mode)
        return verified(session, _unusable(outcome), args)
    if pane is None:
        raise HelperError(P.BAD_LANE, "%s has no tmux pane to paste into" % brief(session))
    return verified(session, _paste(session, pane, body, actor, mode, args, profiles), args)


def _headless(session: Session, text: str, lane: str, args: Dict[str, Any]) -> Dict[str, Any]:
    """A session held by a holder on this host: its socket is its only way in (it has no pane to paste into).  The
    envelope and neutralisation are the inbox lane's; the holder's stream acknowledges the line's uuid."""
    from . import headless

    if lane not in ("auto", "headless") or args.get("finish"):
        detail = "refused: %s is a headless session: it has no pane, only its holder's socket (drop --via)" % brief(session)
        return dict(tmux_lane.refusal(P.NATIVE_LANE, detail, session), lane="headless")
    actor = args.get("actor") or "unknown"
    mode, evidence = declared_class(session, args)
    payload = envelope(neutralise(text), actor, mode, session=args.get("msg_id") or "", sender=args.get("sender") or "")
    outcome = headless.deliver(session, payload, args)
    outcome.update(evidence, declared_mode=mode, session=public(session))
    return outcome


WAITS_ON_HUMAN = (
    "refused: %s waits on its human (%s). A message through its inbox now could dismiss what they are answering "
    '(measured: Claude Code drops its start-up "Make auto mode your default?" dialog for a message), so nothing was '
    "sent; Claude holds messages itself only at a permission prompt or a held-message dialog. Send again once they "
    "have answered it (`drover wait` on %s `--until idle` waits for that)"
)


def human_busy(session: Session, profiles: Profiles) -> Optional[Dict[str, Any]]:
    """The inbox lane's refusal when its human is in the middle of a dialog Claude does not hold messages through
    (attention.inbox_blocked: Claude's own record and the pane's screen, looked at now), else None."""
    blocked = attention.inbox_blocked(session, profiles)
    if blocked is None:
        return None
    detail = WAITS_ON_HUMAN % (brief(session), blocked["reason"], session.get("name") or session["id"])
    return {"outcome": P.REFUSED, "code": P.WAITING_ON_HUMAN, "detail": detail, "human": blocked, "state": session["state"]}


def verified(session: Session, outcome: Dict[str, Any], args: Dict[str, Any]) -> Dict[str, Any]:
    """Say how drover knows: `verified` only when the receiver's own record shows the message."""
    if outcome.get("outcome") not in (P.DELIVERED, P.QUEUED) or outcome.get("verified") is True:
        return outcome  # (the inbox lane verified it while it waited: its wait ended on the receiver's record)
    lane = outcome.get("lane") or "tmux"
    if outcome["outcome"] == P.QUEUED:
        seen = verify.find(session, args, lane)
        if not seen["found"]:
            seen = dict(seen, how="queued behind a turn: it reaches the record when the turn allows (drover verify)")
    else:
        # `codex queue` exits once the daemon took the message; the turn that shows it starts a moment later.
        wait = float(args.get("verify_wait_s", 3.0)) + (7.0 if lane == "queue" else 0.0)
        seen = verify.wait_found(session, args, lane, wait)
    outcome["verified"] = bool(seen["found"])
    outcome["verification"] = seen["how"]
    if seen.get("altered"):
        outcome["altered"] = True  # it arrived with something after it that drover did not send
    return outcome


def _paste(
    session: Session, pane: Session, body: str, actor: str, mode: str, args: Dict[str, Any], profiles: Profiles
) -> Dict[str, Any]:
    rec = session.get("_record")
    if rec is not None and session["state"] == "waiting":
        # Claude says it waits on its human: whatever the screen looks like, an Enter could answer that.
        return tmux_lane.refusal(P.WAITING, "refused: Claude reports it is %s" % session["reason"], pane, P.WAITING)
    if pane.get("dead"):
        # Said before what the pane runs: a dead pane kept by remain-on-exit is a session that is gone, and advice
        # about --raw would send a person after a program that is not there (a stranger's find).
        return tmux_lane.refusal(P.PANE_DEAD, "%s is a dead pane: its program has exited (tmux kept the pane)" % pane["id"], pane)
    if pane["engine"] == "unknown":
        detail = (
            "%s runs %s, named like an agent but with no evidence of being one (no agent package path, no Claude "
            "registry record): drover types nothing into it, --raw or not (a fleet's [engines.NAME] commands vouch for "
            "a program of your own -- not for a real Claude Code or Codex, which drover reaches through its own lane "
            "once it finds it: vouching for one would let a paste go around that lane)"
        )
        return tmux_lane.refusal(P.UNVERIFIED_ENGINE, detail % (pane["id"], pane.get("command") or "a program"), pane)
    if pane["engine"] == "shell" and not args.get("raw"):
        detail = (
            "%s runs no agent (%s): drover types into a plain program only when asked (--raw, or raw = [...] for this "
            "host in fleet.toml), and then only at a shell prompt"
        )
        return tmux_lane.refusal(P.NOT_AN_AGENT, detail % (pane["id"], pane.get("command") or "unknown"), pane)
    if pane["engine"] == "claude" and mode == "prompting":
        # Permission parity, for a Claude with no inbox of its own (an older version, or a pane before its registry
        # record): what an inbox would hold for the session's human, the pane does not get either.  (A Claude with
        # an inbox gets no paste but the owner's, and the owner's declares the class the session runs in.)
        held_class, seen_mode, seen_in = claude.permission_class(session)
        if held_class == "bypass":
            detail = (
                "the session bypasses permission prompts (%s, seen in its %s), so its inbox would hold a message that "
                "declares prompting for its human; the pane gets no more than the inbox would (--as-owner relays the "
                "owner's own words where the host allows it)"
            )
            return tmux_lane.refusal(P.WOULD_BE_HELD, detail % (seen_mode, seen_in), pane)
    status = None
    if rec is not None:
        status = lambda: (claude.record_now(rec) or {}).get("status")  # noqa: E731 - read at each look
    enveloped = _wants_envelope(pane, profiles)
    # drover's message id rides in the envelope (from-session), so the receiver's record can show it arrived.
    payload = (
        envelope(body, actor, mode, session=args.get("msg_id") or "", sender=args.get("sender") or "") if enveloped else body
    )
    if pane["engine"] == "shell":
        payload = payload.replace("\t", "\u2409")  # a Tab at a shell prompt completes file names: shown, not pressed
    # After Enter, with no input box on screen to say whether it let go of the text: the receiver's own record.
    arrived = lambda: verify.find(session, args, "tmux")["found"]  # noqa: E731
    if args.get("finish"):
        outcome = tmux_lane.finish(pane, payload, args, profiles, status, arrived)
    else:
        outcome = tmux_lane.deliver(pane, payload, args, profiles, status, arrived)
    if outcome.get("outcome") in (P.DELIVERED, P.QUEUED):
        outcome["enveloped"] = enveloped
    if enveloped:
        outcome["declared_mode"] = mode
    return outcome
