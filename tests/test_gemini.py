"""gemini-cli 0.61, the real program, offline in tmux with a fake Gemini API: its screens are reproducible, and the
guarded paste reads them right with drover's built-in `gemini` profile (tests/support/geminilab.py; the captures in
tests/screens/gemini-*.txt come from `python -m tests.support.geminilab capture tests/screens`).
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import drover
from tests.conftest import SCREENS, Tmux, stays, wait_for
from tests.support.geminilab import PLACEHOLDER, GeminiLab, GeminiSession, ensure_binary, is_busy
from tests.support.npmcache import START_S

ACTOR = "tester"
# capture: (state, a draft in the input box, would the guarded paste go ahead)
CAPTURES = {
    "gemini-approval-dialog.txt": ("dialog", None, False),
    "gemini-auth-dialog.txt": ("dialog", False, False),
    "gemini-busy-with-draft.txt": ("busy", True, False),
    "gemini-busy.txt": ("busy", False, True),  # gemini queues what is submitted while a turn runs
    "gemini-idle-256color.txt": ("idle", False, True),
    "gemini-idle-with-draft.txt": ("idle", True, False),
    "gemini-idle.txt": ("idle", False, True),
    "gemini-queued.txt": ("busy", False, True),
    "gemini-trust-dialog.txt": ("dialog", False, False),
}


@pytest.fixture(scope="session")
def gemini_binary() -> Path:
    path, why = ensure_binary()
    if path is None:
        pytest.skip(f"the real gemini-cli cannot run here: {why}")
    return path


@pytest.fixture
def labs(gemini_binary: Path, tmux: Tmux) -> Iterator[Any]:
    """make(**options) -> a GeminiLab; every lab is stopped (gemini outlives its pane) and removed afterwards."""
    made: list[GeminiLab] = []

    def make(**options: Any) -> GeminiLab:
        lab = GeminiLab(Path(tempfile.mkdtemp(prefix="drg-")), gemini_binary, **options)
        made.append(lab)
        return lab

    yield make
    for lab in made:
        lab.stop()
        shutil.rmtree(lab.root, ignore_errors=True)


def check(screen: str) -> dict[str, Any]:
    """guard.check with the built-in gemini profile: state, draft, paste, reason."""
    return dict(drover.run("guard.check", {"engine": "gemini", "screen": screen}).data)


def state(screen: str) -> tuple[str, bool, bool]:
    seen = check(screen)
    return seen["state"], seen["draft"], seen["paste"]


def send(session: GeminiSession, text: str) -> Any:
    return drover.run("sessions.message", {"id": f"{session.lab.server}/{session.pane}", "text": text}, actor=ACTOR)


def user_texts(session: GeminiSession) -> list[str]:
    """The user's words in every main-turn request the fake API got (the last user content of each)."""
    out = []
    for call in session.api_calls():
        body = call.get("body") or {}
        users = [c for c in body.get("contents") or [] if c.get("role") == "user"]
        if body.get("tools") and users:
            out.append("".join(str(p.get("text", "")) for p in users[-1].get("parts") or []))
    return out


def has_line(screen: str, pattern: str) -> bool:
    return any(re.search(pattern, line.rstrip()) for line in screen.splitlines())


# -- the captures --------------------------------------------------------------------------------------------------


def test_every_gemini_capture_is_known() -> None:
    assert sorted(p.name for p in SCREENS.glob("gemini-*.txt")) == sorted(CAPTURES)


@pytest.mark.parametrize("name", sorted(CAPTURES))
def test_captures_classify_with_the_builtin_profile(name: str) -> None:
    seen = check((SCREENS / name).read_text(encoding="utf-8"))
    want_state, want_draft, want_paste = CAPTURES[name]
    assert seen["state"] == want_state, seen["reason"]
    if want_draft is not None:  # (a dialog hides the input box: what drover takes for it there does not matter)
        assert seen["draft"] is want_draft, seen
    assert seen["paste"] is want_paste, seen


# -- the real program ----------------------------------------------------------------------------------------------


def test_idle_screen_is_reproducible(labs: Any) -> None:
    s = labs().start("idle-g")
    screen = s.screen()
    assert has_line(screen, r"^ >   Type your message or @path/to/file$"), screen
    assert has_line(screen, r"^ +\? for shortcuts$") and has_line(screen, r"^ Shift\+Tab to accept edits$")
    assert "workspace (/directory)" in screen
    assert state(screen) == ("idle", False, True)
    assert s.title().startswith("◇  Ready")
    draft = "half-written: please also check the migration"
    s.type(draft)
    screen = s.settled()
    assert has_line(screen, rf"^ > {draft}$") and PLACEHOLDER not in screen and "? for shortcuts" not in screen
    assert state(screen) == ("idle", True, False)
    doc = send(s, "must not join the draft")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "draft_in_input"), doc.data
    stays(lambda: draft in s.screen() and s.main_turns() == 0, 1.0, what="the draft, unsent")


# gemini-cli 0.61 in a terminal without the kitty keyboard protocol (tmux) takes an Enter that comes within ~40 ms
# of a paste, plus its render time (measured: 0.12 s always, 0.15 s sometimes, 0.2 s never), as a newline: the
# gemini profile waits submit_delay_s (0.5 s) before Enter, and drover checks that the box emptied after it.


def test_a_message_to_an_idle_gemini_is_submitted(labs: Any) -> None:
    s = labs().start("deliver-g", reply="Rebasing now.")
    doc = send(s, "coordinator here: rebase on master")
    assert (doc.data["outcome"], doc.data["lane"]) == ("delivered", "tmux"), doc.data
    assert doc.data["session"]["engine"] == "gemini"
    said = wait_for(lambda: user_texts(s), timeout=20, what="the message at the API")
    # (gemini puts its own session context before the first message of a session)
    assert f'<cross-session-message from-session="{doc.data["id"]}" from-name="drover (tester)" ' in said[-1]
    assert "coordinator here: rebase on master" in said[-1]
    s.wait_screen(lambda t: "✦ Rebasing now." in t, what="the answer")


def test_a_message_to_a_busy_gemini_is_queued(labs: Any) -> None:
    # The first turn is held at the fake API until gemini has shown the message queued: a turn of fixed length
    # could end before drover's paste does on a loaded machine, and the message would then be taken as a new turn.
    s = labs().start("queue-g", hold=True, reply="Done.")
    s.submit("start a slow turn")
    s.wait_screen(lambda t: is_busy(t) and PLACEHOLDER in t, what="the busy screen")
    wait_for(lambda: s.main_turns() == 1, timeout=60, what="the slow turn at the API")
    doc = send(s, "arrives while busy")
    assert (doc.data["outcome"], doc.data["lane"]) == ("queuedBehindTurn", "tmux"), doc.data["detail"] + s.screen()
    s.wait_screen(lambda t: "Queued (press ↑ to edit):" in t, what="gemini's queue")
    assert s.main_turns() == 1  # still the first turn: the message waits in gemini's queue, not in a turn of its own
    s.set_control(reply="Done.")  # lets the held turn end; the queued turn answers at once
    wait_for(lambda: s.main_turns() >= 2, timeout=60, what="the queued message's turn")
    assert "arrives while busy" in user_texts(s)[1]


def test_approval_dialog_is_reproducible_and_refused(labs: Any) -> None:
    s = labs().start("approve-g", shell="touch ran-it", reply="Done.")
    s.submit("clean the build")
    s.wait_screen(lambda t: "Allow execution of [Shell]?" in t, what="the approval dialog")
    screen = s.settled()
    assert has_line(screen, r"^│ \? Shell +touch ran-it +│$"), screen
    assert has_line(screen, r"^│ ● 1\. Allow once +│$")
    assert has_line(screen, r"^│   2\. Allow for this session +│$")
    assert has_line(screen, r"^│   3\. No, suggest changes \(esc\) +│$")
    assert PLACEHOLDER not in screen  # the input box is gone while gemini asks
    assert (check(screen)["state"], check(screen)["paste"]) == ("dialog", False)
    assert s.title().startswith("✋  Action Required")

    turns = s.main_turns()
    doc = send(s, "1")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "dialog"), doc.data
    assert doc.exit_code == 4
    stays(
        lambda: "Allow execution of" in s.screen() and s.main_turns() == turns and not (s.cwd / "ran-it").exists(),
        1.5,
        what="the dialog waiting, unanswered",
    )
    s.keys("Escape")  # 3. No, suggest changes
    s.wait_idle()
    assert not (s.cwd / "ran-it").exists()


def test_busy_screens_are_reproducible_gemini_queues_and_a_draft_is_never_sent(labs: Any) -> None:
    # Held, not timed: the turn must outlast the queue, the draft and drover's look, however slow the machine.
    s = labs().start("busy-g", hold=True, reply="Done.")
    s.submit("start a slow turn")
    busy = s.wait_screen(lambda t: is_busy(t) and PLACEHOLDER in t, what="the busy screen")
    assert has_line(busy, r"^ \S Thinking\.\.\. \(esc to cancel, \d+s\) +\? for shortcuts$"), busy
    assert state(busy) == ("busy", False, True)
    assert s.title().startswith("✦  Working…")

    wait_for(lambda: s.main_turns() == 1, timeout=60, what="the slow turn at the API")
    s.submit("after that, run the tests")  # typed by hand: gemini queues it
    queued = s.wait_screen(lambda t: "Queued (press ↑ to edit):" in t, what="gemini's queue")
    assert has_line(queued, r"^    after that, run the tests$")
    assert state(queued) == ("busy", False, True)

    draft = "my own half-written note"
    s.type(draft)
    screen = s.screen()
    assert is_busy(screen) and has_line(screen, rf"^ > {draft}$") and "? for shortcuts" not in screen, screen
    assert state(screen) == ("busy", True, False), screen
    doc = send(s, "must not join the draft")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "draft_in_input"), doc.data
    assert s.main_turns() == 1  # the refusal came while the first turn still ran

    s.set_control(reply="Done.")  # lets the held turn end; the queued turn answers at once
    wait_for(lambda: s.main_turns() >= 2, timeout=60, what="the queued message's turn")
    idle = s.wait_screen(lambda t: not is_busy(t) and draft in t, 60, "the turns to end, the draft still in the box")
    assert state(idle) == ("idle", True, False)
    doc = send(s, "must not join the draft either")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "draft_in_input"), doc.data
    stays(lambda: draft in s.screen() and s.main_turns() == 2, 1.0, what="the draft, unsent")
    said = user_texts(s)
    assert "after that, run the tests" in said[1]
    assert not any(draft in text or "must not join" in text for text in said)


def test_startup_dialogs_are_reproducible_and_refused(labs: Any) -> None:
    u = labs().start("trust-g", trust=False, wait=False)
    u.wait_screen(lambda t: "Do you trust the files in this folder?" in t, START_S, "the trust dialog")
    screen = u.settled()
    assert has_line(screen, r"^ │ ● 1\. Trust folder \(untrusted0\) +│$"), screen
    assert has_line(screen, r"^ │   3\. Don't trust +│$")
    assert (check(screen)["state"], check(screen)["paste"]) == ("dialog", False)
    doc = send(u, "hello")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "dialog"), doc.data

    a = labs(auth=False).start("auth-g", wait=False)
    a.wait_screen(lambda t: "How would you like to authenticate for this project?" in t, START_S, "the auth dialog")
    screen = a.settled()
    assert has_line(screen, r"^│   ● 1\. Sign in with Google +│$"), screen
    assert has_line(screen, r"^│     2\. Use Gemini API Key +│$")
    assert (check(screen)["state"], check(screen)["paste"]) == ("dialog", False)
    doc = send(a, "hello")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "dialog"), doc.data
    stays(lambda: "How would you like to authenticate" in a.screen(), 1.0, what="the auth dialog, unanswered")
