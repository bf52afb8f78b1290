"""Bad input gets one readable line, its documented exit code, an honest record, and no pane is touched."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Pane, Tmux, drover_process, wait_for
from tests.test_daemon import persistent, running, status  # noqa: F401 - persistent is a fixture


@pytest.fixture
def agent(tmux: Tmux) -> Pane:
    return tmux.agent("target")


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got: {err!r}"
    assert "Traceback" not in err
    assert lines[0].startswith("drover: ")
    return lines[0]


def untouched(pane: Pane) -> None:
    assert pane.messages() == [] and pane.events("key") == [] and pane.events("dialog_input") == []


def test_malformed_op_json(cli: Any, agent: Pane) -> None:
    res = cli("op", "sessions.message", '{"host": "local", "id": ')
    assert res.code == 2
    assert "not valid JSON" in one_line(res.err)
    doc = res.json()
    assert doc["ok"] is False and doc["errors"][0]["code"] == "bad_json"
    untouched(agent)


def test_request_that_is_not_an_object_or_has_unknown_fields(cli: Any, agent: Pane) -> None:
    res = cli("op", "sessions.message", "[1, 2]")
    assert res.code == 2 and "must be a JSON object" in one_line(res.err)
    res = cli("op", "sessions.message", '{"id": "target", "txt": "typo"}')
    assert res.code == 2
    line = one_line(res.err)
    assert "txt: unknown field" in line and "text: Field required" in line
    untouched(agent)


def test_unknown_op(cli: Any) -> None:
    res = cli("op", "sessions.mesage", "{}")
    assert res.code == 2
    assert "unknown op 'sessions.mesage'" in one_line(res.err)
    assert res.json()["errors"][0]["code"] == "unknown_op"


def test_unknown_host(cli: Any, agent: Pane, isolated: Path) -> None:
    res = cli("op", "sessions.message", '{"host": "box-z", "id": "target", "text": "hi"}')
    assert res.code == 6
    assert "unknown host 'box-z'" in one_line(res.err)
    untouched(agent)
    log = cli("log", "--json").json()["data"]["messages"]
    assert [(m["host"], m["outcome"], m["code"]) for m in log] == [("box-z", "failed", "unknown_host")]


def test_unknown_session_lists_what_is_there(cli: Any, agent: Pane) -> None:
    res = cli("send", "local:nosuch", "hi")
    assert res.code == 6
    line = one_line(res.err)
    assert "no session 'nosuch'" in line and "target" in line
    untouched(agent)


def test_ambiguous_session_lists_candidates(cli: Any, tmux: Tmux) -> None:
    a = tmux.agent("dup")
    b = tmux.agent("dup", "other")  # the same name on a second tmux server
    res = cli("send", "dup", "hi", "--json")
    assert res.code == 6
    data = res.json()["data"]
    assert data["outcome"] == "failed" and data["code"] == "ambiguous_session"
    assert sorted(c["id"] for c in data["candidates"]) == sorted([a.id, b.id])
    human = cli("send", "dup", "hi")
    assert human.code == 6 and "matches" not in human.out
    assert "matches 2 sessions" in human.err and "candidate:" in human.err
    untouched(a)
    untouched(b)


def test_empty_text(cli: Any, agent: Pane) -> None:
    for text in ("", "   \n\t"):
        res = cli("send", "target", text)
        assert res.code == 2
        assert "the message text is empty" in one_line(res.err)
    res = cli("send", "target", "-", stdin="")
    assert res.code == 2
    untouched(agent)
    assert cli("log", "--json").json()["data"]["messages"] == []


def test_text_over_the_size_limit_is_refused_and_recorded(agent: Pane) -> None:
    text = "x" * (1_048_576 + 1)
    res = drover_process("send", agent.address, "-", "--json", stdin=text)
    assert res.code == 4, res.err
    data = res.json()["data"]
    assert data["outcome"] == "refused" and data["code"] == "too_large"
    assert "1,048,577 characters" in data["detail"]
    untouched(agent)
    log = drover_process("log", "--json").json()["data"]["messages"]
    assert log[0]["outcome"] == "refused" and log[0]["text_chars"] == 1_048_577


def test_invalid_fleet_file(cli: Any, agent: Pane, isolated: Path) -> None:
    fleet = isolated / "fleet.toml"
    fleet.write_text('[hosts.box-a]\nssh = "a.example"\nport = "twenty-two"\nprot = 22\n', encoding="utf-8")
    res = cli("--fleet", str(fleet), "send", "target", "hi")
    assert res.code == 7
    lines = [line for line in res.err.splitlines() if line.strip()]
    assert "fleet.toml:3: hosts.box-a.port" in lines[0]
    assert any("fleet.toml:4: hosts.box-a.prot: unknown key" in line for line in lines)
    assert "Traceback" not in res.err
    untouched(agent)
    fleet.write_text("[hosts\n", encoding="utf-8")
    res = cli("--fleet", str(fleet), "ls")
    assert res.code == 7 and "not valid TOML" in one_line(res.err)
    res = cli("--fleet", str(isolated / "missing.toml"), "ls")
    assert res.code == 7 and "does not exist" in one_line(res.err)


def test_bad_cli_arguments_are_usage_errors(cli: Any) -> None:
    res = cli("send")
    assert res.code == 2 and "Missing argument" in one_line(res.err)
    res = cli("frobnicate")
    assert res.code == 2 and "No such command" in one_line(res.err)


def test_separate_process_errors_have_no_traceback(agent: Pane) -> None:
    res = drover_process("op", "sessions.message", "{not json")
    assert res.code == 2
    assert one_line(res.err)
    assert json.loads(res.out)["errors"][0]["code"] == "bad_json"
    untouched(agent)


SESSION_ID_OPS = [
    ("sessions.message", {"host": "local", "text": "hi"}),
    ("sessions.status", {"host": "h1"}),
    ("sessions.wait", {"host": "local", "timeout_s": 1}),
    ("sessions.read", {"host": "local"}),
]


@pytest.mark.parametrize("empty", ["", "   ", "\t\n"])
@pytest.mark.parametrize(("name", "request_"), SESSION_ID_OPS)
def test_an_empty_session_id_through_op_is_a_usage_error(cli: Any, name: str, request_: dict[str, Any], empty: str) -> None:
    res = cli("op", name, json.dumps({**request_, "id": empty}))
    assert res.code == 2, res.err
    doc = res.json()
    assert doc["ok"] is False and doc["errors"][0]["code"] == "invalid_request"
    assert "id: the session is empty" in one_line(res.err)
    assert cli("log", "--json").json()["data"]["messages"] == []  # nothing recorded


@pytest.mark.parametrize("name", ["messages.get", "messages.retry"])
def test_an_empty_message_id_through_op_is_a_usage_error(cli: Any, name: str) -> None:
    res = cli("op", name, '{"id": " "}')
    assert res.code == 2 and "id: the message id is empty" in one_line(res.err)


def test_every_error_code_drover_raises_is_in_the_protocol_table() -> None:
    import drover.cli.main
    import drover.targets  # noqa: F401
    from drover import errors
    from drover.remote import protocol as P

    seen, todo = [], [errors.DroverError]
    while todo:
        cls = todo.pop()
        seen.append(cls)
        todo.extend(cls.__subclasses__())
    for cls in seen[1:]:
        assert cls.code in P.CODES, cls
        assert cls.exit_code == errors.exit_code_of(cls.code), cls


def test_text_from_a_closed_stdin_is_a_usage_error_not_a_crash() -> None:
    """`drover send HOST:ID - <&-`: stdin is closed, so Python has no sys.stdin at all."""
    import os
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "drover", "send", "local:nobody", "-"],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: os.close(0),  # the point: a child whose fd 0 is closed
        env={**os.environ, "DROVER_DAEMON": "0"},
    )
    assert proc.returncode == 2, proc.stderr
    assert "stdin is closed" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "request_",
    [
        '{"host": "local", "id": "target", "text": "a lone \\ud800 surrogate"}',
        '{"host": "local", "id": "target", "text": "a low \\udc00 one"}',
        '{"host": "local", "id": "tar\\udfffget", "text": "in the id"}',
        '{"host": "local", "id": "target", "text": "hi", "via": "auto", "\\ud800": 1}',
    ],
)
def test_a_lone_surrogate_in_op_json_is_refused_before_anything_is_recorded(cli: Any, agent: Pane, request_: str) -> None:
    """JSON's \\ud800 escape decodes to no text: it was recorded, then crashed the helper (helper_crash, exit 5)."""
    res = cli("op", "sessions.message", request_)
    assert res.code == 2, res.out
    line = one_line(res.err)
    assert "lone surrogate" in line and ("at request." in line or "at a key of request" in line), line
    assert res.json()["errors"][0]["code"] == "bad_json"
    assert cli("log", "--json").json()["data"]["messages"] == []
    untouched(agent)
    # a pair of surrogate escapes is one character: text like any other
    ok = cli("op", "sessions.message", '{"host": "local", "id": "target", "text": "paired \\ud83d\\ude00"}')
    assert ok.code == 0, ok.out


@pytest.mark.parametrize("daemon", [False, True])
def test_an_integer_too_long_for_python_in_op_json_is_a_usage_error(
    agent: Pane, daemon: bool, request: pytest.FixtureRequest
) -> None:
    """Python refuses to read an integer of more than 4300 digits (ValueError, not a JSONDecodeError): it was an
    internal error (exit 1), directly and through the daemon.  It is invalid input like any other: bad_json."""
    if daemon:
        request.getfixturevalue("persistent")
        started = drover_process("ls", "--json", timeout=60)  # the first use starts the daemon
        assert started.code == 0, started
        served = running()["served"]
    huge = '{"host": "local", "id": "target", "last": 1' + "0" * 5000 + "}"
    for args, stdin in (
        (("op", "sessions.read", "-"), huge),
        (("op", "sessions.message", huge.replace('"last"', '"text": "x", "n"')), None),
    ):
        res = drover_process(*args, stdin=stdin)
        assert res.code == 2, res
        line = one_line(res.err)
        assert "4300 digits" in line and "internal error" not in line, line
        assert json.loads(res.out)["errors"][0]["code"] == "bad_json"
    if daemon:
        assert status()["served"] == served + 2  # the daemon answered both
    assert drover_process("log", "--json").json()["data"]["messages"] == []
    untouched(agent)


def test_an_ambiguity_across_tmux_servers_names_a_target_that_works(cli: Any, tmux: Tmux) -> None:
    """worker-1 as %0 on two tmux servers: `%0` and session:window.pane are as ambiguous as the name, so the
    hint and the message name SERVER/%0, and following the hint delivers to that one session."""
    a = tmux.agent("twin")
    b = tmux.agent("twin", "other")
    hinted = []
    for argv in (("send", "local:twin", "hi"), ("status", "local:twin"), ("send", f"local:{a.id}", "hi")):
        res = cli(*argv)
        assert res.code == 6, res.out + res.err
        assert f"default/{a.id} (twin" in res.err and f"other/{b.id} (twin" in res.err, res.err
        hinted += re.findall(r"name one with its server, e\.g\. ([^\s)]+)", res.err)
    assert len(hinted) == 3, hinted
    assert cli("send", hinted[0], "follow the hint").code == 0
    wait_for(lambda: a.messages() or b.messages(), what="the message")
    assert len(a.messages() + b.messages()) == 1


def test_a_candidate_without_a_pane_is_shown_by_its_id_alone(capsys: pytest.CaptureFixture[str]) -> None:
    from drover.cli import render

    candidates = [{"id": "abcdef99-0000", "server": None, "name": None}]
    render.outcome(
        {"outcome": "failed", "host": "local", "target": "abcdef99", "detail": "ambiguous", "id": "m1", "candidates": candidates}
    )
    err = capsys.readouterr().err
    assert "candidate: abcdef99-0000" in err and "None" not in err, err
