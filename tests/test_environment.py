"""The CLI runs against the Environment it is handed (drover/environment.py): every byte it prints -- tables, JSON,
errors, usage errors, --help, --version -- goes to that Environment's streams, its stdin is the only one read, its
terminal facts (isatty, width) are the only ones used, and its Context maker builds the Context.  Nothing goes
through the process's sys.stdout/stderr/stdin: the daemon runs several invocations at once, one thread each, each
with its own caller's Environment."""

from __future__ import annotations

import io
import json
import re
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from drover.environment import Environment
from tests.conftest import CliResult

ANSI = re.compile("\x1b\\[[0-9;]*m")
MSG_ID = re.compile("msg_[0-9a-f]+")


def width(text: str) -> int:
    return max(len(ANSI.sub("", line)) for line in text.splitlines())


def same_but_ids(res: CliResult) -> CliResult:
    """A result with its message ids masked: each send records a message of its own."""
    return CliResult(res.code, MSG_ID.sub("msg_ID", res.out), MSG_ID.sub("msg_ID", res.err))


class Forbidden(io.TextIOBase):
    """A process stream the CLI must not touch."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.touched: list[str] = []

    def write(self, text: str) -> int:
        self.touched.append(text)
        return len(text)

    def read(self, size: int | None = -1) -> str:
        self.touched.append("<read>")
        return ""

    def isatty(self) -> bool:
        self.touched.append("<isatty>")
        return False


class Terminal(io.StringIO):
    """A stream that says it is a terminal (as the daemon's per-request streams say for a caller's terminal)."""

    def isatty(self) -> bool:
        return True


def forbid(monkeypatch: pytest.MonkeyPatch) -> Callable[[], list[str]]:
    """Replace the process's streams with ones that note every use; returns what was done to them."""
    streams = {name: Forbidden(name) for name in ("stdin", "stdout", "stderr")}
    for name, stream in streams.items():
        monkeypatch.setattr(sys, name, stream)
    return lambda: [f"{s.name}: {t!r}" for s in streams.values() for t in s.touched]


@pytest.fixture
def no_process_streams(monkeypatch: pytest.MonkeyPatch) -> Callable[[], list[str]]:
    return forbid(monkeypatch)


def run(*argv: str, stdin: str | None = None, tty: bool = False, columns: int | None = None, **kw: Any) -> CliResult:
    from drover.cli.main import main

    make = Terminal if tty else io.StringIO
    out, err = make(), make()
    env = Environment(stdin=io.StringIO(stdin) if stdin is not None else None, stdout=out, stderr=err, columns=columns, **kw)
    code = main(list(argv), env)
    return CliResult(code, out.getvalue(), err.getvalue())


CASES = [
    ("--help",),
    ("--version",),
    ("ls", "--help"),
    ("fleet", "add", "-h"),
    ("send",),  # a usage error
    ("no-such-command",),
    ("fleet",),  # a group without its command: its help, as a usage error
    ("log",),
    ("log", "--json"),
    ("send", "nosuch", "hi"),  # an unknown session: an error line
    ("send", "nosuch", "hi", "--json"),
    ("op", "sessions.list", "{"),  # malformed JSON
    ("fleet", "show"),
    ("fleet", "show", "--json"),
    ("op", "--list"),
]


@pytest.mark.parametrize("argv", CASES, ids=" ".join)
def test_a_handed_environment_gets_exactly_what_a_direct_run_prints(
    argv: tuple[str, ...], cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    direct = cli(*argv)  # on the process's streams, as pytest captures them
    touched = forbid(monkeypatch)
    handed = run(*argv)
    assert touched() == []
    assert same_but_ids(handed) == same_but_ids(direct)
    assert direct.out or direct.err


def test_stdin_is_the_environments(no_process_streams: Callable[[], list[str]], isolated: Path) -> None:
    res = run("op", "sessions.list", "-", "--json", stdin='{"hosts": ["nosuch"]}')
    assert res.code != 0 and res.json()["errors"][0]["code"] == "unknown_host", res
    res = run("send", "nosuch", "-", stdin="from stdin")
    assert res.code == 6, res
    assert run("log", "--json").json()["data"]["messages"][0]["text"] == "from stdin"
    closed = run("send", "nosuch", "-")  # the environment has no stdin: closed, whatever the process has
    assert closed.code == 2 and "stdin is closed" in closed.err, closed
    assert no_process_streams() == []


def test_the_environments_terminal_decides_the_layout(no_process_streams: Callable[[], list[str]]) -> None:
    # JSON is indented for a terminal, one line for a pipe: the environment's, not the process's.
    assert run("log", "--json", tty=True).out.startswith('{\n  "drover": 1')
    assert run("log", "--json").out.startswith('{"drover": 1')
    # --help is formatted to the caller's width (click: between 50 and 78 columns).
    narrow = run("ls", "--help", columns=60, tty=True).out
    wide = run("ls", "--help", columns=120, tty=True).out
    assert width(narrow) <= 58 < width(wide) <= 78
    # rich tables take the terminal's width; a pipe gets 200 columns
    table = run("fleet", "show", columns=40, tty=True).out
    assert width(table) <= 40, table
    assert width(run("fleet", "show").out) > 40
    assert no_process_streams() == []


def test_the_environments_colour_variables_are_the_ones_read(no_process_streams: Callable[[], list[str]]) -> None:
    coloured = run("send", "nosuch", "hi", tty=True, term={"TERM": "xterm-256color"})
    plain = run("send", "nosuch", "hi", tty=True, term={"TERM": "xterm-256color", "NO_COLOR": "1"})
    # NO_COLOR takes the colours away (rich keeps bold and dim): red is 31
    assert "31m" in coloured.err and "31m" not in plain.err and "\x1b[" in plain.err, (coloured, plain)
    assert no_process_streams() == []


def test_the_environment_builds_the_context(isolated: Path) -> None:
    from drover.ops import Context

    made: list[dict[str, Any]] = []

    def make(**kw: Any) -> Context:
        made.append(kw)
        return Context(fleet_path=kw.get("fleet_path"), actor="handed-actor")

    res = run("send", "nosuch", "hi", "--actor", "typed", make_context=make)
    assert res.code == 6 and made and made[0]["actor"] == "typed", made
    assert run("log", "--json").json()["data"]["messages"][0]["actor"] == "handed-actor"


def test_invocations_in_threads_each_print_to_their_own_environment(no_process_streams: Callable[[], list[str]]) -> None:
    """What the daemon does: several invocations at once, each with its caller's streams and terminal."""
    results: dict[int, CliResult] = {}
    ready = threading.Barrier(4)

    def one(i: int) -> None:
        ready.wait()
        argv = ("ls", "--help") if i % 2 else ("send", "nosuch", f"text {i}", "--json")
        results[i] = run(*argv, columns=60 + 10 * i, tty=True)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == [0, 1, 2, 3]
    for i, res in results.items():
        if i % 2:
            assert res.out.startswith("Usage: drover ls") and res.err == ""
            assert width(res.out) <= min(60 + 10 * i, 80) - 2
        else:
            doc = json.loads(res.out)
            assert doc["errors"][0]["code"] == "session_not_found" and doc["data"]["target"] == "nosuch", res
            assert res.out.startswith('{\n  "drover": 1') and res.err == "", res
    assert no_process_streams() == []


def test_the_environment_ends_with_its_invocation(capsys: pytest.CaptureFixture[str]) -> None:
    """A renderer called after a run (a test, a script) prints on the process's streams of that moment, not on the
    streams the finished run was handed."""
    from drover.cli import render

    handed = run("--version")
    assert handed.out.startswith("drover ")
    capsys.readouterr()
    render.error_list([{"code": "x", "message": "after the run"}])
    assert capsys.readouterr().err == "drover: after the run\n"
