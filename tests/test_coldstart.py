"""Cold commands start lean (issue 20): a hot command run without a daemon registers only the command module that
defines it (drover/cli/hot.py), runs only its op's module (drover/ops/loader.py), and a remote one reads the
helper's compressed bundle back from the drover home instead of compressing it again (drover/transport/bundle.py).

Pinned without a clock: what a cold `drover send` / `ls` imports (read from sys.modules in a real process), that
the partial CLI parses every hot command exactly as the whole one, and that the op table is the registry's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

# What a cold hot command must not import: the other command modules (typer reads every registered signature),
# the ops it does not run (each builds its pydantic models), the daemon's server and the MCP server.
NOT_FOR_A_COLD_SEND = (
    "drover.cli.main",
    "drover.cli.demo",
    "drover.cli.events_cmds",
    "drover.cli.fleet_cmds",
    "drover.cli.fleetwide_cmds",
    "drover.cli.spawn_cmds",
    "drover.cli.mcp_cmds",
    "drover.cli.daemon_cmds",
    "drover.cli.watch_cmds",
    "drover.cli.nudge_cmds",
    "drover.daemon.server",
    "drover.mcp",
    "drover.ops.board",
    "drover.ops.broadcast",
    "drover.ops.spawn",
    "drover.ops.watch",
    "drover.ops.nudge_run",
    "drover.ops.fleet_edit",
    "drover.ops.wait_many",
    "drover.ops.done",
    "asyncssh",  # a local send reaches no host over SSH
    "drover.transport.ssh",
    "rich.progress",  # a bar is drawn only for a fan-out over a terminal
)

MODULES_AFTER = """
import json, sys
from drover.front import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def cold(*args: str) -> tuple[int, set[str], str]:
    """Run `drover ARGS` through the front in a fresh process (no daemon: the isolated fixture says
    DROVER_DAEMON=0); (exit code, every module it had imported at the end, stderr)."""
    proc = subprocess.run(
        [sys.executable, "-c", MODULES_AFTER, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
        cwd=str(ROOT),
    )
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "{}"
    doc = json.loads(last)
    assert "code" in doc, f"no report from the child: {proc.stdout[-300:]} {proc.stderr[-500:]}"
    return doc["code"], set(doc["modules"]), proc.stderr


@pytest.mark.parametrize("args", [("send", "local:nosuch", "hello"), ("ls",), ("status", "local:nosuch")])
def test_a_cold_hot_command_imports_only_what_it_runs(args: tuple[str, ...], tmux: Any) -> None:
    tmux.start("shell", "sh")
    code, modules, err = cold(*args)
    assert "drover.cli.commands" in modules and "drover.ops.core" in modules, "the command did not run at all"
    if args[0] == "send":
        assert code == 6 and "nosuch" in err, err  # unknown session: the command ran to its end
        assert "drover.ops.send" in modules
    if args[0] == "ls":
        assert code == 0 and "drover.ops.sessions" in modules, err
    present = sorted(name for name in modules if name in NOT_FOR_A_COLD_SEND)
    assert present == [], f"a cold `drover {args[0]}` imported {present}"


def test_help_and_other_commands_still_take_the_whole_cli() -> None:
    from drover.cli import hot

    assert hot.word(["send", "local:x", "hi", "--help"]) is None
    assert hot.word(["--show-completion"]) is None
    assert hot.word(["fleet", "show"]) is None
    assert hot.word(["--", "send"]) is None
    assert hot.word(["--fleet", "f.toml", "--actor", "me", "send", "local:x", "hi"]) == "send"
    assert hot.word(["log", "show", "msg_1"]) == "log"


DUMP = """
import json, sys
if sys.argv[1] == "hot":
    from drover.cli import hot
    hot.register()
else:
    import drover.cli.main
from drover.cli import program
from drover.cli.hot import HOT
import typer

def root_for(word):
    return program.command(word if sys.argv[1] == "hot" else None)
FIELDS = ("name", "opts", "secondary_opts", "required", "default", "multiple", "nargs", "is_flag", "help",
          "hidden", "envvar", "metavar", "count", "is_eager", "expose_value", "bare_type", "param_type_name",
          "show_default", "min", "max")
def param(p):
    out = {f: repr(getattr(p, f, None)) for f in FIELDS}
    out["type"] = repr(getattr(p, "display_type", None))
    out["callback"] = getattr(p.callback, "__qualname__", repr(p.callback))
    return out
def info(cmd, ctx):
    sub = typer.Context(cmd, info_name=cmd.name, parent=ctx)
    out = {"params": [param(p) for p in cmd.params], "help": cmd.get_help(sub),
           "callback": getattr(cmd.callback, "__qualname__", None)}
    for name, child in sorted(getattr(cmd, "commands", {}).items()):
        out[name] = info(child, sub)
    return out
doc = {}
for word in sorted(HOT):
    root = root_for(word)
    ctx = typer.Context(root, info_name="drover")
    doc[word] = info(root.commands[word], ctx)
    doc[word]["root params"] = [param(p) for p in root.params]
    doc[word]["root callback"] = getattr(root.callback, "__qualname__", None)
print(json.dumps(doc, sort_keys=True, default=repr))
"""


def dump(which: str) -> Any:
    proc = subprocess.run(
        [sys.executable, "-c", DUMP, which], capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "100"}
    )
    assert proc.returncode == 0, proc.stderr[-1000:]
    return json.loads(proc.stdout)


@pytest.mark.slow
def test_the_partial_cli_parses_every_hot_command_as_the_whole_one() -> None:
    """Every hot command's parameters, types, defaults and help, and the root's options, are the same whether
    drover/cli/commands.py was registered alone or with every command module."""
    partial, whole = dump("hot"), dump("whole")
    assert sorted(partial) == sorted(whole)
    for word in partial:
        assert partial[word] == whole[word], f"`drover {word}` parses differently with commands.py alone"


def test_the_op_table_names_every_registered_op_by_its_module() -> None:
    from drover import ops
    from drover.ops import loader

    registry = ops.REGISTRY  # asking the package for it registers every op
    assert set(loader.MODULES) == set(registry), "drover/ops/loader.py's table and the registry differ"
    for name, spec in registry.items():
        assert spec.handler.__module__ == f"drover.ops.{loader.MODULES[name]}", name
    assert set(ops.OP_MODULES) == set(loader.MODULES.values())


def test_an_op_loads_its_own_module_alone_and_an_unknown_one_loads_all() -> None:
    script = """
import sys
from drover.ops import loader
from drover.ops.core import REGISTRY
loader.load("sessions.list")
one = sorted(m for m in sys.modules if m.startswith("drover.ops."))
loader.load("no.such")
print(len(REGISTRY), "drover.ops.spawn" in one, "drover.ops.sessions" in one, "drover.ops.spawn" in sys.modules)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-800:]
    from drover.ops import loader

    assert proc.stdout.split() == [str(len(loader.MODULES)), "False", "True", "True"]


def test_the_bundle_is_compressed_once_and_a_changed_copy_is_never_shipped(isolated: Path) -> None:
    from drover.transport import bundle

    home = isolated / "home"
    home.mkdir()
    bundle.build.cache_clear()
    try:
        blob, digest = bundle.build()
        kept = home / f"bundle-{digest}.z"
        assert kept.read_bytes() == blob and kept.stat().st_mode & 0o077 == 0
        # Read back: the same bytes, from the file (a marker byte appended past the stream would fail decompress).
        bundle.build.cache_clear()
        assert bundle.build() == (blob, digest)
        # A copy that is not exactly this bundle compressed is compressed again and replaced.
        import zlib

        kept.write_bytes(zlib.compress(b'{"loader": "", "modules": {}}', 9))
        bundle.build.cache_clear()
        assert bundle.build() == (blob, digest)
        assert kept.read_bytes() == blob
        # One writable by others is not read either.
        kept.chmod(0o666)
        assert bundle._cached(str(kept), zlib.decompress(blob)) is None
        # An older drover's bundle goes when a new one is kept.
        old = home / "bundle-0123456789abcdef.z"
        old.write_bytes(b"old")
        kept.unlink()
        bundle.build.cache_clear()
        bundle.build()
        assert not old.exists() and kept.exists()
    finally:
        bundle.build.cache_clear()
