"""The tmux guard: real captures of Claude Code and Codex, and live panes that draw dialogs, are never typed into."""

from __future__ import annotations

import os
import signal
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

import drover
from tests.conftest import ROOT, SCREENS, Tmux, stays, wait_for

CAPTURES = {
    "claude-apikey-dialog.txt": ("claude", "dialog"),
    "claude-busy.txt": ("claude", "busy"),
    "claude-held-message-dialog.txt": ("claude", "dialog"),
    "claude-real-auto-mode-dialog.txt": ("claude", "dialog"),  # 2.1.328 at start-up, its person's default mode set
    "claude-idle.txt": ("claude", "idle"),
    "claude-not-logged-in-idle.txt": ("claude", "idle"),
    "claude-trust-dialog.txt": ("claude", "dialog"),
    "codex-busy.txt": ("codex", "busy"),
    "codex-idle.txt": ("codex", "idle"),
    "codex-login.txt": ("codex", "dialog"),
    "codex-trust-dialog.txt": ("codex", "dialog"),
    # Real Codex 0.169 (tests/support/codexlab.py) and gemini-cli 0.61 (tests/support/geminilab.py), offline.
    "codex-real-approval-dialog.txt": ("codex", "dialog"),
    "codex-real-busy.txt": ("codex", "busy"),
    "codex-real-busy-queued.txt": ("codex", "busy"),  # two queued messages between the working line and the box
    "codex-real-idle.txt": ("codex", "idle"),
    "codex-real-idle-history-numbered-prompt.txt": ("codex", "idle"),  # `› 1. fix the flaky test` is history
    "codex-real-starting.txt": ("codex", "idle"),
    "codex-real-trust-dialog.txt": ("codex", "dialog"),
    "gemini-approval-dialog.txt": ("gemini", "dialog"),
    "gemini-auth-dialog.txt": ("gemini", "dialog"),
    "gemini-busy.txt": ("gemini", "busy"),
    "gemini-idle.txt": ("gemini", "idle"),
    "gemini-idle-256color.txt": ("gemini", "idle"),
    "gemini-queued.txt": ("gemini", "busy"),
    "gemini-trust-dialog.txt": ("gemini", "dialog"),
}
# A person's unsent text in the input box: never pasted over, idle or busy.
DRAFTS = {
    "codex-real-busy-with-draft.txt": ("codex", "busy"),
    "codex-real-idle-with-draft.txt": ("codex", "idle"),
    "codex-real-idle-with-pasted-draft.txt": ("codex", "idle"),
    "gemini-busy-with-draft.txt": ("gemini", "busy"),
    "gemini-idle-with-draft.txt": ("gemini", "idle"),
}
DIALOGS = [name for name, (_e, state) in CAPTURES.items() if state == "dialog"]


def test_every_capture_is_known() -> None:
    assert sorted(p.name for p in SCREENS.glob("*.txt")) == sorted([*CAPTURES, *DRAFTS])


@pytest.mark.parametrize("name", list(DRAFTS))
def test_guard_check_refuses_a_draft_in_the_input_box(cli: Any, name: str) -> None:
    engine, state = DRAFTS[name]
    res = cli("guard", "check", "--engine", engine, "--file", str(SCREENS / name), "--json")
    data = res.json()["data"]
    assert (data["state"], data["paste"], res.code) == (state, False, 4), data
    assert data["draft"] is True and data["input"]


@pytest.mark.parametrize("name", list(CAPTURES))
def test_guard_check_classifies_real_captures(cli: Any, name: str) -> None:
    engine, state = CAPTURES[name]
    res = cli("guard", "check", "--engine", engine, "--file", str(SCREENS / name), "--json")
    data = res.json()["data"]
    assert data["state"] == state, data["reason"]
    # Claude and Codex queue typed input while busy, so only a dialog stops the paste.
    assert res.code == (4 if state == "dialog" else 0)
    human = cli("guard", "check", "-e", engine, "-f", str(SCREENS / name))
    assert human.out.startswith(f"{state}: ")
    assert ("would be refused" in human.out) == (state == "dialog")


def test_guard_check_rejects_unknown_engine_and_missing_file(cli: Any, tmp_path: Path) -> None:
    res = cli("guard", "check", "--engine", "nope", "--file", str(SCREENS / "claude-idle.txt"))
    assert res.code == 2 and "no profile for engine 'nope'" in res.err
    res = cli("guard", "check", "--engine", "claude", "--file", str(tmp_path / "missing.txt"))
    assert res.code == 2 and "cannot read" in res.err


def test_fleet_profile_override_changes_the_verdict(cli: Any, tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text('[engines.claude]\ndialog = ["auto mode on"]\n', encoding="utf-8")
    res = cli("--fleet", str(fleet), "guard", "check", "-e", "claude", "-f", str(SCREENS / "claude-busy.txt"), "--json")
    assert res.code == 4 and res.json()["data"]["state"] == "dialog"


# -- live panes ----------------------------------------------------------------------------------------------------


def fake_engine(tmp: Path, engine: str) -> Path:
    """bin/<engine>: the fake TUI under the engine's own command name, vouched for as that engine by the test's fleet
    (a name alone is no evidence: tests/test_identity.py)."""
    vouch(tmp, engine)
    bindir = tmp / "bin"
    bindir.mkdir(exist_ok=True)
    exe = bindir / engine
    fake_tui = ROOT / "tests" / "support" / "fake_tui.py"
    exe.write_text(f"#!{sys.executable}\n" + fake_tui.read_text(encoding="utf-8"), encoding="utf-8")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def vouch(tmp: Path, engine: str) -> None:
    """The default fleet (isolated's XDG_CONFIG_HOME) names the engine's command: the user vouching for the program."""
    fleet = tmp / "config" / "drover" / "fleet.toml"
    fleet.parent.mkdir(parents=True, exist_ok=True)
    text = fleet.read_text(encoding="utf-8") if fleet.exists() else ""
    if f"[engines.{engine}]" not in text:
        fleet.write_text(text + f'[engines.{engine}]\ncommands = ["{engine}"]\n', encoding="utf-8")


def start_fake(tmux: Tmux, tmp: Path, capture: str) -> tuple[Any, Path]:
    engine = CAPTURES[capture][0]
    exe = fake_engine(tmp, engine)
    log = tmp / f"{capture}.bytes"
    pane = tmux.start(capture.split(".")[0], f"{exe} --screen {SCREENS / capture} --log {log}", width=170, height=55)
    last = [line for line in (SCREENS / capture).read_text(encoding="utf-8").splitlines() if line.strip()][-1].strip()
    wait_for(lambda: log.exists() and last in pane.screen(), what="the fake TUI to draw the whole capture")
    return pane, log


@pytest.mark.parametrize("capture", DIALOGS)
def test_live_pane_showing_a_real_dialog_is_refused_and_receives_nothing(tmux: Tmux, isolated: Path, capture: str) -> None:
    pane, log = start_fake(tmux, isolated, capture)
    doc = drover.run("sessions.message", {"id": pane.address, "text": "yes, go ahead"}, actor="tester")
    assert doc.data["outcome"] == "refused", doc.data
    assert doc.data["code"] == "dialog"
    assert doc.data["session"]["engine"] == CAPTURES[capture][0]
    assert doc.exit_code == 4
    stays(lambda: log.read_bytes() == b"", what="the dialog receiving nothing")


def test_live_idle_claude_gets_a_bracketed_paste_then_enter(tmux: Tmux, isolated: Path) -> None:
    pane, log = start_fake(tmux, isolated, "claude-idle.txt")
    doc = drover.run("sessions.message", {"id": pane.address, "text": "hello claude"}, actor="tester")
    assert doc.data["outcome"] == "delivered", doc.data
    wait_for(lambda: log.read_bytes().endswith(b"\r"), what="Enter")
    body = (
        f'<cross-session-message from-session="{doc.data["id"]}" from-name="drover (tester)" from-mode="prompting">'
        "\nhello claude\n</cross-session-message>"
    )
    assert log.read_bytes() == b"\x1b[200~" + body.encode() + b"\x1b[201~\r"


def test_agent_dialog_is_refused_with_exit_code_and_nothing_typed(tmux: Tmux, cli: Any) -> None:
    pane = tmux.agent("dlg")
    os.kill(pane.pid, signal.SIGUSR1)
    wait_for(lambda: "Do you want to proceed?" in pane.screen())
    res = cli("send", "local:dlg", "1")
    assert res.code == 4
    assert "refused" in res.err and "Do you want to proceed?" in res.err
    st = cli("status", "dlg", "--json").json()["data"]["session"]
    assert (st["state"], st["screen_state"]) == ("waiting_on_human", "dialog")
    stays(lambda: pane.events("dialog") == [] and pane.events("dialog_input") == [] and pane.messages() == [])


def test_dialog_appearing_during_the_paste_gets_no_enter(tmux: Tmux) -> None:
    # The agent draws its dialog the instant a paste begins: after drover's check, before its Enter.
    pane = tmux.agent("racer", "default", "--dialog-on-paste")
    doc = drover.run("sessions.message", {"id": pane.address, "text": "please continue"}, actor="tester")
    assert doc.data["outcome"] == "refused", doc.data
    assert doc.data["code"] == "dialog_after_paste"
    assert doc.data["pasted"] is True
    stays(lambda: pane.events("dialog") == [] and pane.messages() == [], 0.5, what="no Enter reaching the dialog")


def test_dialog_words_inside_our_own_text_do_not_block_enter(tmux: Tmux) -> None:
    pane = tmux.agent("quoter")
    text = "the other session showed: Do you want to proceed?"
    doc = drover.run("sessions.message", {"id": pane.address, "text": text}, actor="tester")
    assert doc.data["outcome"] == "delivered", doc.data
    wait_for(pane.messages)


def test_copy_mode_input_off_and_dead_panes_are_refused(tmux: Tmux) -> None:
    pane = tmux.agent("modes")
    pane.tmux("copy-mode", "-t", pane.id)
    doc = drover.run("sessions.message", {"id": pane.address, "text": "x1"}, actor="tester")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "copy_mode")
    pane.tmux("send-keys", "-t", pane.id, "-X", "cancel")
    pane.tmux("select-pane", "-d", "-t", pane.id)
    doc = drover.run("sessions.message", {"id": pane.address, "text": "x2"}, actor="tester")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "input_off")
    pane.tmux("select-pane", "-e", "-t", pane.id)
    stays(lambda: pane.messages() == [] and pane.events("key") == [])

    dead = tmux.start("dead", "sleep 600")
    dead.tmux("set-option", "-w", "-t", dead.id, "remain-on-exit", "on")
    os.kill(int(dead.tmux("display-message", "-p", "-t", dead.id, "#{pane_pid}").strip()), signal.SIGTERM)
    wait_for(lambda: dead.tmux("display-message", "-p", "-t", dead.id, "#{pane_dead}").strip() == "1", what="pane death")
    doc = drover.run("sessions.message", {"id": dead.address, "text": "anyone?", "raw": True}, actor="tester")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "pane_dead")
    # Without --raw too: said to be dead, never advice to use --raw on a program that is not there.
    doc = drover.run("sessions.message", {"id": dead.address, "text": "anyone?"}, actor="tester")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "pane_dead"), doc.data
    assert "--raw" not in doc.data["detail"] and "dead pane" in doc.data["detail"], doc.data


def test_password_prompt_in_a_shell_is_refused(tmux: Tmux, isolated: Path) -> None:
    log = isolated / "pw.bytes"
    script = (
        "import sys,os; sys.stdout.write('[sudo] password for root: '); sys.stdout.flush(); "
        f"d = os.read(0, 100); open('{log}','wb').write(d)"
    )
    pane = tmux.start("pw", f'{sys.executable} -c "{script}"')
    wait_for(lambda: "password for root" in pane.screen())
    doc = drover.run("sessions.message", {"id": pane.address, "text": "hunter2"}, actor="tester")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "not_an_agent"), doc.data
    doc = drover.run("sessions.message", {"id": pane.address, "text": "hunter2", "raw": True}, actor="tester")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "not_at_prompt"), doc.data
    stays(lambda: not log.exists(), what="the password prompt receiving nothing")


def test_expect_engine_mismatch_is_refused(tmux: Tmux) -> None:
    pane = tmux.agent("which")
    doc = drover.run("sessions.message", {"id": pane.address, "text": "hi", "expect_engine": "claude"}, actor="tester")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "engine_mismatch")
    assert pane.messages() == []


def test_busy_engine_that_does_not_queue_is_refused(tmux: Tmux, isolated: Path) -> None:
    fleet = isolated / "fleet.toml"
    fleet.write_text("[engines.demo]\nqueues_when_busy = false\n", encoding="utf-8")
    pane = tmux.agent("noqueue")
    os.kill(pane.pid, signal.SIGUSR2)
    wait_for(lambda: "esc to interrupt" in pane.screen())
    with drover.Client(fleet=fleet, actor="tester") as client:
        doc = client.run("sessions.message", id=pane.address, text="hi")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "busy")
    assert pane.messages() == []
