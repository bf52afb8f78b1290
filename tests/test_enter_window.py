"""The Enter lands only on the screen drover last looked at (tmux_lane._enter, tmux.press_if): trials over the
whole window after a paste, on real tmux with the demo agent.

- A program that answers every paste with a dialog, drawn 0-200 ms after the paste (10 ms steps, five trials
  each): no Enter ever reaches the dialog.  Refused while the dialog is up (the text said to sit unsent), or
  delivered before the dialog came.
- A person's key typed 0-150 ms after the paste: it is never submitted with the message unsaid.  Refused with the
  text said to sit unsent, or delivered -- `altered` when the receiver's record shows the key after the message.

Each delay gets its own pane, reused for its trials (the box cleared between them), and a few panes run at once.
Where a sweep reaches the moment between the last look and the Enter only by chance, the tests after it put a
dialog, a key or a redraw exactly there (around tmux.press_if), and race a dialog against the Enter itself.
"""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import drover
from drover.remote import tmux_lane
from drover.remote.protocol import HelperError
from drover.remote.tmux import press_if, witness
from tests.conftest import SCREENS, Pane, Tmux, stays, wait_for
from tests.test_guard import fake_engine

ACTOR = "tester"
WORKERS = 3
CLOSE = "</cross-session-message>"


# The window no sender can close: tmux checks the pane and queues the Enter in one step, but writes it to the pty
# in its next loop round (libevent), and a dialog the program writes out in between -- after tmux looked -- gets
# it.  Measured: such Enters were read 0.26 and 0.44 ms after the dialog's write returned, 2 in 290 trials of the
# race below; 2 in about 1900 trials of the sweep.  An Enter into a dialog written out for longer than this would
# be one tmux had seen before its check: that never happens.
WINDOW_MS = 5.0


def late(answered: dict[int, list[dict[str, Any]]]) -> dict[int, list[Any]]:
    """The Enters that answered a dialog already written out for longer than WINDOW_MS (or not timed)."""
    out = {}
    for ms, events in answered.items():
        ages = [e.get("shown_ms") for e in events if e.get("shown_ms") is None or e["shown_ms"] > WINDOW_MS]
        if ages:
            out[ms] = ages
    return out


def send(address: str, text: str) -> Any:
    return drover.run("sessions.message", {"id": address, "text": text}, actor=ACTOR)


def box_empty(pane: Pane) -> bool:
    lines = pane.screen().splitlines()
    return "❯" in lines and "Do you want to proceed?" not in "\n".join(lines)


def box_ends_with(pane: Pane, tail: str) -> bool:
    """Does the demo agent's input box end with `tail` (its last row: above the lower rule and the footer)?"""
    lines = pane.screen().rstrip().split("\n")
    return len(lines) >= 3 and lines[-3].rstrip().endswith(tail)


def reset(pane: Pane) -> None:
    """What a person does after each trial: closes the dialog if one is up, clears the input box."""
    if "Do you want to proceed?" in pane.screen():
        pane.tmux("send-keys", "-t", pane.id, "Escape")
        wait_for(lambda: "Do you want to proceed?" not in pane.screen(), what="the dialog closed")
    pane.tmux("send-keys", "-t", pane.id, "C-u")
    wait_for(lambda: box_empty(pane), what="an empty input box")


def by_delay(tmux: Tmux, delays: list[int], flags: Any) -> dict[int, Pane]:
    panes = {}
    for ms in delays:
        panes[ms] = tmux.agent(f"d{ms}", "default", *flags(ms), wait=False)
    for pane in panes.values():
        pane.wait_idle(30)
    return panes


def test_a_dialog_drawn_at_any_moment_after_the_paste_never_gets_the_enter(tmux: Tmux) -> None:
    delays = list(range(0, 201, 10))
    trials = 5
    panes = by_delay(tmux, delays, lambda ms: ("--dialog-after-paste", "--dialog-delay", str(ms / 1000)))
    results: list[tuple[int, int, dict[str, Any], list[str]]] = []
    lock = threading.Lock()

    def run(ms: int) -> None:
        pane = panes[ms]
        for i in range(trials):
            text = f"dialog trial {ms} ms number {i}"
            doc = send(pane.address, text)
            # The program draws its dialog after every paste, whatever became of the message: wait for it, then
            # close it and clear the box for the next trial.
            wait_for(lambda: len(pane.events("dialog_drawn")) == i + 1, what=f"the dialog of trial {ms}/{i}")  # noqa: B023
            got = [m for m in pane.messages() if text in m]
            reset(pane)
            with lock:
                results.append((ms, i, dict(doc.data), got))

    with ThreadPoolExecutor(WORKERS) as pool:
        for future in [pool.submit(run, ms) for ms in delays]:
            future.result()
    answered = {ms: [e for e in panes[ms].events("dialog") if e["answer"] == "yes"] for ms in delays}
    outcomes = Counter((ms, d["outcome"], d.get("code", "")) for ms, _i, d, _g in results)
    print("\ndialog trials:", sorted(outcomes.items()))
    assert len(results) == len(delays) * trials
    print("Enters into a dialog within the window tmux leaves open:", {ms: a for ms, a in answered.items() if a})
    assert late(answered) == {}, "an Enter answered a dialog that was on screen"
    for ms, i, data, got in results:
        said = (ms, i, data.get("code"), data.get("detail"))
        if data["outcome"] == "delivered":
            assert len(got) == 1, said
        elif data["outcome"] == "failed":
            # An Enter inside the open window answered the dialog: the text stayed in the box, said so, never
            # "delivered".
            assert (data["code"], data["indeterminate"], data["left_in_input"], got) == ("not_submitted", True, True, []), said
        else:
            assert (data["outcome"], data.get("left_in_input")) == ("refused", True), said
            assert "sits unsent" in data["detail"] and got == [], said


def test_a_key_a_person_types_around_the_enter_is_never_merged_unsaid(tmux: Tmux) -> None:
    delays = list(range(0, 151, 10))
    trials = 3
    panes = by_delay(tmux, delays, lambda ms: ())
    results: list[tuple[int, int, dict[str, Any], list[str]]] = []
    lock = threading.Lock()

    def run(ms: int) -> None:
        pane = panes[ms]
        for i in range(trials):
            text = f"key trial {ms} ms number {i}"
            docs: list[Any] = []
            sender = threading.Thread(target=lambda: docs.append(send(pane.address, text)))  # noqa: B023
            sender.start()
            # The person: sees the paste land in the box, and types a letter this many ms later.
            wait_for(lambda: "❯ <cross-session-message" in pane.screen(), interval=0.002, what="the paste")
            threading.Event().wait(ms / 1000)
            pane.tmux("send-keys", "-t", pane.id, "-l", "Z")
            sender.join(60)
            doc = docs[0].data
            got = [m for m in pane.messages() if text in m]
            if doc["outcome"] == "delivered":
                assert len(got) == 1, (ms, i, doc)
                merged = got[0].rpartition(CLOSE)[2] != ""
                # The key rode along only if the outcome says so; `altered` never without it in the record.
                assert bool(doc.get("altered")) == merged, (ms, i, doc, got)
            else:
                assert doc.get("left_in_input") is True and "sits unsent" in doc["detail"], (ms, i, doc)
                assert got == [] or doc.get("indeterminate"), (ms, i, doc, got)
            reset(pane)
            with lock:
                results.append((ms, i, doc, got))

    with ThreadPoolExecutor(WORKERS) as pool:
        for future in [pool.submit(run, ms) for ms in delays]:
            future.result()
    outcomes = Counter((ms, d["outcome"], d.get("code", ""), bool(d.get("altered"))) for ms, _i, d, _g in results)
    print("\nkey trials:", sorted(outcomes.items()))
    assert len(results) == len(delays) * trials
    plain = [(ms, d, g) for ms, _i, d, g in results if d["outcome"] == "delivered" and not d.get("altered")]
    assert all(g[0].endswith(CLOSE) for _ms, _d, g in plain), plain


# -- between the last look and the Enter, exactly --------------------------------------------------------------


def between_look_and_enter(monkeypatch: pytest.MonkeyPatch, act: Any) -> None:
    """Run `act` once, after drover's last look and right before its Enter (tmux.press_if): what the sweeps above
    reach only by chance, here every time."""
    real = tmux_lane.press_if
    done: list[bool] = []

    def press_if(socket: str, pane_id: str, key: str, seen: dict[str, str]) -> bool:
        if not done:
            done.append(True)
            act()
        return real(socket, pane_id, key, seen)

    monkeypatch.setattr(tmux_lane, "press_if", press_if)


def test_a_dialog_drawn_after_the_last_look_gets_no_enter(tmux: Tmux, monkeypatch: pytest.MonkeyPatch) -> None:
    pane = tmux.agent("late")

    def dialog() -> None:
        os.kill(pane.pid, signal.SIGUSR1)
        wait_for(lambda: "Do you want to proceed?" in pane.screen(), what="the dialog on screen")

    between_look_and_enter(monkeypatch, dialog)
    doc = send(pane.address, "the build is green")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "dialog_after_paste"), doc.data
    assert doc.data["detail"].startswith("the pane changed between drover's last look and Enter"), doc.data
    assert doc.data["left_in_input"] is True and "sits unsent" in doc.data["detail"]
    stays(lambda: pane.events("dialog") == [] and pane.messages() == [], 0.5, what="no Enter reaching the dialog")


def test_a_key_typed_after_the_last_look_holds_the_enter_back(tmux: Tmux, monkeypatch: pytest.MonkeyPatch) -> None:
    pane = tmux.agent("typist")

    def person() -> None:
        pane.tmux("send-keys", "-t", pane.id, "-l", "Z")
        wait_for(lambda: box_ends_with(pane, ">Z"), what="the key in the box")

    between_look_and_enter(monkeypatch, person)
    doc = send(pane.address, "please rebase")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "changed_before_enter"), dict(doc.data)
    assert doc.data["left_in_input"] is True and "sits unsent" in doc.data["detail"], doc.data
    assert "changed between drover's last look and Enter" in doc.data["detail"]
    stays(lambda: pane.messages() == [], what="nothing submitted")
    assert box_ends_with(pane, ">Z")  # the text and the person's key, both still in the box


def test_a_redraw_that_moves_nothing_in_the_box_does_not_refuse(tmux: Tmux, monkeypatch: pytest.MonkeyPatch) -> None:
    """A skipped Enter looks again: a program that redrew between the last look and Enter (here it toggles its busy
    footer twice, which scrolls a full screen into tmux's history) still gets the message once the look is clean."""
    pane = tmux.agent("redrawn")

    def redraw() -> None:
        before = pane.tmux("display-message", "-p", "-t", pane.id, "#{history_size}")
        os.kill(pane.pid, signal.SIGUSR2)
        wait_for(lambda: "esc to interrupt" in pane.screen(), what="busy")
        os.kill(pane.pid, signal.SIGUSR2)
        wait_for(lambda: "idle · paste" in pane.screen(), what="idle again")
        assert pane.tmux("display-message", "-p", "-t", pane.id, "#{history_size}") != before

    between_look_and_enter(monkeypatch, redraw)
    doc = send(pane.address, "after a redraw")
    assert doc.data["outcome"] == "delivered", doc.data
    wait_for(lambda: pane.messages() and pane.messages()[0].split("\n")[1] == "after a redraw", what="the message")


def test_multi_line_text_still_gets_its_enter(tmux: Tmux) -> None:
    """The box grows with a text over several lines (the cursor moves down with it): the witness is read after the
    paste landed, so the Enter goes."""
    pane = tmux.agent("tall")
    text = "\n".join(f"line {i} of a note that runs over several lines of the box, each long enough to wrap" for i in range(6))
    doc = send(pane.address, text)
    assert doc.data["outcome"] == "delivered", doc.data
    got = wait_for(pane.messages)
    assert text in got[0]


# -- an engine of the fleet's own: the fake TUI under a custom profile ------------------------------------------------

ACME = r"""[engines.acme]
commands = ["acme"]
input = '^❯(?:[ \u00a0](?!\d+\.\s)(.*))?$'
input_above = '^\s*─{3,}'
input_end = '^\s*─{3,}'
input_end_last = true
idle = ['^\s*❯\s*$']
dialog = ['Do you want to proceed\?']
dialog_scope = "screen"
default_state = "unknown"
envelope = true
"""


def acme(tmux: Tmux, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Pane, Path]:
    """The fake TUI (tests/fake_tui.py) as `acme`, an engine only the fleet's profile describes: it keeps the tmux
    lane, holds the default 60 ms, and leaves its cursor at the end of its screen (not in its box)."""
    (tmp / "fleet.toml").write_text(ACME, encoding="utf-8")
    monkeypatch.setenv("DROVER_FLEET", str(tmp / "fleet.toml"))
    exe = fake_engine(tmp, "acme")
    log = tmp / "acme.bytes"
    pane = tmux.start("acme", f"{exe} --screen {SCREENS / 'claude-idle.txt'} --log {log}", width=170, height=55)
    wait_for(lambda: log.exists() and "auto mode on" in pane.screen(), what="the fake TUI")
    return pane, log


def test_a_custom_engine_gets_a_multi_line_message_and_its_enter(
    tmux: Tmux, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pane, log = acme(tmux, isolated, monkeypatch)
    doc = send(pane.address, "first line\nsecond line\nthird line")
    assert (doc.data["outcome"], doc.data["session"]["engine"]) == ("delivered", "acme"), doc.data
    wait_for(lambda: log.read_bytes().endswith(b"\x1b[201~\r"), what="the paste, then Enter")


def test_a_key_typed_into_a_custom_engine_after_the_last_look_holds_the_enter_back(
    tmux: Tmux, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its cursor does not follow its text; the redraw a key causes still moves the witness (a full-screen clear
    scrolls the old screen into tmux's history)."""
    pane, log = acme(tmux, isolated, monkeypatch)

    def person() -> None:
        pane.tmux("send-keys", "-t", pane.id, "-l", "Z")
        wait_for(lambda: log.read_bytes().endswith(b"Z") and "message>Z" in pane.screen(), what="the key in the box")

    between_look_and_enter(monkeypatch, person)
    doc = send(pane.address, "please rebase")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "changed_before_enter"), doc.data
    stays(lambda: b"\r" not in log.read_bytes(), what="no Enter")


def test_a_key_name_from_a_profile_cannot_carry_tmux_commands(tmux: Tmux) -> None:
    """The key (a profile's submit_when_busy) goes into the if-shell command line: a key name, or nothing is run."""
    pane = tmux.agent("injected")
    socket = pane.tmux("display-message", "-p", "#{socket_path}").strip()
    seen = witness(socket, pane.id)
    for key in ("Enter ; set-option -g @pwned 1", "Tab' 'set-option -g @pwned 1"):
        with pytest.raises(HelperError):
            press_if(socket, pane.id, key, seen)
    assert pane.tmux("show-options", "-gqv", "@pwned").strip() == ""
    assert press_if(socket, pane.id, "Enter", seen)  # a key name is pressed


def test_a_dialog_racing_the_enter_itself_never_gets_it(tmux: Tmux, monkeypatch: pytest.MonkeyPatch) -> None:
    """The program is told to draw its dialog right as drover's Enter leaves (the signal sent just before the tmux
    call that presses it, not waited for): the dialog's output reaches tmux about when the request does.  tmux reads
    pending pane output before the deferred condition runs, so the Enter either went before the dialog was drawn
    (the program submits it) or is not pressed; it never answers the dialog."""
    pane = tmux.agent("racing")
    trials = 30
    outcomes: Counter[str] = Counter()
    for i in range(trials):
        between_look_and_enter(monkeypatch, lambda: os.kill(pane.pid, signal.SIGUSR1))
        doc = send(pane.address, f"race {i}")
        outcomes[doc.data["outcome"] + " " + doc.data.get("code", "")] += 1
        wait_for(lambda: len(pane.events("dialog_drawn")) == i + 1, what="the dialog")  # noqa: B023
        reset(pane)
    answered = [e for e in pane.events("dialog") if e["answer"] == "yes"]
    print("\nracing dialogs:", dict(outcomes), "Enters within the window tmux leaves open:", answered)
    assert late({0: answered}) == {}, dict(outcomes)
