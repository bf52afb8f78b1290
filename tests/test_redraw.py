"""What each engine draws after a paste, measured on the real programs (tests/support/redraw.py): the numbers behind the
profiles' `paste_hold_s`, printed (run with -s), and the premise of drover's conditional Enter checked on each --
a key typed into the box after the paste moves the cursor tmux reports, so an Enter conditioned on the cursor is
not pressed after it.  No timing is asserted: the machine's load decides those numbers."""

from __future__ import annotations

import shutil
import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Tmux, wait_for
from tests.support.codexlab import CodexLab, module_lab
from tests.support.geminilab import GeminiLab
from tests.support.geminilab import ensure_binary as ensure_gemini
from tests.support.redraw import clear_box, cursor, paste_redraw, tmux

ONE = "please rebase the feature branch on main and run the tests"
MANY = "first line of a longer note\nsecond line of it\nthird line, the end"
SAMPLES = 5


def measure(name: str, server: list[str], pane: str, shown: Any) -> None:
    """Paste each text SAMPLES times (the box cleared between): the redraw's spread, and the cursor moved by a key."""
    for label, text in (("one line", ONE), ("three lines", MANY)):
        lasts, spreads = [], []
        for _ in range(SAMPLES):
            got = paste_redraw(server, pane, text)
            wait_for(lambda: shown(tmux(server, "capture-pane", "-p", "-t", pane)), what=f"{name}: the paste in the box")
            assert got["last_ms"] is not None, f"{name} drew nothing after a paste"
            lasts.append(got["last_ms"])
            spreads.append(round(got["last_ms"] - got["first_ms"], 1))
            print(f"\n{name}, {label}: output chunks at {got['at_ms']} ms after the paste")
            before = cursor(server, pane)
            tmux(server, "send-keys", "-t", pane, "-l", "Z")
            # The premise of the conditional Enter: a key typed into the box moves the cursor tmux reports.
            wait_for(lambda: cursor(server, pane) != before, what=f"{name}: the cursor moved by a typed key")  # noqa: B023
            clear_box(server, pane, len(text) + 1)
            wait_for(lambda: not shown(tmux(server, "capture-pane", "-p", "-t", pane)), what=f"{name}: the box cleared")
        print(
            f"\n{name}, {label}: redraw after the paste ends {min(lasts)}-{max(lasts)} ms "
            f"(median {statistics.median(lasts)} ms, {SAMPLES} pastes); first to last write at most {max(spreads)} ms"
        )


def test_the_demo_agent(tmux: Tmux) -> None:
    pane = tmux.agent("measured")
    measure("demo agent", ["-L", pane.server], pane.id, lambda s: "❯ first line" in s or "❯ please rebase" in s)


def test_claude_code(claude_lab: Any) -> None:
    s = claude_lab.start("measured")
    wait_for(lambda: "❯" in s.screen(), 30, what="Claude's input box")
    measure("Claude Code", [], s.pane, lambda screen: "please rebase" in screen or "first line" in screen)


@pytest.fixture(scope="module")
def codex_lab() -> Iterator[CodexLab]:
    with module_lab("dcr-") as lab:
        yield lab


def test_codex(codex_lab: CodexLab) -> None:
    s = codex_lab.start("measured")
    measure("Codex", ["-S", str(codex_lab.socket)], s.pane, lambda screen: "please rebase" in screen or "first line" in screen)


@pytest.fixture
def gemini_lab(tmux: Tmux) -> Iterator[GeminiLab]:
    path, why = ensure_gemini()
    if path is None:
        pytest.skip(f"the real gemini-cli cannot run here: {why}")
    lab = GeminiLab(Path(tempfile.mkdtemp(prefix="drg-")), path)
    yield lab
    lab.stop()
    shutil.rmtree(lab.root, ignore_errors=True)


def test_gemini_cli(gemini_lab: GeminiLab) -> None:
    s = gemini_lab.start("measured")
    s.wait_idle()
    measure("gemini-cli", ["-L", s.lab.server], s.pane, lambda screen: "please rebase" in screen or "first line" in screen)
