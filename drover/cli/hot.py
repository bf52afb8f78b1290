"""The hot commands' own module: what a cold `drover send` / `ls` / `status` / `wait` / `op` / `read` / `log`
imports of the CLI when no daemon runs it (drover/front.py).

typer builds the click command of every function registered on the app before it parses one word, reading each
signature (get_type_hints on every option's annotation); with every command module that is ~100 ms of a cold
start.  These commands all live in drover/cli/commands.py, so registering that module alone, and building the
root over the one command typed, parses them exactly as the whole CLI does (tests/test_coldstart.py compares the
two commands parameter by parameter).  Help, shell
completion and anything else go to the whole CLI (drover/cli/main.py): the root help lists every command.
"""

from __future__ import annotations

# The command words drover/cli/commands.py defines that a cold run may take alone: the daemon client's hot set.
HOT = frozenset(["send", "ls", "status", "wait", "op", "read", "log"])


def word(argv: list[str]) -> str | None:
    """The hot command `argv` runs, when registering drover/cli/commands.py alone -- and building the root over that
    one command (drover/cli/program.py's `command(only)`) -- parses `argv` as the whole CLI would; else None."""
    from drover.daemon import client  # stdlib only, already imported by the front

    if client.asks_help(argv) or client.asks_completion(argv):
        return None
    found, _rest = client.command_of(argv)
    return found if found in HOT else None


def register() -> None:
    from drover.cli import commands  # noqa: F401 - importing a command module registers it
