"""drover's own leftover: an earlier message of drover's pasted and never submitted is named as drover's, not
called a person's draft -- and still never pasted onto."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import drover
from tests.conftest import Tmux, stays, wait_for

ROOT = Path(__file__).resolve().parent.parent


def test_drovers_own_unsent_message_in_the_box_is_named_and_not_pasted_onto(tmux: Tmux) -> None:
    pane = tmux.agent("leftover")
    # A sender killed between its paste and its Enter: its envelope sits in the input box.
    proc = subprocess.run(
        [sys.executable, "-m", "drover", "--actor", "crasher", "send", pane.address, "left behind"],
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        env={**os.environ, "DROVER_FAULT": "after_paste"},
        timeout=60,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    first = drover.run("messages.list", {"pending": True}).data["messages"][0]["id"]
    wait_for(lambda: "left behind" in pane.screen(), what="the envelope in the box")
    before = pane.screen()
    doc = drover.run("sessions.message", {"id": pane.address, "text": "a second message"}, actor="tester")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "draft_in_input"), doc.data
    assert doc.data["unsent"] == first
    assert f"drover's own earlier message {first}" in doc.data["detail"]
    assert "person" not in doc.data["detail"] and not doc.data.get("pasted")
    stays(lambda: pane.screen() == before and pane.messages() == [], what="nothing pasted onto it, nothing sent")


def test_a_persons_text_that_merely_mentions_the_tag_is_still_a_persons_draft(tmux: Tmux) -> None:
    pane = tmux.agent("mention")
    typed = "why does <cross-session-message> show up in my log"
    pane.tmux("send-keys", "-t", pane.id, "-l", typed)
    wait_for(lambda: typed in pane.screen(), what="the draft")
    doc = drover.run("sessions.message", {"id": pane.address, "text": "hello"}, actor="tester")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "draft_in_input"), doc.data
    assert "person's draft" in doc.data["detail"] and "unsent" not in doc.data
