"""`dialog_scope = "screen"`: a dialog marker anywhere on the visible screen refuses, not only one in the live region.

The hostile case (stranger-guard P3b): an engine of the fleet's own (`[engines.X] commands = [...]`, vouched for)
with `live_above = 0` draws its dialog at the TOP of its screen, a few ms after a paste.  Only the box and the
lines below it were read, so the Enter went -- and answered the dialog -- in 13 of 13 trials.  Each look must see
it: before the paste, the second look before Enter, the look after a skipped Enter; and once Enter went, a dialog
that then shows is named in the outcome.
"""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from drover.remote.profiles import BUILTIN_PROFILES
from drover.remote.screen import classify
from tests.conftest import SCREENS, Pane, Tmux, wait_for
from tests.test_enter_window import ACME, WINDOW_MS, between_look_and_enter, send
from tests.test_guard import fake_engine

QUESTION = "Do you want to proceed?"
TOP = "\n".join(["", "", QUESTION, "> 1. Yes", "  2. No"])


def test_screen_scope_reads_a_dialog_anywhere_live_scope_only_the_live_region() -> None:
    idle = (SCREENS / "claude-idle.txt").read_text(encoding="utf-8")
    screen = TOP + "\n" + idle.split("\n", 5)[5]
    prof = dict(BUILTIN_PROFILES["demo"], dialog_scope="screen")
    assert classify(idle, prof)["state"] == "idle"
    assert classify(screen, prof)["state"] == "dialog"
    assert classify(screen, dict(prof, dialog_scope="live"))["state"] == "idle"
    # The box's own text may quote the dialog: never a dialog by itself.
    boxed = idle.replace("\n❯ \n", f"\n❯ {QUESTION}\n")
    assert classify(boxed, prof, pasted=QUESTION)["state"] == "idle"


def test_the_builtin_engines_read_the_live_region() -> None:
    """Their dialogs come up in place of the box or right above it (measured); a history line quoting one, or a past
    prompt `› 1. fix ...`, must not refuse every send while it is in view (tests/test_guard.py, real captures)."""
    assert {n: BUILTIN_PROFILES[n]["dialog_scope"] for n in ("claude", "codex", "gemini", "demo")} == dict.fromkeys(
        ("claude", "codex", "gemini", "demo"), "live"
    )


def start(tmux: Tmux, tmp: Path, monkeypatch: pytest.MonkeyPatch, name: str, *flags: str) -> tuple[Pane, Path]:
    """The fake TUI as `acme` (tests/test_enter_window.ACME: live_above 0, dialog_scope "screen"), vouched for."""
    (tmp / "fleet.toml").write_text(ACME, encoding="utf-8")
    monkeypatch.setenv("DROVER_FLEET", str(tmp / "fleet.toml"))
    exe = fake_engine(tmp, "acme")
    log, events = tmp / f"{name}.bytes", tmp / f"{name}.events"
    cmd = f"{exe} --screen {SCREENS / 'claude-idle.txt'} --log {log} --events {events} {' '.join(flags)}"
    pane = tmux.start(name, cmd, width=170, height=55)
    wait_for(lambda: log.exists() and "auto mode on" in pane.screen(), what="the fake TUI")
    return pane, events


def events(path: Path, kind: str) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [e for e in map(json.loads, path.read_text(encoding="utf-8").splitlines()) if e["ev"] == kind]


def pid(pane: Pane) -> int:
    return int(pane.tmux("display-message", "-p", "-t", pane.id, "#{pane_pid}"))


def clear(pane: Pane) -> None:
    """What a person does after a trial: closes the dialog if it is up, empties the box."""
    if QUESTION in pane.screen():
        pane.tmux("send-keys", "-t", pane.id, "Escape")
        wait_for(lambda: QUESTION not in pane.screen(), what="the dialog closed")
    pane.tmux("send-keys", "-t", pane.id, "C-u")
    wait_for(lambda: "cross-session-message" not in pane.screen(), what="an empty box")


def test_a_dialog_drawn_at_the_top_after_the_paste_never_gets_the_enter(
    tmux: Tmux, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    delays = list(range(0, 101, 10))
    trials = 2
    outcomes: Counter[tuple[int, str, str]] = Counter()
    answered: dict[int, list[float]] = {}
    for ms in delays:
        pane, log = start(tmux, isolated, monkeypatch, f"top{ms}", "--dialog-top-ms", str(ms))
        for i in range(trials):
            doc = send(pane.address, f"top dialog {ms} ms trial {i}").data
            # It draws the dialog after every paste, whatever became of the message.
            wait_for(lambda: len(events(log, "dialog_drawn")) == i + 1, what=f"the dialog {ms}/{i}")  # noqa: B023
            outcomes[(ms, doc["outcome"], doc.get("code", ""))] += 1
            if doc["outcome"] == "refused":
                assert doc["code"] == "dialog_after_paste" and QUESTION in doc["detail"], doc
                assert doc["left_in_input"] is True and "sits unsent" in doc["detail"], doc
            elif doc["outcome"] == "failed":
                assert (doc["code"], doc["indeterminate"]) == ("not_submitted", True), doc
            else:
                assert doc["outcome"] == "delivered", doc
            clear(pane)
        answered[ms] = [e["shown_ms"] for e in events(log, "answered_by_enter")]
    print("\ntop-dialog trials:", sorted(outcomes.items()), "Enters into it (ms it was up):", answered)
    late = {ms: ages for ms, ages in answered.items() if any(a > WINDOW_MS for a in ages)}
    assert late == {}, "an Enter answered a dialog that was on screen"
    # The sweep reached the dialog: the early delays were refused for it.
    assert sum(n for (ms, out, code), n in outcomes.items() if code == "dialog_after_paste") >= trials


def test_a_dialog_at_the_top_refuses_the_paste(tmux: Tmux, isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pane, _log = start(tmux, isolated, monkeypatch, "before")
    os.kill(pid(pane), signal.SIGUSR1)
    wait_for(lambda: QUESTION in pane.screen(), what="the dialog")
    doc = send(pane.address, "into a dialog?").data
    assert (doc["outcome"], doc["code"], doc.get("state")) == ("refused", "dialog", "dialog"), doc
    assert QUESTION in doc["detail"], doc
    assert "cross-session-message" not in pane.screen()


def test_a_dialog_at_the_top_after_the_last_look_holds_the_enter_and_is_named(
    tmux: Tmux, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Enter is skipped (the redraw moved the witness); the look after it must see the dialog at the top."""
    pane, log = start(tmux, isolated, monkeypatch, "skipped")

    def dialog() -> None:
        os.kill(pid(pane), signal.SIGUSR1)
        wait_for(lambda: QUESTION in pane.screen(), what="the dialog on screen")

    between_look_and_enter(monkeypatch, dialog)
    doc = send(pane.address, "please rebase").data
    assert (doc["outcome"], doc["code"]) == ("refused", "dialog_after_paste"), doc
    assert "was not pressed" in doc["detail"] and QUESTION in doc["detail"], doc
    assert events(log, "answered_by_enter") == []


def test_a_dialog_that_shows_after_the_enter_is_named(tmux: Tmux, isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Enter went, and the pane then shows a dialog with the text still in the box: the outcome says a dialog came
    up (the Enter may have answered it), not only that the text was not submitted."""
    pane, _log = start(tmux, isolated, monkeypatch, "after", "--dialog-on-enter")
    doc = send(pane.address, "then a question").data
    assert (doc["outcome"], doc["code"], doc.get("state")) == ("failed", "not_submitted", "dialog"), doc
    assert "a dialog showed" in doc["detail"] and QUESTION in doc["detail"], doc
