"""The tmux lane: the guarded paste.

One sender at a time per pane (a lock on the host, held from the last look through Enter).  Load the text into a
uniquely named buffer, look at the pane one last time, paste it (`paste-buffer -p -r -d`), wait for it to settle,
look again -- the input box must show the text and nothing else on screen may have turned into a dialog -- and
only then press Enter on its own.  Every look can refuse; a refusal after the paste says the text sits unsent in
the input box, and the draft rule keeps every later send out until a person clears it.
"""

import errno
import fcntl
import hashlib
import os
import re
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import line_editor, procs
from . import protocol as P
from .discovery import Profiles, Session, public
from .faults import fault
from .protocol import HelperError
from .screen import classify, is_placeholder, lines_of, paste_allowed, plain
from .tmux import capture, pane_flags, press_if, tmux, witness

Outcome = Dict[str, Any]
# A shell prompt with nothing typed after it, as most people keep PS1: `$ `, `user@host:~/src$ `,
# `[user@host src]$ `, `(venv) dev@box ~ % `.  Not a continuation `> `, a `read -p "Deploy? "` question, nor a
# prompt with a person's half-typed command after it (the text after the prompt has spaces; a PS1 here has none
# outside brackets and a leading (venv)).
PROMPT = re.compile(r"^(\([^)]*\) )?(\[[^\]]*\]|[^\s\[\]])*( ~[^\s]*)? ?[$#%❯»➜λ] ?$")
SHELLS = {"bash", "zsh", "sh", "dash", "ash", "ksh", "mksh", "fish", "tcsh", "csh"}
# tcsh's and fish's prompts end in `>` by default (Debian's tcsh `host:~> `, its built-in `> `, fish's
# `user@host ~> `), where bash's `> ` is a continuation; tcsh continues with `? `, fish draws no continuation
# prompt.  fish's default shows the directory after a space, a git branch in parentheses, and in vi bindings the
# mode first (`[I] `).
GT_PROMPT = re.compile(r"^(\[[A-Z]\] )?(\S+@\S+ )?\S*( \([^()\s]*\))?[>#] ?$")


def prompt_line(shell: str, line: str) -> bool:
    """Is `line` the shell's prompt with nothing typed after it?"""
    if PROMPT.match(line):
        return True
    return shell in ("tcsh", "fish") and bool(GT_PROMPT.match(line))


def _tty(pid: int) -> str:
    """The terminal the shell reads (its stdin)."""
    try:
        return os.readlink("/proc/%d/fd/0" % pid)
    except OSError:
        return ""


def refusal(code: str, detail: str, session: Session, state: str = "") -> Outcome:
    out = {"outcome": P.REFUSED, "lane": "tmux", "code": code, "detail": detail, "session": public(session)}
    if state:
        out["state"] = state
    return out


# -- one sender at a time -------------------------------------------------------------------------------------


class PaneLock:
    """An exclusive lock on one pane of one tmux server, so two senders never interleave a paste and an Enter.

    The lock file lives beside the tmux server's own socket (tmux keeps that directory private to the user), and is
    named for the socket's real path: every sender to that pane meets there, whatever its environment
    ($XDG_RUNTIME_DIR, $TMPDIR) and however it spelt the socket."""

    def __init__(self, socket: str, pane_id: str, timeout: float) -> None:
        real = os.path.realpath(socket)
        name = hashlib.sha256(("%s\0%s" % (real, pane_id)).encode()).hexdigest()[:32]
        self.path = os.path.join(os.path.dirname(real), ".drover-pane-%s.lock" % name)
        self.timeout = timeout
        self.fd = -1

    def __enter__(self) -> bool:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)  # closing releases the lock

    def held_by_another(self) -> bool:
        """Is a sender delivering to this pane right now (its lock taken)?  Asked without waiting and without
        creating the lock file; any trouble looking says no."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            return exc.errno in (errno.EAGAIN, errno.EACCES)
        finally:
            os.close(fd)  # closing releases the lock, if it was taken here
        return False


# -- looking ----------------------------------------------------------------------------------------------------


def _foreground_is_shell(pane_pid: int) -> bool:
    """Is the pane's shell itself -- and nothing else -- in the foreground of its terminal?  Not less, rm -i, vim,
    and not a python3 REPL that a `sh -c 'python3; exec bash'` runs in the shell's own process group."""
    fg = procs.foreground(pane_pid)
    if fg is None or fg[0] != fg[1] or fg[2] == "T":
        return False
    # A zombie reads nothing (fish leaves its finished background helpers unreaped in its own group for a while).
    alive = [pid for pid, _name in procs.group_members(fg[1]) if (procs.stat_fields(pid) or ["Z"])[0] != "Z"]
    return alive == [pane_pid]


def _shell_name(pane_pid: int, command: str) -> str:
    """The shell's own name: tmux's pane_current_command is argv[0] as the shell rewrote it (tcsh shows `-csh` or
    `usr/bin/tcsh`), the kernel's command name is not."""
    entry = procs.ProcTable(lazy=True)
    name = entry[pane_pid][1] if pane_pid in entry else ""
    return name if name in SHELLS else os.path.basename(command)


def check_shell(session: Session, flags: Dict[str, str], screen: str, text: str, profile: Dict[str, Any]) -> Optional[Outcome]:
    """For --raw: only at a shell's own prompt, and multi-line text only where the shell asked for bracketed paste."""
    current = flags.get("pane_current_command", "")
    command = _shell_name(int(flags["pane_pid"] or 0), current)
    if command not in SHELLS or not _foreground_is_shell(int(flags["pane_pid"] or 0)):
        detail = "the pane's foreground program is %s, not a shell at its prompt: drover never types into a pager, " % (
            current or "unknown"
        )
        return refusal(P.NOT_AT_PROMPT, detail + "editor, REPL or another program's question", session)
    seen = classify(screen, profile)
    if seen["state"] == "dialog":
        return refusal(P.DIALOG, "refused: the shell is asking something: %s" % seen["reason"], session, "dialog")
    nonempty = [line for line in lines_of(screen) if line.strip()]
    last = nonempty[-1].rstrip() if nonempty else ""
    if not prompt_line(command, last):
        detail = "the last line %r is not a bare shell prompt (a read -p question, a continuation, or a person's draft?)"
        return refusal(P.NOT_AT_PROMPT, detail % last[-60:], session)
    pid = int(flags["pane_pid"] or 0)
    seen_editor = line_editor.verdict(command, pid, _tty(pid), screen, bool(profile.get("tcsh_emacs")))
    if seen_editor is not None:
        return refusal(seen_editor[0], "refused before pasting: " + seen_editor[1], session)
    if "\n" in text.strip("\n"):
        # Whether the shell asked for bracketed paste cannot be read from tmux 3.3, and bash before 5.1 or a
        # `set -o vi` in command mode takes each line (or the text itself) as keys: one line, or nothing.
        detail = "multi-line text into a shell could run line by line as it lands (%s): send one line" % command
        return refusal(P.MULTILINE_UNBRACKETED, detail, session)
    return None


def check_pane(
    session: Session, profiles: Profiles, pasted: str = "", status: Optional[Callable[[], Optional[str]]] = None
) -> Tuple[Optional[Outcome], str, Dict[str, Any]]:
    """Everything that must hold right before keys go to a pane; returns (refusal or None, screen, what it shows).

    `status` reads the engine's own state (Claude's registry): busy, idle or waiting come from there, and the
    screen only adds what it alone can show -- a dialog, a draft, no input box at all.
    """
    socket, pane_id, expect = session["socket"], session["id"], session["engine"]
    flags = pane_flags(socket, pane_id)
    if flags["pane_dead"] == "1":
        return refusal(P.PANE_DEAD, "the pane's program has exited", session), "", {}
    if flags["pane_in_mode"] == "1":
        return refusal(P.COPY_MODE, "the pane is in copy mode: a paste would go to tmux, not the program", session), "", {}
    if flags["pane_input_off"] == "1":
        return refusal(P.INPUT_OFF, "input to the pane is turned off (select-pane -d)", session), "", {}
    engine, engine_pid = procs.detect_engine(int(flags["pane_pid"] or 0), procs.proc_table(), profiles)
    if engine != expect:
        detail = "the pane now runs %s, not the %s that was resolved" % (engine, expect)
        return refusal(P.ENGINE_CHANGED, detail, session), "", {}
    if engine != "shell":
        # The agent must own the terminal: stopped with Ctrl-Z or in the background, its shell would read the keys.
        fg = procs.foreground(engine_pid)
        if fg is None or fg[0] != fg[1] or fg[2] == "T":
            holder = procs.group_members(fg[1]) if fg else []
            detail = "the %s process (pid %d) is stopped or not in the foreground of its terminal%s" % (
                engine,
                engine_pid,
                ": %s has the keyboard" % holder[0][1] if holder else "",
            )
            return refusal(P.NOT_FOREGROUND, detail, session), "", {}
    # With attributes where the engine has a placeholder: it is told from a person's text by being drawn dim.
    styled = profiles[expect].get("placeholder_faint") and tmux(socket, ["capture-pane", "-p", "-e", "-t", pane_id])
    screen = plain(styled) if styled else capture(socket, pane_id)
    seen = classify(styled or screen, profiles[expect], pasted)
    seen["flags"] = flags
    own = status() if status is not None else None
    if own is not None and seen["state"] in ("idle", "busy"):
        if own == "waiting":
            return (
                refusal(P.WAITING, "refused: the session reports it is waiting for its human", session, "waiting"),
                screen,
                seen,
            )
        if own in ("idle", "busy"):
            seen["state"], seen["reason"] = own, "the session reports %s" % own
    return None, screen, seen


# A program may answer a paste with a dialog of its own: it gets this long from when the paste began to show
# (or its profile's measured `paste_hold_s`) to draw it before the second look.  With ~10 ms an Enter answered
# dialogs drawn 12-25 ms after the paste; a later dialog is safe from the Enter pressed only onto what the last
# look saw (_enter).
MIN_HOLD_S = 0.06
# A skipped Enter looks again this often: a redraw alone (a spinner) refuses nothing; a draft or a dialog does.
ENTER_TRIES = 3


def _settle(session: Session, before: str, max_wait: float, profile: Dict[str, Any], payload: str) -> str:
    """Wait until the paste shows in the input box and the screen holds still, the engine's hold at least after it
    began to show (or max_wait passed).

    Polled every 5 ms, so a program that is slow to draw costs little beyond that.  "Holds still" (two captures
    alike after the change) alone is not enough at that pace -- a program that renders a paste in two frames can
    look still between them -- so an agent's screen must also show the whole pasted text; a shell's is checked by
    its prompt line in the second look.
    """
    socket, pane_id = session["socket"], session["id"]
    whole = session["engine"] == "shell" or not profile.get("input")
    deadline = time.monotonic() + max_wait
    hold = float(profile.get("paste_hold_s", MIN_HOLD_S))
    last = before
    changed: Optional[float] = None  # when the screen first showed the paste landing: the hold counts from there
    while True:
        now = capture(socket, pane_id)
        if now != before:
            if changed is None:
                changed = time.monotonic()
            elif now == last and time.monotonic() - changed >= hold and (whole or _landed(now, profile, payload)):
                return now
        last = now
        if time.monotonic() >= deadline:
            return last
        time.sleep(0.005)


def _landed(screen: str, profile: Dict[str, Any], payload: str) -> bool:
    """The box shows the whole paste -- or a dialog came up instead (the second look refuses it; no use waiting)."""
    seen = classify(screen, profile, payload)
    return bool(seen.get("shows_paste")) or seen["state"] == "dialog"


def _verdict(seen: Dict[str, Any], profile: Dict[str, Any], engine: str) -> Tuple[Optional[str], str]:
    """May a paste go to a pane in this state?  (refusal code, detail) or (None, "")."""
    if paste_allowed(seen, profile):
        return None, ""
    state = seen["state"]
    if state == "dialog":
        return P.DIALOG, "refused: " + seen["reason"]
    if seen.get("unsent"):
        unsent = seen["unsent"]
        return P.DRAFT_IN_INPUT, (
            "refused: drover's own earlier message %s sits unsent in the input box (pasted, never submitted); nothing "
            "is pasted onto it: `drover retry %s` or clearing the box frees the pane" % (unsent, unsent)
        )
    if seen.get("draft"):
        return P.DRAFT_IN_INPUT, "refused: the input box holds text nobody sent yet (%r): a person's draft is theirs" % (
            seen["input"][:60]
        )
    if state == "busy":
        return P.BUSY, "refused: %s, and %s does not queue typed input" % (seen["reason"], engine)
    return P.UNRECOGNISED_SCREEN, "refused: " + seen["reason"]


# -- delivering -------------------------------------------------------------------------------------------------


def deliver(
    session: Session, payload: str, args: Dict[str, Any], profiles: Profiles, status: Any = None, arrived: Any = None
) -> Outcome:
    """Paste the payload (already neutralised and enveloped) into the session's pane and submit it, guarded."""
    lock = PaneLock(session["socket"], session["id"], float(args.get("lock_wait_s", 20.0)))
    with lock as held:
        if not held:
            detail = "another sender has held this pane for %.0fs: refused rather than typing over it" % lock.timeout
            return refusal(P.PANE_LOCKED, detail, session)
        return _deliver_locked(session, payload, args, profiles, status, arrived)


def finish(
    session: Session, payload: str, args: Dict[str, Any], profiles: Profiles, status: Any = None, arrived: Any = None
) -> Outcome:
    """Submit this very message if it sits, pasted and never submitted, in the input box (a sender that died between
    the paste and Enter): the box must hold exactly it, under the same looks as any Enter.  For drover retry."""
    lock = PaneLock(session["socket"], session["id"], float(args.get("lock_wait_s", 20.0)))
    with lock as held:
        if not held:
            return refusal(P.PANE_LOCKED, "another sender holds this pane", session)
        state = check_pane(session, profiles, status=status)[2].get("state", "idle")
        key = "Enter" if state == "idle" else profiles[session["engine"]].get("submit_when_busy") or "Enter"
        refused = _enter(session, payload, profiles, status, "", key)
        if refused is not None:
            refused["detail"] = "the input box does not hold exactly this message (%s): not submitted" % refused["detail"]
            refused["code"] = P.DRAFT_IN_INPUT
            return refused
        if not _submitted(session, payload, profiles, float(args.get("submit_wait_s", 3.0)), arrived):
            return dict(refusal(P.NOT_SUBMITTED, "%s was pressed but the text is still in the input box" % key, session))
    return {
        "outcome": P.DELIVERED if state == "idle" else P.QUEUED,
        "lane": "tmux",
        "detail": "it sat pasted in the input box; submitted it now",
        "state": state,
        "session": public(session),
    }


def _deliver_locked(
    session: Session, payload: str, args: Dict[str, Any], profiles: Profiles, status: Any, arrived: Any
) -> Outcome:
    engine = session["engine"]
    socket, pane_id = session["socket"], session["id"]
    buffer = "drover-%s" % uuid.uuid4().hex
    # Load first, check last: the gap between the guard's look and the paste is a single tmux call.
    tmux(socket, ["load-buffer", "-b", buffer, "-"], data=payload.encode("utf-8"))
    pasted = False
    try:
        refused, before, seen = check_pane(session, profiles, status=status)
        if refused is None and engine == "shell":
            refused = check_shell(session, seen["flags"], before, payload, profiles[engine])
        elif refused is None and not profiles[engine].get("input") and "\n" in payload.strip("\n"):
            # A program whose profile names no input box (a custom REPL) is checked after the paste by its prompt
            # line, as a shell is: text over several lines could not be seen whole there, and would be left behind.
            detail = "the %s profile names no input box, so a paste is checked on the prompt line: send one line" % engine
            refused = refusal(P.MULTILINE_UNBRACKETED, detail + " (or give the profile an `input` pattern)", session)
        if refused is None:
            code, detail = _verdict(seen, profiles[engine], engine)
            if code:
                refused = refusal(code, detail, session, seen["state"])
                if seen.get("unsent"):
                    refused["unsent"] = seen["unsent"]
        if refused is not None:
            return refused
        state = seen["state"]
        try:
            tmux(socket, ["paste-buffer", "-p", "-r", "-d", "-b", buffer, "-t", pane_id])
        except HelperError as exc:
            pasted = True  # or not: tmux did not say; don't touch the buffer either
            raise HelperError(
                P.PASTE_UNCERTAIN, "tmux paste-buffer failed (%s): the text may or may not be in the pane" % exc.message
            ) from None
        pasted = True
    finally:
        if not pasted:
            try:
                tmux(socket, ["delete-buffer", "-b", buffer])
            except HelperError:
                pass
    profile = profiles[engine]
    try:
        _settle(session, before, float(args.get("settle_s", 3.0)) + len(payload) / 200000.0, profile, payload)
        # Some engines take an Enter that follows a paste too closely as a newline (gemini-cli under tmux): wait
        # here, before the last look, so that nothing but a tmux call stands between that look and Enter.
        time.sleep(float(profile.get("submit_delay_s") or 0))
        fault("after_paste")
        key = "Enter" if state == "idle" else profile.get("submit_when_busy") or "Enter"
        refused = _enter(session, payload, profiles, status, before, key)
        if refused is not None:
            refused.update(pasted=True, left_in_input=True)
            refused["detail"] += "; the text sits unsent in the input box, and drover sends nothing more here until it is cleared"
            return refused
        fault("after_enter")
        dialogs: List[str] = []  # one drawn in the instant before the Enter may have taken it as its answer
        if engine != "shell" and not _submitted(session, payload, profiles, args.get("submit_wait_s", 3.0), arrived, dialogs):
            seen_dialog = "then a dialog showed (%s), which the %s may have answered, and " % (dialogs[0], key) if dialogs else ""
            detail = (
                "%s was pressed but %sthe text is still in the input box: it was not submitted, and drover sends "
                "nothing more here until it is cleared" % (key, seen_dialog)
            )
            # A slow program may still take it: not provably unsent, so never retried blindly.
            refused = refusal(P.NOT_SUBMITTED, detail, session, "dialog" if dialogs else "")
            return dict(refused, outcome=P.FAILED, pasted=True, left_in_input=True, indeterminate=True)
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


def _submitted(
    session: Session, payload: str, profiles: Profiles, seconds: float, arrived: Any = None, dialogs: Any = None
) -> bool:
    """After Enter: has the input box let go of the text?  (A delivery drover did not see is not a delivery.)

    An empty box says so.  Anything else says nothing certain by itself: no box at all, or a box with part of the
    text, is what a frame caught half-drawn looks like (a program that draws in two writes, tens of ms apart), and
    a box with other text may be a person typing at once.  Then the receiver's own record decides, where drover can
    read one (`arrived`); where it cannot, a box without the paste, or no box in two looks in a row, is taken as
    let go (all a screen can say).  A dialog seen on the way is added to `dialogs` (its reason)."""
    profile = profiles[session["engine"]]
    deadline = time.monotonic() + float(seconds)
    boxless = 0
    asked = 0.0  # the record is read at most every 100 ms (the first time at once)
    known: Optional[bool] = None  # what it said last: None, it keeps none drover can read
    while True:
        seen = classify(capture(session["socket"], session["id"]), profile, pasted=payload)
        if seen["state"] == "dialog" and dialogs == []:
            dialogs.append(seen["reason"])
        text = seen.get("input")
        if text is not None and (not text or is_placeholder(text, profile)):
            return True
        boxless = boxless + 1 if text is None else 0
        if not seen.get("shows_paste"):
            if arrived is not None and time.monotonic() - asked >= 0.1:
                asked = time.monotonic()
                known = arrived()
                if known:
                    return True
            if arrived is None or known is None:
                if text is not None or boxless >= 2:
                    return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.015)


def _enter(session: Session, payload: str, profiles: Profiles, status: Any, before: str, key: str) -> Optional[Outcome]:
    """The last look, then `key` pressed only onto the screen that look saw; None once it is pressed, else why not.

    The pane's witness (its cursor, scrollback, size and state: tmux.WITNESS) is read first, then the whole second
    look judges the screen, and tmux presses the key only if the witness still reads the same -- compared inside the
    tmux server in the same step as the key.  A dialog drawn or a key a person typed after the witness moves the
    cursor of a program that keeps it in its box or on its choices (Claude Code, Codex, the demo agent), and the
    Enter is not pressed: the pane is looked at again, and that look refuses what it now shows."""
    socket, pane_id = session["socket"], session["id"]
    changed = ""
    for _ in range(ENTER_TRIES):
        seen = witness(socket, pane_id)
        refused = _second_look(session, payload, profiles, status, before)
        if refused is not None:
            if changed:
                if refused["code"] != P.DIALOG_AFTER_PASTE:
                    refused["code"] = P.CHANGED_BEFORE_ENTER
                refused["detail"] = "%s; %s" % (changed, refused["detail"])
            return refused
        if press_if(socket, pane_id, key, seen):
            return None
        changed = "the pane changed between drover's last look and {0} (a key typed, a dialog drawn?): {0} was not pressed"
        changed = changed.format(key)
    return refusal(P.CHANGED_BEFORE_ENTER, changed + ", and it kept changing at every look", session)


def _second_look(session: Session, payload: str, profiles: Profiles, status: Any, before: str) -> Optional[Outcome]:
    """Before Enter: the input box must show what was pasted, and nothing apart from it may have become a dialog.

    The pasted text itself is never searched for dialog words (it may quote them); only the screen around it is.
    """
    engine = session["engine"]
    refused, _after, seen = check_pane(session, profiles, pasted=payload, status=status)
    if refused is not None:
        return refused
    if seen["state"] == "dialog":
        detail = "a dialog appeared while the text was landing (%s): Enter was not sent" % seen["reason"]
        return refusal(P.DIALOG_AFTER_PASTE, detail, session, "dialog")
    if engine == "shell" or not profiles[engine].get("input"):
        # The prompt line must now read: the prompt it showed before, then exactly the pasted text -- read with
        # wrapped lines joined (-J): a command longer than the pane is one line to the shell, several on screen.
        prompt = [line for line in lines_of(before) if line.strip()][-1:]
        # From far enough back (-S) to hold the prompt even when the wrapped command pushed it off the top.
        back = "-%d" % (len(payload) // 10 + 50)
        joined = tmux(session["socket"], ["capture-pane", "-p", "-J", "-S", back, "-t", session["id"]])
        now = [line.rstrip() for line in lines_of(joined) if line.strip()][-1:]
        typed = now[0][len(prompt[0]) :].strip() if prompt and now and now[0].startswith(prompt[0]) else None
        if typed != payload.strip():
            shown = now[0][-60:] if now else ""
            detail = "after the paste the prompt line reads %r, not the prompt followed by the text: Enter was not sent"
            return refusal(P.PASTE_NOT_SHOWN, detail % shown, session)
        return None
    if seen.get("input") is None or not seen.get("shows_paste"):
        detail = "after the paste the input box does not show the text (%s): Enter was not sent" % seen["reason"]
        return refusal(P.PASTE_NOT_SHOWN, detail, session, seen["state"])
    return None
