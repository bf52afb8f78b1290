"""Delivery by guarded paste into real tmux panes: what the receiving program read is compared with what was sent."""

from __future__ import annotations

import random
import string
from pathlib import Path
from typing import Any

import pytest

import drover
from tests.conftest import Tmux, wait_for

ACTOR = "tester"


def expected_envelope(body: str) -> str:
    # Written out here, not built with drover's own function: the test must not share the code it checks.
    return f'<cross-session-message from-name="drover ({ACTOR})" from-mode="prompting">\n{body}\n</cross-session-message>'


def send(pane_address: str, text: str, **extra: object) -> Any:
    doc = drover.run("sessions.message", {"id": pane_address, "text": text, **extra}, actor=ACTOR)
    return doc


def big_text(n: int) -> str:
    rng = random.Random(7)
    alphabet = string.ascii_letters + string.digits + " .,;:!?-_/()[]{}'\"#$%&*+=<>@^`|~"
    lines, size = [], 0
    while size < n:
        line = "".join(rng.choice(alphabet) for _ in range(rng.randint(20, 120)))
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)[:n]


CASES = {
    "one-liner": ("coordinator here: rebase on master, the schema landed", None),
    "fifty-lines": ("\n".join(f"line {i:02d}: the quick brown fox" for i in range(50)), None),
    "unicode": ("日本語のテキスト 中文 한국어 🎉👩\u200d💻 Ünïcödé \u200fשלום עולם\u200f \u202bمرحبا\u202c", None),
    "tabs": ("col1\tcol2\t\tcol3\n\tindented", None),
    "bracketed-paste-end": ("before\x1b[201~after, then Enter", "before\u241b[201~after, then Enter"),
    "ctrl-c": ("stop\x03now", "stop\u2403now"),
    "arrow-key": ("up\x1b[Aarrow\x1bOB", "up\u241b[Aarrow\u241bOB"),
    "closing-tag": ("quote: </cross-session-message> and more", "quote: <\\/cross-session-message> and more"),
    "key-names": ("Enter C-c Escape Up M-x BSpace", None),
    "crlf-and-cr": ("a\r\nb\rc", "a\nb\u240dc"),
    "del-and-c1": ("x\x7fy\x9bz\x85", "x\u2421y\ufffdz\ufffd"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_text_arrives_as_text_never_as_keys(tmux: Tmux, case: str) -> None:
    text, visible = CASES[case]
    pane = tmux.agent()
    doc = send(pane.address, text)
    assert doc.ok, doc.errors
    assert doc.data["outcome"] == "delivered"
    assert doc.data["lane"] == "tmux"
    wait_for(pane.messages, what="the message to arrive")
    assert pane.messages() == [expected_envelope(visible if visible is not None else text)]
    assert pane.events("key") == [], "part of the text was read as a key press"
    assert pane.events("dialog") == []


def test_hundred_kilobytes_arrive_whole(tmux: Tmux) -> None:
    text = big_text(100_000)
    pane = tmux.agent()
    doc = send(pane.address, text)
    assert doc.data["outcome"] == "delivered", doc.data
    wait_for(pane.messages, timeout=20, what="100 KB to arrive")
    got = pane.messages()
    assert len(got) == 1
    assert got[0] == expected_envelope(text)
    assert pane.events("key") == []


def test_a_program_that_is_no_agent_gets_nothing_even_with_raw_unless_at_a_shell_prompt(tmux: Tmux, isolated: Path) -> None:
    out = isolated / "shell-received.txt"
    pane = tmux.start("plain", f"exec cat > {out}")
    wait_for(lambda: pane.tmux("display-message", "-p", "-t", pane.id, "#{pane_current_command}").strip() == "cat")
    doc = send(pane.address, "echo hello")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "not_an_agent"), doc.data
    assert doc.data["session"]["engine"] == "shell" and doc.exit_code == 4
    raw = send(pane.address, "echo hello again", raw=True)
    assert (raw.data["outcome"], raw.data["code"]) == ("refused", "not_at_prompt"), raw.data
    assert "cat" in raw.data["detail"]
    pane.tmux("send-keys", "-t", pane.id, "C-d")
    wait_for(lambda: out.exists(), what="cat to end")
    assert out.read_text(encoding="utf-8") == ""


def test_the_envelope_names_drovers_message_id_so_the_record_can_show_it(tmux: Tmux) -> None:
    pane = tmux.agent("ided")
    doc = send(pane.address, "find me later")
    assert doc.data["outcome"] == "delivered"
    got = wait_for(pane.raw_messages)[0]
    assert got.startswith(f'<cross-session-message from-session="{doc.data["id"]}" from-name="drover ({ACTOR})"')
    # the demo agent's log is its record: drover looked there and saw the message arrive
    assert doc.data["verified"] is True and "agent-" in doc.data["verification"]


def test_busy_agent_gets_it_queued(tmux: Tmux) -> None:
    pane = tmux.agent("busy", "default", "--busy-after-message", "4")
    first = send(pane.address, "first: start working")
    assert first.data["outcome"] == "delivered"
    wait_for(lambda: "esc to interrupt" in pane.screen(), what="the agent to look busy")
    second = send(pane.address, "second: arrives while busy")
    assert second.ok, second.errors
    assert second.data["outcome"] == "queuedBehindTurn"
    wait_for(lambda: len(pane.messages()) == 2)
    queued = pane.events("message")[1]
    assert queued["while_busy"] is True
    assert pane.messages()[1] == expected_envelope("second: arrives while busy")


def test_send_by_name_and_by_session_window_pane(tmux: Tmux, cli: Any) -> None:
    pane = tmux.agent("webapp-f8")
    res = cli("--actor", ACTOR, "send", "local:webapp-f8", "by name", "--json")
    assert res.code == 0, res.err
    assert res.json()["data"]["session"]["id"] == pane.id
    res = cli("--actor", ACTOR, "send", "webapp-f8:0.0", "by target", "--json")
    assert res.code == 0, res.err
    wait_for(lambda: len(pane.messages()) == 2)
    assert pane.messages() == [expected_envelope("by name"), expected_envelope("by target")]


def test_send_reads_stdin(tmux: Tmux, cli: Any) -> None:
    pane = tmux.agent("stdin")
    res = cli("--actor", ACTOR, "send", "stdin", "-", stdin="from a pipe\nsecond line\n")
    assert res.code == 0, res.err
    assert "delivered" in res.out
    wait_for(pane.messages)
    assert pane.messages() == [expected_envelope("from a pipe\nsecond line\n")]


def test_ls_and_status_show_engine_and_state(tmux: Tmux, cli: Any) -> None:
    agent = tmux.agent("lister")
    shell = tmux.start("sh", "bash --norc --noprofile")
    res = cli("ls", "--json")
    assert res.code == 0, res.err
    rows = {s["id"]: s for s in res.json()["data"]["sessions"]}
    assert rows[agent.id]["engine"] == "demo" and rows[agent.id]["state"] == "idle"
    assert rows[agent.id]["name"] == "lister" and rows[agent.id]["host"] == "local"
    assert rows[shell.id]["engine"] == "shell"
    human = cli("ls")
    assert "lister" in human.out and "demo" in human.out and "idle" in human.out
    st = cli("status", "local:lister", "--json")
    assert st.code == 0
    session = st.json()["data"]["session"]
    assert session["state"] == "idle" and session["last_line"] == "idle · paste or type a message"
    assert any("❯" in line for line in session["tail"])


def test_stale_tmux_sockets_cost_nothing_and_hide_nothing(tmux: Tmux) -> None:
    """A crashed tmux server leaves its socket behind: probed in-process, skipped quietly."""
    import os
    import socket as socketlib

    pane = tmux.agent("alive")
    sockdir = Path(os.environ["TMUX_TMPDIR"]) / f"tmux-{os.getuid()}"
    for i in range(20):
        dead = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
        dead.bind(str(sockdir / f"crashed-{i}"))
        dead.close()  # the file stays, nobody listens
    doc = drover.run("sessions.list", {})
    assert [s["name"] for s in doc.data["sessions"]] == ["alive"] and doc.data["warnings"] == []
    assert send(pane.address, "still reachable").data["outcome"] == "delivered"


def test_local_work_never_imports_asyncssh(tmux: Tmux) -> None:
    """`log`, `ls` and a send to the local host pay nothing for SSH (issue 11's lean cold path)."""
    import os
    import subprocess
    import sys

    pane = tmux.agent("lean")
    for args in (["log", "-n", "1"], ["ls"], ["send", pane.address, "lean and local"]):
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "drover", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env=os.environ,
        )
        assert proc.returncode == 0, proc.stderr[-500:]
        imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
        assert "asyncssh" not in imported, args


def test_a_session_with_an_inbox_gets_no_paste_not_even_to_finish_one_but_the_owners(
    tmux: Tmux, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lane choice itself, on the host: a Claude registry record that names an inbox socket (a live process
    holds the record; the socket file is gone) refuses `--via tmux` and the retry's finish of a pasted message
    (`native_lane`), and `auto` fails `socket_missing` rather than falling back; only the owner's words pass the
    rule (and then meet the lane's own checks: this session has no pane)."""
    import json

    from drover.remote import protocol as P
    from drover.remote.main import handle

    sessions = isolated / "claude" / "sessions"
    sessions.mkdir(parents=True)
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(sessions.parent))
    holder = tmux.start("holder", "sleep 600")
    pid = int(holder.tmux("display-message", "-p", "-t", holder.id, "#{pane_pid}").strip())
    start = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    record = {"pid": pid, "sessionId": "0a1b2c3d-0000-1111-2222-333344445555", "procStart": start, "name": "inboxed"}
    record["messagingSocketPath"] = str(isolated / "gone.sock")
    (sessions / f"{pid}.json").write_text(json.dumps(record))

    def deliver(**args: Any) -> dict[str, Any]:
        answer = handle({"helper": P.PROTOCOL, "op": "deliver", "args": {"target": "inboxed", "text": "hi", **args}})
        return dict(answer.get("data") or answer["error"])

    for args in ({"lane": "tmux"}, {"finish": True}, {"lane": "tmux", "finish": True}):
        out = deliver(**args)
        assert (out["outcome"], out["code"], out["lane"]) == ("refused", "native_lane", "tmux"), (args, out)
        assert ("clear it or submit it there" in out["detail"]) == bool(args.get("finish")), out["detail"]
    auto = deliver(receipt_wait_s=0.1)
    assert (auto["outcome"], auto["code"], auto["lane"]) == ("failed", "socket_missing", "inbox"), auto
    owner = deliver(lane="tmux", as_owner=True)
    assert owner["code"] == "bad_lane" and "no tmux pane" in owner["message"], owner
