"""The paste refuses on doubt (issue 15), against the real Claude Code binary (2.1.328, offline).

A Claude Code whose inbox drover does not link to its pane got pasted to on `auto`, landing as its human's own
typing around crossSessionInbound (the stranger's F1-F3).  drover now finds its registry where the process says
(its CLAUDE_CONFIG_DIR / HOME), matches a record to the pane whose process tree holds it (Anthropic's
`node cli-wrapper.cjs` runs the binary as a child), and refuses `lane_unknown` when it still finds none.  The inbox
is written to only when the session's own process listens there (S1); a tmux session name naming two panes is
ambiguous (N1); a held message's cause is told from Claude's own screen and command line (W1, W2).
"""

from __future__ import annotations

import json
import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import drover
from tests.conftest import stays, wait_for
from tests.support.claudelab import ClaudeLab, ClaudeSession, expose, own_server_lab

ACTOR = "tester"
DIALOG = "Deliver this message to Claude"


@pytest.fixture(scope="module")
def lab(claude_binary: Path) -> Iterator[ClaudeLab]:
    yield from own_server_lab(claude_binary, "dnd-")


@pytest.fixture(autouse=True)
def seen(lab: ClaudeLab, isolated: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(lab.config))
    yield from expose(lab)


def send(target: str, text: str, **extra: Any) -> Any:
    return drover.run("sessions.message", {"id": target, "text": text, **extra}, actor=ACTOR)


def typed(s: ClaudeSession, text: str) -> bool:
    """Did the text reach the session at all: on its screen (its input box), or in its transcript?"""
    return text in s.screen() or any(text in json.dumps(r.get("message", {})) for r in s.transcript())


def listed(s: ClaudeSession) -> list[dict[str, Any]]:
    """Every session `drover ls` shows for this Claude (its pane, or its registry record)."""
    doc = drover.run("sessions.list", {})
    rows = doc.data["sessions"] if isinstance(doc.data, dict) else doc.data
    return [r for r in rows if r.get("id") == s.session_id or r.get("pane") == s.pane or r.get("id") == s.pane]


def test_a_claude_whose_registry_is_not_the_helpers_is_reached_through_its_inbox(lab: ClaudeLab) -> None:
    """F1a: a second account (its own HOME / CLAUDE_CONFIG_DIR): drover reads the registry the process reads."""
    other = ClaudeLab(lab.root / "other", lab.binary, socket=lab.socket)  # another config dir, the same tmux server
    s = other.start("elsewhere", project_settings={"crossSessionInbound": "refuse"})
    rows = listed(s)
    assert [(r["id"], r["lanes"]) for r in rows] == [(s.session_id, ["inbox", "tmux"])], rows
    sent = send(s.pane, "to a Claude of another account")
    assert (sent.data["outcome"], sent.data["code"], sent.data["lane"]) == ("refused", "refused", "inbox"), sent.data
    stays(lambda: not typed(s, "to a Claude of another account"), 1.0, "nothing typed into the pane")


def test_a_claude_drover_finds_no_record_for_gets_no_paste(lab: ClaudeLab) -> None:
    """F1b (the record removed; the same for F2, a Claude in its own pid namespace): refused on doubt."""
    s = lab.start("unrecorded", project_settings={"crossSessionInbound": "refuse"})
    (lab.config / "sessions" / f"{s.pid}.json").unlink()
    texts = ["auto, no record", "by paste, no record", "broadcast, no record"]
    sent = send(s.pane, texts[0])
    assert (sent.data["outcome"], sent.data["code"], sent.exit_code) == ("refused", "lane_unknown", 4), sent.data
    assert "cannot find this Claude Code's inbox" in sent.data["detail"] and "--as-owner" in sent.data["detail"]
    pasted = send(s.pane, texts[1], via="tmux")
    assert (pasted.data["outcome"], pasted.data["code"]) == ("refused", "lane_unknown"), pasted.data
    cast = drover.run("sessions.broadcast", {"name": "unrecorded", "text": texts[2]}, actor=ACTOR)
    assert [(r["outcome"], r["code"]) for r in cast.data["messages"]] == [("refused", "lane_unknown")], cast.data
    stays(lambda: not any(typed(s, t) for t in texts), 1.0, "nothing typed into the pane")


def test_claude_through_anthropics_node_wrapper_is_one_session_with_its_inbox(lab: ClaudeLab) -> None:
    """F3: `node …/claude-code/cli-wrapper.cjs` runs the binary as its child: one session, reached by its inbox."""
    wrapper = lab.binary.parents[1] / "claude-code" / "cli-wrapper.cjs"
    if not wrapper.exists() or not shutil.which("node"):
        pytest.skip("no node or no cli-wrapper.cjs")
    real = lab.binary
    lab.binary = Path(f"node {wrapper}")  # the command line the lab runs, as a person would type it
    try:
        s = lab.start("wrapped", project_settings={"crossSessionInbound": "refuse"})
    finally:
        lab.binary = real
    rows = listed(s)
    assert [(r["id"], r.get("pane"), r["lanes"]) for r in rows] == [(s.session_id, s.pane, ["inbox", "tmux"])], rows
    pasted = send(s.pane, "wrapped, by paste", via="tmux")
    assert (pasted.data["outcome"], pasted.data["code"], pasted.exit_code) == ("refused", "native_lane", 4), pasted.data
    sent = send(s.pane, "wrapped, auto")
    assert (sent.data["outcome"], sent.data["code"], sent.data["lane"]) == ("refused", "refused", "inbox"), sent.data
    stays(lambda: not typed(s, "wrapped, by paste") and not typed(s, "wrapped, auto"), 1.0, "nothing typed")


class Impostor:
    """A listener that is not Claude, at a Claude's inbox path: it keeps whatever it is sent."""

    def __init__(self, path: Path) -> None:
        self.got = b""
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(4)
        self.sock.settimeout(0.2)
        self.stop = False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(1.0)
                try:
                    while chunk := conn.recv(65536):
                        self.got += chunk
                except OSError:
                    pass

    def close(self) -> None:
        self.stop = True
        self.thread.join(5)
        self.sock.close()


def test_the_inbox_is_written_only_where_the_sessions_own_process_listens(lab: ClaudeLab) -> None:
    """S1: a symlink to another Claude's socket, a listener that is not Claude, a regular file: nothing sent."""
    s = lab.start("socketed")
    neighbour = lab.start("neighbour")
    path = Path(s.record()["messagingSocketPath"])  # type: ignore[index]
    aside = path.with_name(path.name + ".aside")
    path.rename(aside)
    try:
        path.symlink_to(neighbour.record()["messagingSocketPath"])  # type: ignore[index]
        linked = send("socketed", "through a link to the neighbour")
        assert (linked.data["outcome"], linked.data["code"], linked.exit_code) == ("failed", "socket_foreign", 5), linked.data
        assert "symbolic link" in linked.data["detail"] and "does not paste instead" in linked.data["detail"]
        path.unlink()
        impostor = Impostor(path)
        try:
            caught = send("socketed", "to whoever listens")
            assert (caught.data["outcome"], caught.data["code"]) == ("failed", "socket_foreign"), caught.data
            assert "not by the session" in caught.data["detail"], caught.data["detail"]
        finally:
            impostor.close()
        assert impostor.got == b"", impostor.got  # not the message, and not the session's peer token
        path.unlink()
        path.write_text("not a socket")
        filed = send("socketed", "to a regular file")
        assert (filed.data["outcome"], filed.data["code"]) == ("failed", "socket_foreign"), filed.data
        assert "gone" not in filed.data["detail"] and "not a socket" in filed.data["detail"], filed.data["detail"]
        path.unlink()
    finally:
        aside.rename(path)
    texts = ["through a link to the neighbour", "to whoever listens", "to a regular file"]
    stays(lambda: not any(typed(x, t) for x in (s, neighbour) for t in texts), 1.0, "nothing reached either Claude")
    assert neighbour.peer_messages() == []
    # Its own socket back in place: the inbox works again
    ok = send("socketed", "through its own socket")
    assert (ok.data["outcome"], ok.data["lane"]) == ("delivered", "inbox"), ok.data


def test_a_tmux_session_name_naming_a_claude_and_a_shell_is_ambiguous(lab: ClaudeLab) -> None:
    """N1: Claude registered in window 0, a bash in window 1: the tmux session's name is refused as ambiguous."""
    s = lab.start("twowin")
    lab.tmux("rename-session", "-t", "=twowin", "tsq")
    lab.tmux("new-window", "-t", "tsq:", "-c", str(s.cwd), "bash --norc --noprofile")
    bash = wait_for(
        lambda: [p for p in lab.tmux("list-panes", "-t", "tsq:1", "-F", "#{pane_id}").split()], timeout=10, what="bash"
    )
    doc = send("tsq", "echo typed-into-the-shell", raw=True)
    assert (doc.data["outcome"], doc.data["code"], doc.exit_code) == ("failed", "ambiguous_session", 6), doc.data
    assert {c["id"] for c in doc.data["candidates"]} == {s.session_id, bash[0]}, doc.data["candidates"]
    stays(lambda: "typed-into-the-shell" not in lab.tmux("capture-pane", "-p", "-t", bash[0]), 1.0, "nothing typed")


def test_the_held_cause_follows_claudes_own_command_line_and_screen(lab: ClaudeLab) -> None:
    """W1: --setting-sources user ignores the project's `hold`: the hold is parity (a dialog).  W2: --settings FILE
    with `hold`: the setting parks it (no dialog), though no file drover reads says so."""
    w1 = lab.start(
        "w1",
        flags="--dangerously-skip-permissions --setting-sources user",
        project_settings={"crossSessionInbound": "hold"},
    )
    held = send("w1", "held for parity")
    assert (held.data["outcome"], held.data["lane"]) == ("held", "inbox"), held.data
    assert "permission-mode parity" in held.data["detail"] and "dialog" in held.data["detail"], held.data["detail"]
    assert 'setting is "hold"' not in held.data["detail"], held.data["detail"]
    wait_for(lambda: DIALOG in w1.screen(), timeout=10, what="Claude's held-message dialog")
    flag = lab.root / "hold-settings.json"
    flag.write_text(json.dumps({"crossSessionInbound": "hold"}))
    w2 = lab.start("w2", flags=f"--settings {flag}")
    parked = send("w2", "held by a --settings file")
    assert (parked.data["outcome"], parked.data["lane"]) == ("held", "inbox"), parked.data
    assert 'crossSessionInbound setting is "hold"' in parked.data["detail"], parked.data["detail"]
    assert "with no dialog" in parked.data["detail"] and "parity" not in parked.data["detail"], parked.data["detail"]
    stays(lambda: DIALOG not in w2.screen() and w2.peer_messages() == [], 1.0, "no dialog, nothing delivered")


def test_nudge_create_if_missing_passes_via_tmux_to_the_brief(
    lab: ClaudeLab, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A nudge that starts its session briefs it on the lane asked for: --via tmux to a Claude with an inbox is
    refused `native_lane`, as a send is; it used to go through the inbox, --via ignored."""
    fleet = isolated / "fleet.toml"
    fleet.write_text(f'[spawn.claude]\ncommand = "sh {lab.launcher()} {{name}}"\nready_timeout_s = 60\n')
    monkeypatch.setenv("DROVER_FLEET", str(fleet))
    cwd = lab.root / "w9"  # trusted in the lab's ~/.claude.json
    cwd.mkdir()
    request = {"id": "nudged", "text": "a nudge by paste", "via": "tmux", "create_if_missing": True}
    doc = drover.run("sessions.nudge", {**request, "engine": "claude", "cwd": str(cwd)}, actor=ACTOR)
    assert (doc.data["outcome"], doc.data["code"], doc.exit_code) == ("refused", "native_lane", 4), doc.data
    spawned = doc.data["spawned"]
    assert spawned["state"] == "ready" and spawned["identity"].startswith("claude:"), spawned
    session = ClaudeSession(lab, "nudged", cwd, spawned["pane"], lab.root / "none", lab.root / "none")
    session.session_id = spawned["id"]
    screen = lambda: lab_screen(spawned["pane"])  # noqa: E731 - on this test's own tmux server
    stays(lambda: "a nudge by paste" not in screen() and session.peer_messages() == [], 1.0, "nothing delivered")


def lab_screen(pane: str) -> str:
    import subprocess

    return subprocess.run(["tmux", "capture-pane", "-p", "-t", pane], capture_output=True, text=True).stdout


def test_a_claude_in_a_pid_namespace_of_its_own_gets_no_paste(lab: ClaudeLab) -> None:
    """F2: a Claude in its own pid namespace (a sandbox in a pane, sharing ~/.claude): its record's pids mean
    nothing here, so drover cannot link it to the pane -- refused on doubt, never pasted to."""
    real = lab.binary
    lab.binary = Path(f"unshare -p -f --mount-proc {real}")
    try:
        s = lab.start("pidns", project_settings={"crossSessionInbound": "refuse"})
    finally:
        lab.binary = real
    sent = send(s.pane, "into another pid namespace")
    assert (sent.data["outcome"], sent.data["code"], sent.exit_code) == ("refused", "lane_unknown", 4), sent.data
    stays(lambda: not typed(s, "into another pid namespace"), 1.0, "nothing typed into the pane")


def test_a_held_cause_drover_cannot_tell_names_both(tmp_path: Path) -> None:
    """No screen to look at, and a command line with --settings: the files drover reads are not the session's, so
    the detail names both causes instead of guessing one (W1/W2 guessed from the files)."""
    import subprocess
    import sys

    from drover.remote import inbox

    (tmp_path / ".claude").mkdir()
    (tmp_path / ".claude" / "settings.json").write_text(json.dumps({"crossSessionInbound": "hold"}))
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "--settings", "/elsewhere.json"])
    try:  # its command line as the kernel shows it once it runs (right after fork it is still the parent's)
        wait_for(lambda: b"--settings" in Path(f"/proc/{proc.pid}/cmdline").read_bytes(), what="the command line")
        session = {"cwd": str(tmp_path), "engine_pid": proc.pid, "_record": {"_config": str(tmp_path / "none")}}
        detail = inbox.held_detail(session, "prompting", {"reason": "(permission-mode parity)"}, wait=0)
    finally:
        proc.kill()
        proc.wait()
    assert "cannot tell which of two causes" in detail and "--settings" in detail, detail
    assert 'crossSessionInbound setting of "hold"' in detail and "permission-mode parity" in detail, detail
