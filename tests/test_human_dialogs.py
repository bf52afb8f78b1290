"""Waiting on a human is left alone (issue 18): no lane delivers into a dialog unless the engine itself holds the
message without touching it.

Against the real Claude Code 2.1.328, offline (tests/support/claudelab.py).  Its person's settings name a default
permission mode (accept edits), so every session of the lab starts with Claude's "Make auto mode your default?"
dialog: a message through its inbox then dismissed it, unanswered (measured 4 of 4, docs/lanes.md), so the inbox
lane refuses while Claude's record says it waits on anything but a permission prompt, or its pane shows a dialog.
At a permission prompt Claude holds messages itself, and they still go.  The hostile cases: texts built to look
like a dialog's answer; a spawn whose dialog is drawn just after drover's look (a stand-in for Claude's start-up,
tests/support/fake_claude_startup.py, since the real gap of 14-48 ms cannot be hit on purpose); a dialog on screen
while the record still says idle; a person's answer at a permission prompt staying theirs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import drover
from tests.conftest import SCREENS, stays, wait_for
from tests.support.claudelab import ClaudeLab, ClaudeSession, expose, own_server_lab
from tests.support.npmcache import START_S

ACTOR = "tester"
NUDGE = "Make auto mode your default permission mode?"
PROMPT = "Do you want to proceed?"
# Texts that would answer a dialog if they reached it as keys: its first choice, yes, Enter, Down then Enter.
ANSWERS = ("1", "y", "1\r", "\x1b[B\r")
FAKE = Path(__file__).resolve().parent / "support" / "fake_claude_startup.py"


@pytest.fixture(scope="module")
def lab(claude_binary: Path) -> Iterator[ClaudeLab]:
    for lab in own_server_lab(claude_binary, "dhd-"):
        lab.settings(permissions={"defaultMode": "acceptEdits"})
        yield lab


@pytest.fixture(autouse=True)
def seen(lab: ClaudeLab, isolated: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(lab.config))
    yield from expose(lab)


def send(target: str, text: str, **extra: Any) -> Any:
    return drover.run("sessions.message", {"id": target, "text": text, **extra}, actor=ACTOR)


def user_settings(lab: ClaudeLab) -> Any:
    return json.loads((lab.config / "settings.json").read_text()).get("permissions")


def at_the_nudge(lab: ClaudeLab, name: str) -> ClaudeSession:
    s = lab.start(name, wait=False)
    wait_for(lambda: NUDGE in s.screen(), START_S, what="Claude's start-up dialog")
    rec = wait_for(lambda: next((r for r in records(lab) if r.get("cwd") == str(s.cwd)), None), 30, what="its record")
    s.pid, s.session_id = int(rec["pid"]), str(rec["sessionId"])
    wait_for(lambda: s.status() == "waiting", 30, what="Claude's record saying it waits")
    return s


def records(lab: ClaudeLab) -> list[dict[str, Any]]:
    out = []
    for path in (lab.config / "sessions").glob("*.json"):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return out


# First: a person's Esc on the dialog (the next test) declines it for good, and later sessions would not show it.
@pytest.mark.slow
def test_a_spawned_claude_at_its_start_up_dialog_is_not_briefed(lab: ClaudeLab, isolated: Path, monkeypatch: Any) -> None:
    fleet = isolated / "fleet.toml"
    fleet.write_text(f'[spawn.claude]\ncommand = "sh {lab.launcher()} {{name}}"\nready_timeout_s = 60\n')
    monkeypatch.setenv("DROVER_FLEET", str(fleet))
    cwd = lab.root / "w7"  # trusted in the lab's ~/.claude.json
    cwd.mkdir()
    request = {"engine": "claude", "cwd": str(cwd), "name": "spawned", "brief": "1"}
    res = drover.run("sessions.spawn", request, actor=ACTOR)
    assert (res.data["state"], res.data["brief"]) == ("waiting", None), res.data
    pane = res.data["pane"]

    def screen() -> str:  # spawned on this test's own tmux server
        return subprocess.run(["tmux", "capture-pane", "-p", "-t", pane], capture_output=True, text=True).stdout

    stays(lambda: NUDGE in screen(), 1.0, "the dialog staying up")
    assert user_settings(lab) == {"defaultMode": "acceptEdits"}
    subprocess.run(["tmux", "kill-session", "-t", "=spawned"], capture_output=True, timeout=10)


@pytest.mark.slow
def test_the_start_up_dialog_is_left_to_its_person(lab: ClaudeLab) -> None:
    s = at_the_nudge(lab, "nudged")
    assert (s.record() or {}).get("waitingFor") == "dialog open"
    for text in ANSWERS:
        res = send(s.name, text)
        data = res.data
        assert (data["outcome"], data["code"], data["lane"], res.exit_code) == ("refused", "waiting_on_human", "inbox", 4), data
        assert "dialog open" in data["detail"] and "nothing was sent" in data["detail"], data["detail"]
    # Every lane drover offers says the same: a nudge refuses it, a broadcast skips it.
    nudged = drover.run("sessions.nudge", {"id": s.name, "text": "a nudge"}, actor=ACTOR)
    assert (nudged.data["outcome"], nudged.data["code"], nudged.exit_code) == ("refused", "waiting_on_human", 4), nudged.data
    cast = drover.run("sessions.broadcast", {"name": s.name, "text": "a broadcast"}, actor=ACTOR)
    assert [(m["outcome"], m["code"]) for m in cast.data["messages"]] == [("skipped", "waiting_on_human")], cast.data
    # The dialog is still up, unanswered, and nothing reached Claude.
    stays(lambda: NUDGE in s.screen() and s.status() == "waiting", 1.0, "the dialog staying up")
    assert s.peer_messages() == [] and user_settings(lab) == {"defaultMode": "acceptEdits"}
    # Its person closes it (Esc: "No, keep accept edits", theirs to choose): then the message goes, and Claude takes it.
    lab.tmux("send-keys", "-t", s.pane, "Escape")
    wait_for(lambda: NUDGE not in s.screen() and s.status() == "idle", 30, what="the dialog closed by its person")
    after = send(s.name, "now that the dialog is closed")
    assert (after.data["outcome"], after.data["verified"], after.exit_code) == ("delivered", True, 0), after.data
    assert [p["origin"]["body"] for p in s.peer_messages()] == ["now that the dialog is closed"]
    assert user_settings(lab) == {"defaultMode": "acceptEdits"}


@pytest.mark.slow
def test_at_a_permission_prompt_claude_holds_the_messages_and_the_answer_stays_its_persons(lab: ClaudeLab) -> None:
    # The project names its mode, so Claude offers no auto-mode default here: it starts idle.
    marker = lab.root / "prompted-ran"
    s = lab.start(
        "prompted",
        flags="--permission-mode default",
        project_settings={"permissions": {"defaultMode": "default"}},
        tool_use={"command": f"touch {marker}"},
    )
    first = send(s.name, "please touch the marker")
    assert first.data["outcome"] == "delivered", first.data
    wait_for(lambda: s.status() == "waiting" and PROMPT in s.screen(), 60, what="the permission prompt")
    assert (s.record() or {}).get("waitingFor") == "permission prompt"
    before = s.screen().splitlines()[-12:]
    for text in ANSWERS:
        res = send(s.name, text)
        assert (res.data["outcome"], res.data["lane"], res.exit_code) == ("queuedBehindTurn", "inbox", 0), res.data
    # Held by Claude: the prompt untouched, the command not run, the messages out of the transcript for now.
    stays(lambda: PROMPT in s.screen() and not marker.exists(), 1.0, "the permission prompt staying up")
    assert s.screen().splitlines()[-12:] == before
    assert [p["origin"]["body"] for p in s.peer_messages()] == ["please touch the marker"]
    # Its person declines: the command never runs, and then Claude takes the held messages.
    s.set_control()
    lab.tmux("send-keys", "-t", s.pane, "Escape")
    wait_for(lambda: len(s.peer_messages()) == 1 + len(ANSWERS), 60, what="the held messages, after the answer")
    assert not marker.exists()
    bodies = [p["origin"]["body"] for p in s.peer_messages()][1:]
    assert bodies == ["1", "y", "1\u240d", "\u241b[B\u240d"]  # neutralised: words, never keys


def fake_claude(root: Path, name: str, after_ms: float, *flags: str) -> str:
    """The spawn command of a stand-in Claude that draws its start-up dialog after_ms after its record says idle."""
    bindir = root / "bin"
    bindir.mkdir(exist_ok=True)
    prog = bindir / "claude"  # named as Claude runs; its registry record is the evidence that it is one
    if not prog.exists():
        prog.symlink_to(FAKE)
    sock = Path(tempfile.mkdtemp(prefix="dhs-")) / "1.sock"
    args = [
        f"--name {name}",
        f"--sock {sock}",
        f"--log {root / (name + '.log')}",
        f"--idle {SCREENS / 'claude-idle.txt'}",
        f"--dialog {SCREENS / 'claude-real-auto-mode-dialog.txt'}",
        f"--dialog-after-ms {after_ms:g}",
        *flags,
    ]
    return f"exec {sys.executable} {prog} " + " ".join(args)


def fake_log(root: Path, name: str) -> list[dict[str, Any]]:
    path = root / (name + ".log")
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
def test_the_spawn_race_a_dialog_drawn_just_after_the_record_says_idle(isolated: Path, monkeypatch: Any) -> None:
    config = isolated / "fake-claude"
    config.mkdir()
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(config))
    # 600 ms: wider than the real gap (14-48 ms) and than drover's look interval, so the look that sees the record
    # idle comes before the dialog, every time; the settle (1 s) outlasts it.
    command = f"CLAUDE_CONFIG_DIR={config} " + fake_claude(isolated, "raced", 600)
    fleet = isolated / "fleet.toml"
    fleet.write_text(f"[spawn.claude]\ncommand = {json.dumps(command)}\nready_timeout_s = 60\n")
    monkeypatch.setenv("DROVER_FLEET", str(fleet))
    cwd = isolated / "work"
    cwd.mkdir()
    res = drover.run("sessions.spawn", {"engine": "claude", "cwd": str(cwd), "name": "raced", "brief": "1"}, actor=ACTOR)
    assert (res.data["state"], res.data["brief"]) == ("waiting", None), res.data
    assert "dialog" in res.data["reason"], res.data
    events = fake_log(isolated, "raced")
    assert [e["ev"] for e in events] == ["idle", "dialog_drawn"], events  # no message, nothing dismissed
    stays(lambda: [e["ev"] for e in fake_log(isolated, "raced")] == ["idle", "dialog_drawn"], 1.0, "no brief after")


@pytest.mark.slow
def test_a_dialog_on_screen_refuses_the_inbox_though_the_record_says_idle(isolated: Path, tmux: Any, monkeypatch: Any) -> None:
    config = isolated / "fake-claude"
    config.mkdir()
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(config))
    command = f"CLAUDE_CONFIG_DIR={config} " + fake_claude(isolated, "unsaid", 0, "--record-stays-idle")
    pane = tmux.start("unsaid", command)
    wait_for(lambda: NUDGE in pane.screen(), 60, what="the stand-in's dialog")
    wait_for(lambda: list((config / "sessions").glob("*.json")), 60, what="the stand-in's record")
    for text in ANSWERS:
        res = send("unsaid", text)
        data = res.data
        assert (data["outcome"], data["code"], data["lane"], res.exit_code) == ("refused", "waiting_on_human", "inbox", 4), data
        assert data["human"]["kind"] == "dialog", data
    assert [e["ev"] for e in fake_log(isolated, "unsaid")] == ["idle", "dialog_drawn"]
    assert NUDGE in pane.screen()
