"""The real Codex CLI (0.169.0), offline, in tmux: the screens drover's codex profile relies on, and where what a
session is sent ends up (the model request, the rollout, the app-server's thread list).

The captures in tests/screens/codex-real-*.txt come from `python -m tests.support.codexlab`; these tests check that a live
session draws the same thing, and that the reading proposed for drover (codexlab.read_screen) gets them right.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import stays
from tests.support.codexlab import CodexLab, CodexSession, app_server, module_lab, read_screen, wait_for
from tests.support.npmcache import START_S

SCREENS = Path(__file__).resolve().parent / "screens"


@pytest.fixture(scope="module")
def lab() -> Iterator[CodexLab]:
    with module_lab("dcx-") as lab:
        yield lab


@pytest.fixture(autouse=True)
def plain_model(lab: CodexLab) -> None:
    lab.set_control()


def normalise(screen: str, session: CodexSession) -> list[str]:
    """The screen's non-empty lines with what varies from run to run (paths, timers, spinner, warnings) made fixed."""
    out = []
    for line in screen.splitlines():
        line = re.sub(r"\S*/dcx-\w+/[\w-]+", "<cwd>", line.replace(str(session.cwd), "<cwd>"))
        line = re.sub(r"^[•◦] Working \(\d+[\dhms ]*•", "• Working (N •", line)
        if re.match(r"\s*(Worked for |└ Tip: )", line):
            continue  # history decoration, drawn a moment after the reply (or not at all)
        line = re.sub(r"⚠ \d+ warnings? · f2 to view", "", line)
        line = re.sub(r"\s+", " ", line).strip()
        if line:
            out.append(line)
    return out


def tail_from(lines: list[str], marker: str) -> list[str]:
    starts = [i for i, line in enumerate(lines) if re.search(marker, line)]
    assert starts, f"{marker!r} not in {lines}"
    return lines[starts[-1] :]


def same_as_capture(screen: str, session: CodexSession, name: str, marker: str) -> None:
    """The region from the last line matching marker down to the bottom is what the committed capture shows."""
    capture = (SCREENS / f"codex-real-{name}.txt").read_text(encoding="utf-8")
    live = tail_from(normalise(screen, session), marker)
    saved = tail_from(normalise(capture, session), marker)
    assert live == saved, f"live screen differs from {name}:\n{screen}"


def settles_as_capture(session: CodexSession, name: str, marker: str, timeout: float = 30.0) -> str:
    """The live screen once its region from marker down is what the capture shows (then returned, to be read).

    A screen that first matched a pattern may still be a frame from a moment before: under load the footer of a
    fresh draft was once caught in a state of its own ("tab to queue message", no warnings on the right) that
    Codex redrew a moment later. A screen that never comes to the capture's form still fails, with the last one."""
    capture = (SCREENS / f"codex-real-{name}.txt").read_text(encoding="utf-8")
    saved = tail_from(normalise(capture, session), marker)

    def settled() -> str | None:
        screen = session.screen()
        lines = normalise(screen, session)
        live = tail_from(lines, marker) if any(re.search(marker, line) for line in lines) else None
        return screen if live == saved else None

    try:
        return str(wait_for(settled, timeout, f"the screen to settle as {name}"))
    except AssertionError:
        same_as_capture(session.screen(), session, name, marker)  # fails with the diff, or passes had it just come
        return session.screen()


def rollout_turns(session: CodexSession) -> list[list[str]]:
    """The user messages of the rollout, grouped by the turn (task_started) they arrived in."""
    turns: list[list[str]] = []
    for row in session.rollout():
        payload = row.get("payload") or {}
        if payload.get("type") == "task_started":
            turns.append([])
        elif row.get("type") == "response_item" and payload.get("type") == "message" and payload.get("role") == "user":
            text = "\n".join(str(p.get("text", "")) for p in payload.get("content") or [])
            if turns and not text.startswith("<"):
                turns[-1].append(text)
    return turns


def wait_turns(session: CodexSession, expected: list[list[str]], timeout: float = 20.0) -> None:
    """The rollout's turns become exactly `expected` (a turn's task_started is written before its message)."""
    try:
        wait_for(lambda: rollout_turns(session) == expected, timeout, f"the rollout's turns to be {expected}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; they are {rollout_turns(session)}") from None


def thread_status(lab: CodexLab, thread_id: str) -> dict[str, Any]:
    """The thread as thread/list shows it, or {} while the listing does not have it yet: the rollout file can be
    on disk a moment before the app-server lists its thread (seen under load)."""
    sock = lab.codex_home / "app-server-control" / "app-server-control.sock"
    listing = app_server(sock, [("thread/list", {})])[0]["result"]["data"]
    return next((t for t in listing if t["id"] == thread_id), {})


def wait_status(lab: CodexLab, thread_id: str, status: dict[str, Any], timeout: float = 30.0) -> dict[str, Any]:
    """The thread once thread/list shows it with exactly this status."""
    try:
        return dict(wait_for(lambda: (t := thread_status(lab, thread_id)).get("status") == status and t, timeout, f"{status}"))
    except AssertionError as exc:
        raise AssertionError(f"{exc}; thread {thread_id} is listed as {thread_status(lab, thread_id) or 'absent'}") from None


def test_idle_screen_and_a_human_draft(lab: CodexLab) -> None:
    s = lab.start("idle-a")
    screen = s.wait_idle()
    assert read_screen(screen) == {"state": "idle", "draft": None, "reason": read_screen(screen)["reason"]}
    screen = settles_as_capture(s, "idle", r"^› ")
    assert read_screen(screen)["state"] == "idle" and read_screen(screen)["draft"] is None
    # a draft: the footer's "? for shortcuts" goes (the capture's footer has only the warnings on the right)
    s.paste("a human draft, not sent")
    s.wait_screen(r"^› a human draft, not sent")
    screen = settles_as_capture(s, "idle-with-draft", r"^› ")
    assert "? for shortcuts" not in screen
    assert read_screen(screen) == {"state": "idle", "draft": "a human draft, not sent", "reason": read_screen(screen)["reason"]}
    # a draft that reads like the placeholder is still a draft: only the footer tells (and the dim style)
    s.keys("C-u")
    s.wait_idle()
    s.paste("Ask Codex to do anything")
    wait_for(lambda: "? for shortcuts" not in s.screen(), 10, "the footer to drop its hint")
    assert read_screen(s.screen())["draft"] == "Ask Codex to do anything"
    s.keys("C-u")
    # a large paste shows as a placeholder of its own
    s.wait_idle()
    s.paste("x" * 2000)
    s.wait_screen(r"\[Pasted Content 2000 chars\]")
    screen = settles_as_capture(s, "idle-with-pasted-draft", r"^› ")
    assert read_screen(screen)["draft"] == "[Pasted Content 2000 chars]"
    s.keys("C-u")
    s.wait_idle()


def test_busy_screen_with_and_without_a_draft(lab: CodexLab) -> None:
    s = lab.start("busy-a")
    lab.set_control(hold=True)
    s.submit("start a slow turn")
    screen = s.wait_screen(r"esc to interrupt\)")
    assert read_screen(screen)["state"] == "busy" and read_screen(screen)["draft"] is None
    assert s.title().endswith("busy-a") and s.title() != "busy-a"  # a spinner before the folder name
    same_as_capture(screen, s, "busy", r"esc to interrupt\)")
    s.paste("a human draft while busy")
    screen = s.wait_screen(r"tab to queue message")
    assert read_screen(screen) == {"state": "busy", "draft": "a human draft while busy", "reason": read_screen(screen)["reason"]}
    same_as_capture(screen, s, "busy-with-draft", r"esc to interrupt\)")
    s.keys("C-u")
    lab.set_control()
    s.wait_idle()


def test_approval_dialog_replaces_the_composer(lab: CodexLab) -> None:
    s = lab.start("approve-a")
    marker = lab.root / "approve-a-ran"
    lab.set_control(shell={"command": "rm -rf build"})
    s.submit("please clean the build")
    screen = s.wait_screen(r"Press enter to confirm or esc to cancel")
    assert read_screen(screen)["state"] == "dialog"
    assert "Ask Codex to do anything" not in screen and "? for shortcuts" not in screen
    assert re.fullmatch(r"\[ [!.] \] Action Required \| approve-a", s.title()), s.title()  # it blinks
    same_as_capture(screen, s, "approval-dialog", r"^Would you like to run the following command\?")
    wait_status(lab, s.find_thread(), {"type": "active", "activeFlags": ["waitingOnApproval"]})
    s.keys("Escape")
    s.wait_screen(r"Conversation interrupted")
    assert not marker.exists()
    s.keys("C-u")  # an interrupted turn may hand its prompt back to the composer
    s.wait_idle()
    wait_status(lab, s.thread_id, {"type": "idle"})


def test_a_submitted_message_reaches_the_model_and_the_rollout(lab: CodexLab) -> None:
    s = lab.start("record-a")
    s.submit("hello codex from the drover tests")
    s.wait_screen(r"^› hello codex from the drover tests\s*\n\s*• Understood\.")
    s.find_thread()
    wait_for(lambda: "hello codex from the drover tests" in s.user_messages(), 15, "the message in the rollout")
    turn = next(r for r in lab.turns() if "hello codex from the drover tests" in lab.inputs_of(r))
    assert turn["body"]["client_metadata"]["thread_id"] == s.thread_id
    path = s.rollout_path()
    assert path is not None and path.name.endswith(f"-{s.thread_id}.jsonl")
    assert path.relative_to(lab.codex_home / "sessions").parts[0].isdigit()  # sessions/YYYY/MM/DD/
    s.wait_idle()
    thread = wait_status(lab, s.thread_id, {"type": "idle"})
    assert thread["cwd"] == str(s.cwd) and thread["path"] == str(path)


def test_a_numbered_prompt_in_history_is_not_a_menu(lab: CodexLab) -> None:
    s = lab.start("history-a")
    s.submit("1. fix the flaky test")
    s.wait_screen(r"^› 1\. fix the flaky test\s*\n\s*• Understood\.")
    screen = s.wait_idle()
    assert read_screen(screen)["state"] == "idle" and read_screen(screen)["draft"] is None
    same_as_capture(screen, s, "idle-history-numbered-prompt", r"^› 1\. fix the flaky test")


def test_enter_while_busy_steers_the_turn_and_tab_queues_one(lab: CodexLab) -> None:
    s = lab.start("steer-a")
    lab.set_control(hold=True)
    s.submit("first, a slow turn")
    s.wait_screen(r"esc to interrupt\)")
    wait_for(lambda: any(lab.inputs_of(r)[-1:] == ["first, a slow turn"] for r in lab.turns()), 15, "the first request")
    first = next(r["req"] for r in lab.turns() if lab.inputs_of(r)[-1:] == ["first, a slow turn"])
    s.submit("steered in with Enter")
    # Codex hangs up on the running request and asks again with both prompts
    wait_for(
        lambda: {"event": "closed", "req": first} in [{k: r.get(k) for k in ("event", "req")} for r in lab.requests_log()],
        15,
        "closed",
    )
    wait_for(
        lambda: any(lab.inputs_of(r)[-2:] == ["first, a slow turn", "steered in with Enter"] for r in lab.turns()), 15, "steer"
    )
    s.submit("queued with Tab", key="Tab")
    s.wait_screen(r"Queued follow-up inputs\s*\n\s*↳ queued with Tab")
    lab.set_control()
    s.wait_screen(r"^› queued with Tab\s*\n\s*• Understood\.")
    s.wait_idle()
    s.find_thread()
    wait_turns(s, [["first, a slow turn", "steered in with Enter"], ["queued with Tab"]])


def test_codex_queue_runs_its_message_after_the_turn_and_leaves_the_draft(lab: CodexLab) -> None:
    s = lab.start("queue-a")
    lab.set_control(hold=True)
    s.submit("a slow turn to queue behind")
    s.wait_screen(r"esc to interrupt\)")
    thread = s.find_thread()
    # held by the fake model, the turn stays active; the listing may lag the rollout a moment (seen under load)
    wait_for(lambda: thread_status(lab, thread).get("status", {}).get("type") == "active", 30, "the thread listed active")
    s.paste("my own unsent words")
    s.wait_screen(r"tab to queue message")
    res = lab.codex("queue", "--thread", thread, "--message", "sent by codex queue")
    assert res.returncode == 0, res.stderr
    assert re.fullmatch(rf"Queued message [0-9a-f-]+ for thread {thread}\.\s*", res.stdout), res.stdout
    lab.set_control()
    wait_turns(s, [["a slow turn to queue behind"], ["sent by codex queue"]], timeout=30)
    s.wait_screen(r"^› sent by codex queue\s*\n\s*• Understood\.")
    # untouched: the draft is still the composer's once the queued turn's reply is drawn (read from a screen that
    # shows both, waited for: the reply and the composer below it are not always drawn in one frame)
    shows_both = r"^› sent by codex queue\s*\n\s*• Understood\."
    try:
        wait_for(
            lambda: re.search(shows_both, sc := s.screen(), re.M) and read_screen(sc)["draft"] == "my own unsent words",
            15,
            "the draft below the queued turn's reply",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the screen:\n{s.screen()}") from None
    bad = lab.codex("queue", "--thread", "00000000-0000-0000-0000-000000000000", "--message", "x")
    assert bad.returncode == 1 and "no rollout found for thread id" in bad.stderr
    s.keys("C-u")
    s.wait_idle()


def test_trust_dialog_only_for_an_untrusted_git_folder(lab: CodexLab) -> None:
    t = lab.start("trust-a", trust=False, git=True, wait=False)
    screen = t.wait_screen(r"Trust this folder\?", timeout=START_S)
    assert read_screen(screen)["state"] == "dialog"
    same_as_capture(screen, t, "trust-dialog", r"^Folder access")
    plain = lab.start("trust-b", trust=False, git=False)
    assert read_screen(plain.screen())["state"] == "idle"


def test_a_fresh_session_is_found_through_the_app_server_before_it_has_a_rollout(lab: CodexLab) -> None:
    sock = lab.codex_home / "app-server-control" / "app-server-control.sock"
    before = set(app_server(sock, [("thread/loaded/list", {})])[0]["result"]["data"]) if sock.exists() else set()
    s = lab.start("fresh-a")

    def new_thread() -> str | None:
        loaded = set(app_server(sock, [("thread/loaded/list", {})])[0]["result"]["data"]) - before
        for tid in loaded:
            thread = app_server(sock, [("thread/read", {"threadId": tid})])[0]["result"]["thread"]
            if thread["cwd"] == str(s.cwd):
                return str(tid)
        return None

    tid = wait_for(new_thread, 15, "the new session's thread among the loaded ones")
    listed = [t["id"] for t in app_server(sock, [("thread/list", {})])[0]["result"]["data"]]
    assert tid not in listed  # thread/list (and the rollout files) know a thread only after its first message
    assert not list((lab.codex_home / "sessions").glob(f"*/*/*/rollout-*-{tid}.jsonl"))
    assert (lab.codex_home / "thread-writer-locks" / f"{tid}.lock").exists()
    # codex queue reaches a loaded thread before its first message, and an idle one runs the message at once
    early = lab.codex("queue", "--thread", tid, "--message", "queued before any prompt")
    assert early.returncode == 0, early.stderr
    s.thread_id = tid
    wait_turns(s, [["queued before any prompt"]])
    s.wait_screen(r"^› queued before any prompt\s*\n\s*• Understood\.")
    s.wait_idle()
    s.submit("then a typed prompt")
    wait_turns(s, [["queued before any prompt"], ["then a typed prompt"]])


def test_codex_queue_during_an_approval_dialog_waits_for_the_turn_to_end(lab: CodexLab) -> None:
    """The dialog is left alone; approved, the turn ends and the queued message runs as its own turn.  Declined
    with Esc, the turn is interrupted and the message stays queued until the next turn ends (measured on 0.169)."""
    s = lab.start("queue-dialog")
    lab.set_control(shell={"command": f"touch {lab.root / 'queue-dialog-ran'}"})
    s.submit("please touch it")
    s.wait_screen(r"Press enter to confirm or esc to cancel")
    lab.set_control()
    thread = s.find_thread()
    res = lab.codex("queue", "--thread", thread, "--message", "queued while the dialog asks")
    assert res.returncode == 0, res.stderr
    s.keys("Escape")
    s.wait_screen(r"Conversation interrupted")
    time.sleep(0.5)
    s.keys("C-u")  # an interrupted turn may hand its prompt back to the composer
    s.wait_idle()
    wait_status(lab, thread, {"type": "idle"})
    # idle, yet the queued message does not run
    stays(lambda: "queued while the dialog asks" not in s.user_messages(), 5.0, "the message left in the queue")
    s.submit("the next prompt")
    wait_for(lambda: "queued while the dialog asks" in s.user_messages(), 30, "the queued message after the next turn")
    messages = [m for m in s.user_messages() if not m.startswith("<")]
    assert messages == ["please touch it", "the next prompt", "queued while the dialog asks"]
    assert not (lab.root / "queue-dialog-ran").exists()
    s.wait_idle()
