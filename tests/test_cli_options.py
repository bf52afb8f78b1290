"""The CLI as typed: options where users put them, targets parsed one way, bad input as a usage error, completion."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import ROOT, Tmux, drover_process, wait_for


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got: {err!r}"
    assert "Traceback" not in err and lines[0].startswith("drover: ")
    return lines[0]


def actors(cli: Any) -> list[tuple[str, str]]:
    return [(m["actor"], m["text"]) for m in cli("log", "--json").json()["data"]["messages"]]


def test_actor_goes_before_or_after_the_command(cli: Any, tmux: Tmux) -> None:
    pane = tmux.agent("opts")
    assert cli("send", "opts", "one", "--actor", "alice").code == 0
    assert cli("--actor", "bob", "send", "opts", "two").code == 0
    assert cli("--actor", "bob", "send", "local:opts", "three", "--actor", "carol").code == 0  # the later one wins
    assert cli("send", "--actor", "dave", "opts", "four").code == 0
    assert actors(cli) == [("alice", "one"), ("bob", "two"), ("carol", "three"), ("dave", "four")]
    wait_for(lambda: len(pane.messages()) == 4, what="four messages")
    assert 'from-name="drover (carol)"' in pane.messages()[2]


def test_a_text_that_starts_with_dashes_goes_after_double_dash(cli: Any, tmux: Tmux) -> None:
    pane = tmux.agent("dashes")
    res = cli("send", "dashes", "--actor", "erin", "--", "--force-push is fine now")
    assert res.code == 0, res.err
    wait_for(pane.messages, what="the message")
    assert pane.messages()[0].split("\n")[1] == "--force-push is fine now"
    # after --, an option's name is text too: "--actor" is the message here, not an option
    res = cli("send", "dashes", "--", "--actor")
    assert res.code == 0, res.err
    (first_actor, first), (second_actor, second) = actors(cli)
    assert (first_actor, first) == ("erin", "--force-push is fine now")
    assert second == "--actor" and second_actor != "erin"
    # Without --, such a text is an unknown option: the error says how to give it (a misspelt option does not).
    res = cli("send", "dashes", "--force Q7")
    assert res.code == 2 and "No such option: --force Q7" in res.err and "drover send HOST:ID -- '--force Q7'" in res.err
    res = cli("send", "dashes", "x", "--jsno")
    assert res.code == 2 and "--json" in res.err and " -- " not in res.err, res.err
    assert len(pane.messages()) == 2


def test_fleet_and_debug_go_after_the_command_too(cli: Any, isolated: Path) -> None:
    fleet = isolated / "elsewhere.toml"
    fleet.write_text('[hosts.box-a]\nssh = "a.example"\n', encoding="utf-8")
    for args in (["--fleet", str(fleet), "fleet", "show", "--json"], ["fleet", "show", "--json", "--fleet", str(fleet)]):
        res = cli(*args)
        assert res.code == 0, res.err
        assert res.json()["data"]["hosts"] == ["local", "box-a"]
    res = cli("log", "--fleet", str(isolated / "missing.toml"), "--target", "box-a:x")
    assert res.code == 7 and "does not exist" in one_line(res.err)
    res = cli("log", "show", "msg_nope", "--debug", "--fleet", str(fleet))
    assert res.code == 6 and "no message 'msg_nope'" in one_line(res.err)
    # --debug after the command turns on tracebacks for internal errors: proven by a real crash in a subprocess
    code = (
        "import sys; from drover.cli import app; from drover.cli.main import main\n"
        "def boom(*a, **k): raise RuntimeError('kaboom')\n"
        "app.run = boom\n"
        "import drover.cli.commands as c; c.run = boom\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    plain = subprocess.run([sys.executable, "-c", code, "ls"], capture_output=True, text=True, cwd=str(ROOT), timeout=60)
    assert plain.returncode == 1 and "internal error: RuntimeError: kaboom" in one_line(plain.stderr)
    debug = subprocess.run(
        [sys.executable, "-c", code, "ls", "--debug"], capture_output=True, text=True, cwd=str(ROOT), timeout=60
    )
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "kaboom" in debug.stderr


def test_log_keeps_actor_as_its_filter(cli: Any) -> None:
    assert cli("send", "nosuch", "from alice", "--actor", "alice").code == 6
    assert cli("send", "nosuch", "from bob", "--actor", "bob").code == 6
    res = cli("log", "--actor", "bob", "--json")
    assert [m["text"] for m in res.json()["data"]["messages"]] == ["from bob"]


def test_an_empty_target_is_a_usage_error(cli: Any, isolated: Path) -> None:
    fleet = isolated / "config" / "drover" / "fleet.toml"
    fleet.parent.mkdir(parents=True)
    fleet.write_text('[hosts.box-a]\nssh = "a.example"\n', encoding="utf-8")
    for target in ("", "  ", "local:", "box-a:", "box-a: "):
        for command in (["send", target, "hi"], ["status", target], ["read", target], ["wait", target]):
            res = cli(*command)
            assert res.code == 2, (command, res.err)
            assert "target" in one_line(res.err)
    assert cli("log", "--json").json()["data"]["messages"] == []  # nothing was recorded


def test_targets_never_take_an_unknown_host_for_a_local_name(cli: Any, isolated: Path) -> None:
    fleet = isolated / "fleet.toml"
    fleet.write_text('[hosts.box-a]\nssh = "box-a.invalid"\nconnect_timeout = 0.5\n', encoding="utf-8")
    # `work` is no host of the fleet: an unknown host naming the fleet's hosts, never the local pane `work:1.0`
    for command in (["send", "work:1.0", "hi"], ["status", "work:1.0"], ["read", "work:1.0"], ["wait", "work:1.0"]):
        res = cli("--fleet", str(fleet), *command)
        assert res.code == 6, (command, res.err)
        line = one_line(res.err)
        assert "unknown host 'work'" in line and "known hosts: local, box-a" in line and "local:work:1.0" in line
    res = cli("--fleet", str(fleet), "send", "local:work:1.0", "hi", "--json")
    assert res.code == 6
    assert (res.json()["data"]["host"], res.json()["data"]["target"]) == ("local", "work:1.0")
    res = cli("--fleet", str(fleet), "send", "box-a:webapp", "hi", "--json")
    assert res.code == 5 and (res.json()["data"]["host"], res.json()["data"]["target"]) == ("box-a", "webapp")
    # the log's --target reads the same way: HOST:ID on that host, a bare ID on any host
    only_a = cli("--fleet", str(fleet), "log", "--target", "box-a:webapp", "--json").json()["data"]["messages"]
    assert [(m["host"], m["target"]) for m in only_a] == [("box-a", "webapp")]
    bare = cli("--fleet", str(fleet), "log", "--target", "local:work:1.0", "--json").json()["data"]["messages"]
    assert [(m["host"], m["target"]) for m in bare] == [("local", "work:1.0")]
    assert cli("--fleet", str(fleet), "log", "--target", "work:1.0").code == 6


def test_a_broken_fleet_file_is_an_error_for_every_command_that_names_a_target(cli: Any, isolated: Path) -> None:
    fleet = isolated / "config" / "drover" / "fleet.toml"
    fleet.parent.mkdir(parents=True)
    fleet.write_text("[hosts.box-a\n", encoding="utf-8")
    for command in (["send", "box-a:x", "hi"], ["send", "x", "hi"], ["status", "box-a:x"], ["read", "x"], ["ls"]):
        res = cli(*command)
        assert res.code == 7, (command, res.err)
        assert "not valid TOML" in one_line(res.err)
    assert cli("log", "--json").json()["data"]["messages"] == []


def run_bytes(*args: str, stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "drover", *args], input=stdin, capture_output=True, timeout=60, cwd=str(ROOT), env=os.environ
    )


def test_stdin_that_is_not_utf8_is_a_usage_error() -> None:
    res = run_bytes("send", "local:%0", "-", stdin=b"caf\xe9 au lait\n")
    assert res.returncode == 2
    assert "not valid UTF-8 (byte 3" in one_line(res.stderr.decode())
    res = run_bytes("op", "sessions.list", "-", stdin=b'{"engine": "\xff"}')
    assert res.returncode == 2
    assert "the request on stdin is not valid UTF-8" in one_line(res.stderr.decode())
    assert drover_process("log", "--json").json()["data"]["messages"] == []


def test_an_argument_that_is_not_utf8_is_a_usage_error() -> None:
    res = subprocess.run(
        [sys.executable.encode(), b"-m", b"drover", b"send", b"local:%0", b"caf\xe9"],
        capture_output=True,
        timeout=60,
        cwd=str(ROOT),
    )
    assert res.returncode == 2 and "not valid UTF-8" in one_line(res.stderr.decode())


def test_deeply_nested_json_is_a_usage_error(cli: Any) -> None:
    for text in ("[" * 100_000, '{"a":' * 100_000):
        res = cli("op", "sessions.list", text)
        assert res.code == 2
        assert "nested too deeply" in one_line(res.err)
        assert res.json()["errors"][0]["code"] == "bad_json"
    res = cli("op", "sessions.list", "-", stdin="[" * 100_000)
    assert res.code == 2 and "nested too deeply" in one_line(res.err)


def test_shell_completion_is_offered(cli: Any, isolated: Path) -> None:
    assert "--install-completion" in cli("--help").out
    res = drover_process("--show-completion", "bash")
    assert res.code == 0 and "_drover_completion" in res.out and "_DROVER_COMPLETE" in res.out
    (isolated / "config" / "drover").mkdir(parents=True)
    (isolated / "config" / "drover" / "fleet.toml").write_text('[hosts.box-a]\nssh = "a"\n', encoding="utf-8")
    words = {"_DROVER_COMPLETE": "complete_bash", "COMP_WORDS": "drover send bo", "COMP_CWORD": "2"}
    assert drover_process(env=words).out.split() == ["box-a:"]
    words = {"_DROVER_COMPLETE": "complete_bash", "COMP_WORDS": "drover send x y --ac", "COMP_CWORD": "4"}
    assert drover_process(env=words).out.split() == ["--actor"]


def test_help_with_completion_loads_no_heavy_module() -> None:
    code = (
        "import sys; from drover.cli.main import main; main(['--help']); "
        "print(sorted(m for m in ('drover.ops', 'pydantic', 'asyncssh', 'tomlkit') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT), timeout=60)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def test_the_cli_modules_import_without_a_loop() -> None:
    cli_dir = ROOT / "drover" / "cli"
    for path in cli_dir.glob("*.py"):
        if path.name != "main.py":
            assert "drover.cli.main" not in imports_of(path), f"{path.name} imports drover.cli.main"
    assert "drover.cli.app" not in {m for m in imports_of(cli_dir / "render.py")}
    # each command module can be imported first, on its own, in a fresh interpreter
    for module in ("drover.cli.commands", "drover.cli.fleet_cmds", "drover.cli.demo", "drover.cli.app"):
        res = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, cwd=str(ROOT))
        assert res.returncode == 0, res.stderr


def test_one_fleet_load_per_invocation(cli: Any, isolated: Path, monkeypatch: Any) -> None:
    from drover import fleet as fleet_mod

    fleet = isolated / "config" / "drover" / "fleet.toml"
    fleet.parent.mkdir(parents=True)
    fleet.write_text('[hosts.box-a]\nssh = "a.example"\n', encoding="utf-8")
    loads: list[Any] = []
    real = fleet_mod.load

    def counting(*args: Any) -> Any:
        loads.append(args)
        return real(*args)

    monkeypatch.setattr(fleet_mod, "load", counting)
    monkeypatch.setattr("drover.ops.core.load_fleet", counting)
    res = cli("send", "box-a:", "hi")
    assert res.code == 2 and len(loads) == 1
    loads.clear()
    res = cli("send", "nosuch", "hi", "--json")
    assert res.code == 6 and len(loads) == 1
    assert json.loads(res.out)["data"]["outcome"] == "failed"


def test_help_says_what_guard_check_exits_with(cli: Any) -> None:
    res = cli("guard", "check", "--help")
    assert res.code == 0
    text = " ".join(res.out.split())
    assert "Exit 0 = a paste would go ahead, 4 = it would be refused" in text
    top = " ".join(cli("--help").out.split())
    assert "guard check: 0 a paste would go ahead, 4 the guard would refuse" in top
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert '.venv/bin/python -m pytest -m "not slow"' in readme


def test_a_usage_error_points_at_the_help_of_the_command_that_was_mistyped(cli: Any) -> None:
    for args, where in (
        (["send"], "drover send --help"),
        (["fleet", "add"], "drover fleet add --help"),
        (["ls", "--no-such-option"], "drover ls --help"),
        (["no-such-command"], "drover --help"),
    ):
        res = cli(*args)
        assert res.code == 2 and f"(see `{where}`)" in res.err, (args, res.err)


def test_every_command_shows_an_example_in_its_help(cli: Any) -> None:
    """Like gh and ssh users expect: each command's --help ends with how it is used, and each example names it."""
    import typer.main

    from drover.cli.app import app

    def walk(group: Any, path: list[str]) -> Any:
        for name, command in sorted(getattr(group, "commands", {}).items()):
            if getattr(command, "hidden", False):
                continue
            if hasattr(command, "commands"):
                yield from walk(command, [*path, name])
            else:
                yield [*path, name]

    paths = [*walk(typer.main.get_command(app), []), ["log"]]  # `log` answers itself too (and has `log show`)
    assert len(paths) > 20
    for path in paths:
        res = cli(*path, "--help")
        assert res.code == 0, path
        examples = res.out.split("Examples:", 1)
        assert len(examples) == 2, f"drover {' '.join(path)} --help shows no example"
        assert f"drover {' '.join(path)}" in examples[1], path
