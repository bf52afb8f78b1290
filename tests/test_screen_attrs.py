"""Placeholders by how they are drawn: real Claude Code screens captured with attributes (`capture-pane -e -p`)."""

from __future__ import annotations

from pathlib import Path

from drover.remote.profiles import BUILTIN_PROFILES
from drover.remote.screen import classify, drawn_normal, plain

SCREENS = Path(__file__).parent / "screens"


def test_a_persons_try_draft_drawn_in_normal_intensity_is_a_draft() -> None:
    styled = (SCREENS / "claude-real-draft-try.ansi").read_text(encoding="utf-8")
    seen = classify(styled, BUILTIN_PROFILES["claude"])
    assert (seen["state"], seen["draft"], seen["input"]) == ("idle", True, 'Try "deleting the prod database"')
    # Without attributes only the words remain, and they read like the placeholder (the fallback's weakness).
    assert classify(plain(styled), BUILTIN_PROFILES["claude"])["draft"] is False


def test_the_same_words_drawn_faint_are_the_placeholder() -> None:
    styled = (SCREENS / "claude-real-draft-try.ansi").read_text(encoding="utf-8")
    faint = styled.replace('❯\u00a0Try "deleting the prod database"', '❯\u00a0\x1b[2mTry "deleting the prod database"\x1b[22m')
    assert faint != styled
    seen = classify(faint, BUILTIN_PROFILES["claude"])
    assert (seen["state"], seen["draft"]) == ("idle", False)


def test_an_empty_real_box_is_idle_and_empty() -> None:
    seen = classify((SCREENS / "claude-real-idle.ansi").read_text(encoding="utf-8"), BUILTIN_PROFILES["claude"])
    assert (seen["state"], seen["draft"], seen["input"]) == ("idle", False, "")


def test_drawn_normal_skips_faint_and_colour_numbers() -> None:
    assert drawn_normal("\x1b[39m❯ \x1b[2mhint\x1b[22m typed") == "❯  typed"
    # 38;5;2 is colour 2, not the faint attribute; 0 resets faint.
    assert drawn_normal("\x1b[38;5;2mgreen\x1b[2m dim\x1b[0m back") == "green back"
    assert drawn_normal("\x1b[38;2;2;2;2mrgb") == "rgb"


def test_codexs_placeholder_is_drawn_dim_and_a_person_typing_its_words_is_not() -> None:
    """Real Codex 0.169: `Ask Codex to do anything` in SGR 2 is the empty composer; the same words typed by a person
    come out in normal intensity."""
    profile = BUILTIN_PROFILES["codex"]
    idle = classify((SCREENS / "codex-real-idle.ansi").read_text(encoding="utf-8"), profile)
    assert (idle["state"], idle["draft"], idle["input"]) == ("idle", False, "Ask Codex to do anything")
    typed = (SCREENS / "codex-real-draft-placeholder-words.ansi").read_text(encoding="utf-8")
    assert classify(typed, profile)["draft"] is True
    # Its footer says so too (`? for shortcuts` goes with any draft); without it only the drawing tells.
    bare = dict(profile, empty_footer="")
    assert classify(typed, bare)["draft"] is True
    assert classify(plain(typed), bare)["draft"] is False


def test_busy_codex_with_queued_messages_between_its_working_line_and_the_composer_is_busy() -> None:
    """Real Codex 0.169, a turn running and two messages queued with Tab: the working line sits five lines above
    the composer, over the queue's own lines -- busy, so the submit key is Codex's Tab, not Enter.  (Queued texts
    that wrap over several lines: tests/test_codex_lane.py, live.)"""
    profile = BUILTIN_PROFILES["codex"]
    for name in ("codex-real-busy-queued.txt", "codex-real-busy-queued.ansi"):
        seen = classify((SCREENS / name).read_text(encoding="utf-8"), profile)
        assert (seen["state"], seen["draft"]) == ("busy", False), (name, seen)
    assert profile["submit_when_busy"] == "Tab"
    # Those lines only extend the live region: history above an idle composer still says nothing about now.
    idle = (SCREENS / "codex-real-busy-queued.txt").read_text(encoding="utf-8").replace("• Working", "• Worked")
    assert classify(idle.replace("esc to interrupt", "done"), profile)["state"] == "idle"


def test_claudes_placeholder_with_the_cursor_on_its_first_letter_is_the_placeholder() -> None:
    """How Claude Code 2.1.328 draws its suggestion (renderedPlaceholder: the first letter inverted under the cursor,
    the rest chalk.dim), laid into the real capture's input line -- the offline lab shows no suggestion."""
    styled = (SCREENS / "claude-real-draft-try.ansi").read_text(encoding="utf-8")
    drawn = '❯\u00a0\x1b[7mT\x1b[27m\x1b[2mry "deleting the prod database"\x1b[22m'
    seen = classify(styled.replace('❯\u00a0Try "deleting the prod database"', drawn), BUILTIN_PROFILES["claude"])
    assert (seen["state"], seen["draft"]) == ("idle", False)


def test_gemini_draws_its_placeholder_grey_so_it_is_read_by_its_words() -> None:
    """Real gemini-cli 0.61: the placeholder in a theme's grey, not faint; the profile does not ask for faint, so an
    idle box stays idle (and a person typing the placeholder's exact words is the fallback's known blind spot)."""
    profile = BUILTIN_PROFILES["gemini"]
    for name in ("gemini-real-idle.ansi", "gemini-real-idle-256color.ansi"):
        seen = classify((SCREENS / name).read_text(encoding="utf-8"), profile)
        assert (seen["state"], seen["draft"]) == ("idle", False), (name, seen)
    typed = classify((SCREENS / "gemini-real-draft-placeholder-words.ansi").read_text(encoding="utf-8"), profile)
    assert typed["input"] == "Type your message or @path/to/file"
