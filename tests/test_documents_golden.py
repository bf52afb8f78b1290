"""Golden documents: what drover answers, byte for byte, for a recorded set of commands against demo agents in one
real tmux server -- the guard that a refactor of how ops reach their hosts changes no document.

The commands run once per module (one tmux server, a handful of demo agents), in order, through `drover.ops.run`
and through the CLI's `--json`; each answer is masked (see `mask`: only what must differ between runs) and compared
with tests/golden/NAME.json.  To record the goldens again on purpose (a deliberate change of a document), run this
file with DROVER_GOLDEN_WRITE=1 and review the diff of tests/golden/ like any other change.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from drover.ops import Context, run
from tests.conftest import Tmux, wait_for

GOLDEN = Path(__file__).resolve().parent / "golden"
ACTOR = "golden"
FLEET = """\
[defaults]
connect_timeout = 5
request_timeout = 30

[hosts.local]
owner_relay = true
tags = ["here"]

# Nothing listens on port 1 of the loopback: every connection is refused at once, so a document that names an SSH
# host that cannot be reached is as stable as one that names a live pane.
[hosts.gone]
ssh = "127.0.0.1"
port = 1
user = "nobody"
tags = ["there"]
"""

# -- masking ------------------------------------------------------------------------------------------------------
# Only what must differ between two runs of the same commands, each by its own shape: never a pattern that could
# hide a change of a document's structure or words.
MESSAGE_ID = re.compile(r"\bmsg_[0-9a-f]{22}\b")  # drover/truth.py new_message_id: 12 hex of ms + 10 random
BROADCAST_ID = re.compile(r"\bbc_[0-9a-f]{18}\b")  # drover/ops/broadcast.py new_broadcast_id
UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")  # receiver_msg_id
ISO_TIME = re.compile(r"\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)?")
# JSON members whose value is a clock reading, a process id or a duration (a number, or null when unknown).
VARYING_KEYS = (
    *("ts", "t", "since", "status_since", "last_activity", "first_seen", "pid", "engine_pid", "elapsed_s"),
    *("last_progress", "process", "no_progress_for", "last_seen"),
)
VARYING = re.compile(r'"(' + "|".join(VARYING_KEYS) + r')": ?-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?')
# A tmux session's identity ends in its pane's process id: tmux:SERVER/%PANE@PID.
IDENTITY_PID = re.compile(r"(\btmux:[\w.-]+/%\d+)@\d+\b")
# How long ago something was, in words (a duplicate's "went to this session ... 1s ago").
AGO = re.compile(r"\b\d+(?:\.\d+)?s ago\b")
# A pane's title is the machine's name unless a program sets one.
TITLE = f'"title": "{socket.gethostname()}"'
# The demo agents run as this interpreter, whose name tmux reports as the pane's command.
COMMAND = f'"command": "{Path(sys.executable).name}"'


def mask(text: str, places: dict[str, str]) -> str:
    """`text` with the run's own values named instead: its temporary directories (`places`: path -> name), message,
    broadcast and receiver ids, clock times, the values of VARYING_KEYS, the process id in a tmux identity, an "Ns
    ago", a pane title that is the machine's name, and the demo agents' command (this interpreter's name).  Pane
    ids (%0, %1, ...) are not masked: a fresh tmux server numbers its panes in the order they are made."""
    for path, name in sorted(places.items(), key=lambda p: -len(p[0])):  # the longest first: nested directories
        text = text.replace(path, name)
    text = MESSAGE_ID.sub("msg_<id>", text)
    text = BROADCAST_ID.sub("bc_<id>", text)
    text = UUID.sub("<uuid>", text)
    text = ISO_TIME.sub("<time>", text)
    text = IDENTITY_PID.sub(r"\1@<pid>", text)
    text = AGO.sub("<n>s ago", text)
    text = text.replace(TITLE, '"title": "<hostname>"')
    text = VARYING.sub(lambda m: f'"{m.group(1)}": "<{m.group(1)}>"', text)
    return text.replace(COMMAND, '"command": "<python>"')


# -- the recorded commands ----------------------------------------------------------------------------------------


class Recorder:
    """Runs the commands in order; each document is kept, masked, under its name."""

    def __init__(self, places: dict[str, str]) -> None:
        self.places = places
        self.documents: dict[str, str] = {}

    def op(self, name: str, verb: str, payload: dict[str, Any] | str) -> dict[str, Any]:
        doc = run(verb, payload, Context())
        text = doc.to_json() + f"\n// exit {doc.exit_code}\n"
        self.documents[name] = mask(text, self.places)
        return doc.to_dict()

    def send(self, name: str, **payload: Any) -> dict[str, Any]:
        return self.op(name, "sessions.message", {"actor": ACTOR, **payload})

    def cli(self, name: str, *args: str) -> dict[str, Any]:
        from drover.cli.main import main

        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            code = main([*args, "--json"])
        self.documents[name] = mask(out.getvalue() + f"// exit {code}\n", self.places)
        return dict(json.loads(out.getvalue()))


def _record(tmux: Tmux, places: dict[str, str]) -> dict[str, str]:
    agent = tmux.agent("agent-a")
    bc1, bc2 = tmux.agent("bc-1"), tmux.agent("bc-2")
    asking = tmux.agent("asking")
    drafting = tmux.agent("drafting")
    os.kill(asking.pid, signal.SIGUSR1)
    wait_for(lambda: "Do you want to proceed?" in asking.screen(), what="the dialog on screen")
    drafting.tmux("send-keys", "-t", drafting.id, "-l", "half a thought")
    wait_for(lambda: "half a thought" in drafting.screen(), what="the draft on screen")

    r = Recorder(places)
    r.op("op-sessions.list", "sessions.list", {"hosts": ["local"]})
    sent = r.send("op-sessions.message-delivered", id="agent-a", text="rebase on main")
    assert sent["data"]["outcome"] == "delivered", sent
    wait_for(agent.messages, what="the message in agent-a")
    agent.wait_idle()
    r.send("op-sessions.message-unknown-session", id="nobody-here", text="hello")
    refused = r.send("op-sessions.message-dialog", id="asking", text="hello")
    r.send("op-sessions.message-draft", id="drafting", text="hello")
    r.send("op-sessions.message-unknown-host", host="nowhere", id="agent-a", text="x")
    unreachable = r.send("op-sessions.message-unreachable", host="gone", id="agent-a", text="x")
    r.send("op-sessions.message-as-owner", id="agent-a", text="mine", as_owner=True)
    agent.wait_idle()
    r.send("op-sessions.message-duplicate", id="agent-a", text="rebase on main")
    r.send("op-sessions.message-invalid", id="agent-a", txt="misspelt")
    r.send("op-sessions.message-empty", id="agent-a", text="  ")
    r.op("op-sessions.status", "sessions.status", {"id": "agent-a", "tail": 4})
    r.op("op-sessions.read", "sessions.read", {"id": "agent-a"})
    r.op("op-bad-json", "sessions.list", "{not json")
    r.op("op-unknown-op", "sessions.nothing", {})
    # Before any broadcast: the sends so far were made one after the other, so the record's order is theirs.
    r.op("op-messages.list", "messages.list", {"limit": 50})
    r.op("op-messages.verify-ids", "messages.verify", {"ids": [refused["data"]["id"]]})
    r.op("op-messages.retry-busy", "messages.retry", {"id": refused["data"]["id"]})
    r.op("op-messages.retry-unresolved", "messages.retry", {"id": unreachable["data"]["id"]})
    two = {"hosts": ["local"], "name": "bc-*", "text": "standup in 5", "actor": ACTOR}
    cast = r.op("op-sessions.broadcast", "sessions.broadcast", two)
    assert cast["data"]["counts"] == {"delivered": 2}, cast
    wait_for(lambda: bc1.messages() and bc2.messages(), what="the broadcast in both panes")
    for pane in (agent, bc1, bc2):
        pane.wait_idle()
    r.op("op-sessions.broadcast-skips", "sessions.broadcast", {"name": "[ad]*", "text": "x", "actor": ACTOR})
    r.op("op-board", "board", {"hosts": ["local"]})
    r.op("op-fleet.show", "fleet.show", {})
    r.op("op-messages.verify", "messages.verify", {})
    r.op("op-sessions.handoff", "sessions.handoff", {"id": "bc-1", "to": "bc-2", "note": "golden", "actor": ACTOR})
    r.op("op-sessions.chain", "sessions.chain", {"id": "bc-1"})

    r.cli("cli-ls", "ls", "--host", "local")
    sent = r.cli("cli-send", "--actor", ACTOR, "send", "local:bc-1", "from the command line")
    assert sent["data"]["outcome"] == "delivered", sent
    wait_for(lambda: len(bc1.messages()) == 2, what="the second message in bc-1")
    bc1.wait_idle()
    r.cli("cli-send-refused", "--actor", ACTOR, "send", "local:asking", "from the command line")
    r.cli("cli-status", "status", "local:bc-1", "--tail", "3")
    r.cli("cli-read", "read", "local:bc-1")
    r.cli("cli-log", "log", "--target", "local:bc-1")  # the broadcasts' sends were addressed to pins, at once
    r.cli("cli-fleet-show", "fleet", "show")
    return r.documents


@pytest.fixture(scope="module")
def documents() -> Iterator[dict[str, str]]:
    """The recorded commands' documents, masked: one tmux server and its demo agents for the whole module."""
    if not shutil.which("tmux"):
        pytest.fail("tmux is not installed: the README's test command installs it (apt-get install tmux)")
    tmp = Path(tempfile.mkdtemp(prefix="drg-"))
    tmux_dir = tempfile.mkdtemp(prefix="drt-")  # short: a tmux socket path must fit in 108 bytes
    fleet = tmp / "fleet.toml"
    fleet.write_text(FLEET, encoding="utf-8")
    places = {str(tmp): "<tmp>", tmux_dir: "<tmux>", os.environ.get("HOME", "~"): "<home>"}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DROVER_HOME", str(tmp / "home"))
        mp.setenv("XDG_CONFIG_HOME", str(tmp / "config"))
        mp.setenv("TMUX_TMPDIR", tmux_dir)
        mp.setenv("DROVER_FLEET", str(fleet))
        mp.setenv("DROVER_DAEMON", "0")
        mp.setenv("HOME", str(tmp))  # no ~/.ssh/config of the user's reaches the SSH host
        mp.setenv("COLUMNS", "200")
        for var in ("DROVER_ACTOR", "TMUX", "TMUX_PANE", "SSH_AUTH_SOCK"):
            mp.delenv(var, raising=False)
        try:
            yield _record(Tmux(tmp), places)
        finally:
            sockdir = Path(tmux_dir) / f"tmux-{os.getuid()}"
            for sock in sockdir.iterdir() if sockdir.exists() else ():
                subprocess.run(["tmux", "-S", str(sock), "kill-server"], capture_output=True, timeout=10)
            shutil.rmtree(tmux_dir, ignore_errors=True)
            shutil.rmtree(tmp, ignore_errors=True)


NAMES = sorted(p.stem for p in GOLDEN.glob("*.json")) if GOLDEN.is_dir() else []


def test_every_recorded_command_has_its_golden(documents: dict[str, str]) -> None:
    if os.environ.get("DROVER_GOLDEN_WRITE") == "1":
        GOLDEN.mkdir(exist_ok=True)
        for old in GOLDEN.glob("*.json"):
            old.unlink()
        for name, text in documents.items():
            (GOLDEN / f"{name}.json").write_text(text, encoding="utf-8")
    assert sorted(documents) == sorted(p.stem for p in GOLDEN.glob("*.json"))


@pytest.mark.parametrize("name", NAMES)
def test_document_is_golden(documents: dict[str, str], name: str) -> None:
    expected = (GOLDEN / f"{name}.json").read_text(encoding="utf-8")
    assert documents[name] == expected


def test_mask_hides_only_what_varies() -> None:
    """The masking is narrow: ids, times, pids and the run's own directories go; words, codes and shape stay."""
    places = {"/tmp/drg-abc": "<tmp>"}
    text = (
        '{"id": "msg_0192f3a4b5c6d7e8f9a0b1", "broadcast": "bc_0192f3a4b5c6a1b2c3", "ts": 1733.25, "pid": 4242,'
        ' "time": "2026-12-01T18:11:44.120Z", "receiver_msg_id": "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0",'
        ' "path": "/tmp/drg-abc/agent-1.jsonl", "outcome": "delivered", "pane": "%3", "tail": 8, "code": "msg_x",'
        ' "identity": "tmux:default/%3@977", "detail": "sent 12s ago, 3 s later", "title": "' + socket.gethostname() + '",'
        ' "command": "' + Path(sys.executable).name + '", "name": "' + Path(sys.executable).name + '"}'
    )
    assert mask(text, places) == (
        '{"id": "msg_<id>", "broadcast": "bc_<id>", "ts": "<ts>", "pid": "<pid>",'
        ' "time": "<time>", "receiver_msg_id": "<uuid>",'
        ' "path": "<tmp>/agent-1.jsonl", "outcome": "delivered", "pane": "%3", "tail": 8, "code": "msg_x",'
        ' "identity": "tmux:default/%3@<pid>", "detail": "sent <n>s ago, 3 s later", "title": "<hostname>",'
        ' "command": "<python>", "name": "' + Path(sys.executable).name + '"}'
    )
