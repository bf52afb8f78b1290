"""The newcomer's path: `drover demo` works end to end, and the README's commands are the ones CI runs."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from tests.conftest import ROOT, drover_process


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    setup = text.split("## Set up", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.+?)\n```", setup, re.S)


def test_readme_has_the_two_setup_commands_and_ci_runs_the_second() -> None:
    demo, tests = readme_commands()
    assert "apt-get install" in demo and "tmux" in demo and demo.endswith("drover demo")
    assert tests == "bash scripts/test.sh"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    commands = [line for line in ci.splitlines() if line.strip() and not line.startswith("#")]
    assert commands[-1] == "exec bash scripts/test.sh"
    script = (ROOT / "scripts" / "test.sh").read_text(encoding="utf-8")
    assert "apt-get install" in script and "pytest" in script and '"$rc" -eq 5' in script


def test_demo_runs_end_to_end_and_cleans_up(isolated: Path) -> None:
    # the user's own record, which the demo must leave alone
    truth = isolated / "home" / "truth.jsonl"
    truth.parent.mkdir(parents=True)
    mine = b'{"v": 1, "event": "note", "id": "msg_mine"}\n'
    truth.write_bytes(mine)
    res = drover_process("demo", timeout=120)
    assert res.code == 0, res.err + res.out
    out = res.out
    assert "delivered → local:" in out
    assert "refused → local:" in out and "Do you want to proceed?" in out
    assert "the dialog received 0 keystrokes from drover" in out
    # the command it shows is the command it ran: the same text, word for word
    sends = [shlex.split(line[2:]) for line in out.splitlines() if line.startswith("$ ") and " drover send " in line]
    texts = [argv[argv.index("send") + 2] for argv in sends]
    assert texts == ["coordinator here: rebase on master, the schema landed", "yes, go ahead"]
    events = [json.loads(line) for line in out.splitlines() if line.startswith('{"v": 1')]
    assert [e["text"] for e in events if e["event"] == "accepted"] == texts
    assert [e["outcome"] for e in events if e["event"] == "outcome"] == ["delivered", "refused"]
    assert re.search(
        r'<cross-session-message from-session="msg_[0-9a-f]+" from-name="drover \(drover-demo\)" '
        r'from-mode="prompting">\n' + re.escape(texts[0]) + r"\n",
        out,
    )
    # its records went to its own throwaway truth file, which is gone; the user's is byte for byte what it was
    demo_truth = re.search(r"demo truth file: (\S+)", out)
    assert demo_truth and not Path(demo_truth.group(1)).exists()
    assert truth.read_bytes() == mine
    assert drover_process("log", "--json").json()["data"]["messages"] == []
    # the demo's tmux server is gone: nothing is left to list in this test's private socket directory
    assert drover_process("ls", "--json").json()["data"]["sessions"] == []
