"""Which engine a process is comes from evidence -- its package's path, Claude's registry record, or the fleet
vouching for it -- never from its name: a shell copied to `claude` gets nothing typed into it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import drover
from drover.remote import procs
from drover.remote.profiles import merge_profiles
from tests.conftest import SCREENS, Tmux, stays, wait_for

SH = shutil.which("dash") or "/bin/sh"


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait(timeout=10)


def run(spawned: list[subprocess.Popen[bytes]], *argv: str, cwd: Path | None = None) -> int:
    proc = subprocess.Popen(list(argv), cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    spawned.append(proc)
    wait_for(lambda: (procs.argv_of(proc.pid) or [""])[0] == argv[0], what="the program to start")
    return proc.pid


def engine_of(pid: int, fleet: dict[str, dict[str, Any]] | None = None) -> str:
    return procs.detect_engine(pid, procs.proc_table(), merge_profiles(fleet))[0]


def shell_named(tmp: Path, name: str) -> Path:
    """A copy of the system shell under an engine's name, as a stranger would make one."""
    exe = tmp / "bin" / name
    exe.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(SH, exe)
    return exe


def test_a_shell_named_claude_is_unknown_unless_the_fleet_vouches_for_it(tmp_path: Path, spawned: Any) -> None:
    exe = shell_named(tmp_path, "claude")
    pid = run(spawned, str(exe), "-c", "read line")
    assert engine_of(pid) == "unknown"
    assert engine_of(pid, {"claude": {"dialog": ["Enter to confirm"]}}) == "unknown"  # an override is no vouching
    assert engine_of(pid, {"claude": {"commands": ["claude"]}}) == "claude"
    assert engine_of(pid, {"mine": {"commands": ["claude"]}}) == "mine"  # another program the user names


def test_claudes_registry_record_for_this_very_process_is_evidence(
    tmp_path: Path, spawned: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    exe = shell_named(tmp_path, "claude")
    pid = run(spawned, str(exe), "-c", "read line")
    sessions = tmp_path / "claude" / "sessions"
    sessions.mkdir(parents=True)
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(sessions.parent))
    record = {"pid": pid, "sessionId": "0e0e0e0e-1111-2222-3333-444455556666", "procStart": "1"}
    (sessions / f"{pid}.json").write_text(json.dumps(record))
    assert engine_of(pid) == "unknown"  # a record of another process once under this pid
    record["procStart"] = procs.proc_start(pid)
    (sessions / f"{pid}.json").write_text(json.dumps(record))
    assert engine_of(pid) == "claude"


def test_a_record_from_another_machine_or_pid_namespace_is_no_evidence(
    tmp_path: Path, spawned: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claude's registry discards a record whose pidDomain is not this one's as stale; so must identity, or a Claude
    known only by it would be taken for one with no inbox (and pasted into)."""
    exe = shell_named(tmp_path, "claude")
    pid = run(spawned, str(exe), "-c", "read line")
    sessions = tmp_path / "claude" / "sessions"
    sessions.mkdir(parents=True)
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(sessions.parent))
    record = {"pid": pid, "sessionId": "0e0e0e0e-1111-2222-3333-444455556666", "procStart": procs.proc_start(pid)}
    record["pidDomain"] = "linux:another-machine-id:pid:[4026531836]"
    (sessions / f"{pid}.json").write_text(json.dumps(record))
    assert engine_of(pid) == "unknown"
    record["pidDomain"] = procs.pid_domain()
    (sessions / f"{pid}.json").write_text(json.dumps(record))
    assert engine_of(pid) == "claude"


def test_two_live_processes_of_one_session_keep_a_record_each(
    tmp_path: Path, spawned: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`claude --resume ID` beside the running session: two processes, one sessionId, a socket each."""
    from drover.remote import claude

    sessions = tmp_path / "claude" / "sessions"
    sessions.mkdir(parents=True)
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(sessions.parent))
    pids = [run(spawned, SH, "-c", "read line") for _ in range(2)]
    for pid in pids:
        record = {"pid": pid, "sessionId": "0e0e0e0e-1111-2222-3333-444455556666", "procStart": procs.proc_start(pid)}
        (sessions / f"{pid}.json").write_text(json.dumps({**record, "messagingSocketPath": f"/tmp/s-{pid}.sock"}))
    live, _stale = claude.records([])
    # Other Claude sessions on the machine (another suite's, a person's) are found too: only this one's are asked of.
    mine = [r for r in live if r.get("sessionId") == "0e0e0e0e-1111-2222-3333-444455556666"]
    assert sorted(r["pid"] for r in mine) == sorted(pids)


def test_the_native_installers_claude_is_known_by_its_path_and_gets_no_paste_without_its_record(
    tmp_path: Path, spawned: Any
) -> None:
    """Anthropic's native installer keeps Claude at ~/.local/share/claude/versions/X.Y.Z, outside any npm package:
    that path is evidence too, and with no record found the paste refuses on doubt."""
    from drover.remote.delivery import lane_unknown

    native = tmp_path / ".local" / "share" / "claude" / "versions" / "2.1.328"
    native.parent.mkdir(parents=True)
    shutil.copy(SH, native)
    link = tmp_path / ".local" / "bin" / "claude"  # what the installer puts on PATH
    link.parent.mkdir(parents=True)
    link.symlink_to(native)
    pid = run(spawned, str(link), "-c", "read line")
    assert engine_of(pid) == "claude"
    assert procs.by_package(pid, merge_profiles(None)["claude"])
    session = {"engine": "claude", "_package": True, "id": "%1"}
    assert "cannot find this Claude Code's inbox" in (lane_unknown(session) or "")


@pytest.mark.parametrize(
    ("engine", "package"),
    [("codex", "@openai/codex/bin/codex.js"), ("gemini", "@google/gemini-cli/bundle/gemini.js")],
)
def test_npm_agents_are_known_by_their_package_through_the_link_npm_makes(
    tmp_path: Path, spawned: Any, engine: str, package: str
) -> None:
    """`node …/node_modules/.bin/codex` is Codex because the link resolves into @openai/codex; the same script
    copied to a bin/codex of its own is only named so."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not installed: the README's test command installs it (npm)")
    modules = tmp_path / "node_modules"
    script = modules / package
    script.parent.mkdir(parents=True)
    script.write_text("setInterval(() => {}, 1000);\n")
    (modules / ".bin").mkdir()
    (modules / ".bin" / engine).symlink_to(Path("..") / package)
    linked = run(spawned, node, str(modules / ".bin" / engine))
    assert engine_of(linked) == engine
    relative = run(spawned, node, f".bin/{engine}", cwd=modules)  # resolved from the process's own directory
    assert engine_of(relative) == engine
    copy = tmp_path / "bin" / engine
    copy.parent.mkdir()
    shutil.copy(script, copy)
    named = run(spawned, node, str(copy))
    assert engine_of(named) == "unknown"


def test_the_real_agents_install_paths_are_their_evidence(claude_binary: Path) -> None:
    """Where npm puts the real programs (tests/*lab.py install them): Claude's native binary, Codex's launcher and
    the native binary it runs, gemini-cli's bundle -- each matches its profile's package path, links resolved."""
    from tests.support import codexlab, geminilab

    profiles = merge_profiles(None)
    codex_launcher = codexlab.binary_path().resolve()
    codex_native = sorted(codexlab.cache_dir().glob("node_modules/@openai/codex-*/**/codex"))
    installed = {
        "claude": [claude_binary.resolve()],
        "codex": [codex_launcher, *[p.resolve() for p in codex_native if p.is_file()]],
        "gemini": [geminilab.binary_path().resolve()],
    }
    for engine, paths in installed.items():
        for path in paths:
            assert path.exists(), f"{path}: run the README's test command to install the {engine} lab"
            assert any(re.search(p, str(path)) for p in profiles[engine]["scripts"]), (engine, path)
    assert len(installed["codex"]) >= 2, installed["codex"]


def test_a_shell_copied_to_claude_drawing_claudes_box_gets_nothing_typed(tmux: Tmux, isolated: Path, cli: Any) -> None:
    """A stranger's finding: dash copied to a file named `claude`, showing a prompt drawn like Claude's box, was
    taken for Claude, and each line of the envelope ran as it landed.  Now it is `unknown`: refused, nothing sent."""
    exe = shell_named(isolated, "claude")
    ran = isolated / "ran.log"
    screen = SCREENS / "claude-idle.txt"
    script = f'cat {screen}; while IFS= read -r line; do printf "%s\\n" "$line" >> {ran}; done'
    pane = tmux.start("fake-claude", f"{exe} -c '{script}'", width=170, height=55)
    wait_for(lambda: "? for shortcuts" in pane.screen() or "❯" in pane.screen(), what="the Claude-like box")
    rows = cli("ls", "--json").json()["data"]["sessions"]
    assert [r["engine"] for r in rows if r["id"] == pane.id] == ["unknown"], rows
    doc = drover.run("sessions.message", {"id": pane.address, "text": "echo pwned > /tmp/x"}, actor="tester")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "unverified_engine"), doc.data
    assert doc.exit_code == 4
    assert "no evidence" in doc.data["detail"]
    raw = drover.run("sessions.message", {"id": pane.address, "text": "echo pwned", "raw": True}, actor="tester")
    assert (raw.data["outcome"], raw.data["code"]) == ("refused", "unverified_engine"), raw.data
    stays(lambda: not ran.exists(), what="the fake receiving nothing")


@pytest.mark.parametrize(
    ("argv", "script"),
    [
        (["python3", "-c", "import time  # @anthropic-ai/claude-code/"], []),
        (["python3", "fake.py", "-m", "drover.demo_agent"], ["fake.py"]),
        (["python3", "-u", "-m", "drover.demo_agent", "--log", "x"], ["drover.demo_agent"]),
        (["python3", "-mdrover.demo_agent"], ["drover.demo_agent"]),
        (["python3", "-X", "importtime", "tool.py"], ["tool.py"]),
        (["node", "-e", "require('@anthropic-ai/claude-code/cli.js')"], []),
        (["node", "--require", "@anthropic-ai/claude-code/x.js", "mine.js"], ["mine.js"]),
        (["node", "/lib/node_modules/@openai/codex/bin/codex.js", "resume"], ["/lib/node_modules/@openai/codex/bin/codex.js"]),
    ],
)
def test_an_interpreters_script_is_read_as_the_interpreter_reads_its_command_line(argv: list[str], script: list[str]) -> None:
    """Code given inline and a script's own arguments name no package: `python3 -c '# @anthropic-ai/claude-code/'`
    is not Claude, `python3 fake.py -m drover.demo_agent` is not the demo agent."""
    assert procs.script_of(argv[0], argv[1:]) == script


def test_a_lookalike_command_line_is_no_engine(tmp_path: Path, spawned: Any) -> None:
    fake = tmp_path / "fake.py"
    fake.write_text("import sys\nsys.stdin.read()\n")
    code = run(spawned, sys.executable, "-c", "import sys; sys.stdin.read()  # @anthropic-ai/claude-code/")
    assert engine_of(code) == "shell"
    args = run(spawned, sys.executable, str(fake), "-m", "drover.demo_agent")
    assert engine_of(args) == "shell"
