"""The JSON contract scripts rely on, pinned: the op document, the ops and their fields, exit codes."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import drover
from drover.errors import ExitCode
from tests.conftest import ROOT, Tmux, drover_process

DOCUMENT_KEYS = ["drover", "op", "ok", "data", "errors"]

OPS = {
    "board": ["hosts", "tags", "held_since"],
    "bots.pass_on": ["chat", "host", "id", "note", "actor"],
    "events.read": ["since", "limit", "kinds", "wait_s"],
    "files.wait": ["host", "path", "changed", "timeout_s", "baseline", "poll"],
    "fleet.add": [
        "name",
        "ssh",
        "user",
        "port",
        "identity",
        "proxy_jump",
        "python",
        "tags",
        "known_hosts",
        "accept_new",
        "owner_relay",
        "connect_timeout",
        "request_timeout",
        "replace",
    ],
    "fleet.check": ["hosts", "tags"],
    "fleet.init": ["force", "print_only"],
    "fleet.remove": ["name"],
    "fleet.show": [],
    "guard.check": ["engine", "screen"],
    "messages.get": ["id"],
    "messages.retry": ["id"],
    "messages.verify": ["ids", "limit"],
    "messages.list": ["target", "host", "hosts", "actor", "outcome", "since", "pending", "limit", "text"],
    "nudge.run": ["dry_run", "entries", "lock_wait_s"],
    "watch.run": ["hosts", "actor", "lock_wait_s"],
    "sessions.broadcast": ["text", "hosts", "tags", "engine", "name", "cwd", "all", "actor", "via"],
    "sessions.done": ["summary", "evidence", "failed", "to", "session", "actor"],
    "sessions.chain": ["host", "id"],
    "sessions.handoff": ["host", "id", "to", "to_host", "note", "actor"],
    "sessions.list": ["hosts", "tags", "engine", "state"],
    "sessions.message": ["host", "id", "text", "actor", "via", "expect_engine", "as_owner", "raw"],
    "sessions.nudge": ["host", "id", "text", "actor", "via", "create_if_missing", "engine", "cwd", "name"],
    "sessions.read": ["host", "id", "last", "roles", "grep", "since", "raw"],
    "sessions.spawn": ["host", "engine", "cwd", "name", "brief", "actor", "parent_msg", "args", "headless", "resume"],
    "sessions.spawns": ["host", "parent", "target", "limit", "live"],
    "sessions.status": ["host", "id", "tail"],
    "sessions.wait": ["host", "id", "until", "timeout_s"],
    "sessions.wait_many": ["targets", "mode", "until", "timeout_s", "stall_after_s"],
}


def test_op_list_pins_ops_and_fields(cli: Any) -> None:
    res = cli("op", "--list", "--json")
    assert res.code == 0
    ops = {spec["op"]: [f["name"] for f in spec["fields"]] for spec in res.json()["ops"]}
    assert ops == OPS
    human = cli("op", "--list")
    assert "sessions.message" in human.out and "(drover send)" in human.out
    assert "(drover fleet add)" in human.out


def test_document_shape_on_success_and_failure(tmux: Tmux, cli: Any) -> None:
    pane = tmux.agent("contract")
    ok = cli("op", "sessions.message", f'{{"id": "{pane.id}", "text": "pinned"}}')
    doc = ok.json()
    assert list(doc) == DOCUMENT_KEYS
    assert doc["drover"] == 1 and doc["op"] == "sessions.message" and doc["ok"] is True and doc["errors"] == []
    for key in ("id", "host", "target", "actor", "outcome", "lane", "detail", "session"):
        assert key in doc["data"], key
    assert doc["data"]["id"].startswith("msg_")
    bad = cli("op", "sessions.status", '{"id": "nope"}').json()
    assert list(bad) == DOCUMENT_KEYS
    assert bad["ok"] is False and bad["data"] is None
    assert set(bad["errors"][0]) >= {"code", "message", "host"} and bad["errors"][0]["code"] == "session_not_found"


def test_op_reads_the_request_from_stdin(tmux: Tmux, cli: Any) -> None:
    tmux.agent("piped")
    res = cli("op", "sessions.status", "-", stdin='{"id": "piped"}')
    assert res.code == 0 and res.json()["data"]["session"]["name"] == "piped"


def test_library_returns_the_same_document(tmux: Tmux) -> None:
    tmux.agent("lib")
    doc = drover.run("sessions.list", {"engine": "demo"})
    assert doc.ok and doc.exit_code == 0
    assert [s["name"] for s in doc.data["sessions"]] == ["lib"]
    assert list(doc.to_dict()) == DOCUMENT_KEYS


def test_exit_codes_are_documented_in_help(cli: Any) -> None:
    res = cli("--help")
    assert res.code == 0
    text = " ".join(res.out.split())
    for code in ExitCode:
        assert f"{int(code)} " in text, f"exit code {int(code)} is not documented in --help"
    table = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    for code in ExitCode:
        assert f"| {int(code)} |" in table, f"exit code {int(code)} is not in docs/cli.md's table"


def test_help_and_local_work_do_not_import_asyncssh() -> None:
    code = (
        "import sys; from drover.cli.main import main; "
        "rc = main(['--help']); rc = main(['ls', '--json']); "
        "print('asyncssh' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT), timeout=60)
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_help_loads_neither_the_ops_nor_pydantic() -> None:
    code = (
        "import sys; from drover.cli.main import main; main(['--help']); "
        "print(sorted(m for m in ('drover.ops', 'pydantic') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT), timeout=60)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_version_and_module_entry() -> None:
    res = drover_process("--version")
    assert res.code == 0 and res.out.strip() == f"drover {drover.__version__}"
