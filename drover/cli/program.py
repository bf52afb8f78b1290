"""`main(argv, env)`: the `drover` program with error handling, run against the Environment it is handed.

The typer app is the program without error handling (httpie's split), so errors are turned into one line and an
exit code in exactly one place.  The command modules register themselves on the app; drover.cli.main imports them
all, so this module (which the daemon's starter reaches from `drover daemon`) imports none of them.
"""

from __future__ import annotations

import copy
import functools
import shlex
import sys
import types
from typing import Any

import typer
import typer.main
from typer._click._compat import _force_correct_text_writer

from drover import interrupts
from drover.cli import render
from drover.cli.app import app
from drover.cli.state import environment, state
from drover.environment import Environment
from drover.errors import DroverError, ExitCode

# typer vendors click (typer._click): its Exit, Abort and usage errors are typer's own classes.
EXIT_ERRORS: tuple[type[BaseException], ...] = (typer.Exit,)
ABORT_ERRORS: tuple[type[BaseException], ...] = (typer.Abort,)
USAGE_ERRORS: tuple[type[BaseException], ...] = (typer.TyperException,)


def _show_help(ctx: Any, param: Any, value: bool) -> None:
    """click's --help, printed on the invocation's stdout (click's own prints on sys.stdout), as click prints it."""
    if value and not ctx.resilient_parsing:
        typer.echo(ctx.get_help(), file=_force_correct_text_writer(environment().stdout, None, None), color=ctx.color)
        ctx.exit()


def _route_help(command: Any, names: list[str]) -> None:
    """Give every command's help option _show_help.  click makes a command's help option once and keeps it; it
    needs of the context only the help option names, which every context inherits from the root's settings."""
    option = command.get_help_option(types.SimpleNamespace(help_option_names=names))
    if option is not None:
        option.callback = _show_help
    for sub in getattr(command, "commands", {}).values():
        _route_help(sub, names)


def command(only: str | None = None) -> Any:
    """typer's click command, built once per process: typer builds it from the functions' signatures on every call
    (~35 ms, most of a warm daemon request).  Called as typer's __call__ would (pretty exceptions are off: nothing
    of its except hook applies).  Rebuilt when more commands were registered since: a cold hot command registers
    one module (drover/cli/hot.py), and a later call in the same process may have imported them all.  `only`:
    the root with that one command (or group) alone -- what a cold hot command builds, typer reading no other
    signature (drover/cli/hot.py)."""
    return _command(_registered(app), only)


def _registered(typer_app: Any) -> int:
    """How many commands and groups are registered on the app and its sub-apps, all the way down."""
    groups = typer_app.registered_groups
    return len(typer_app.registered_commands) + len(groups) + sum(_registered(g.typer_instance) for g in groups)


@functools.cache
def _command(_registered: int, only: str | None) -> Any:
    root = app
    if only is not None:
        # The same root (its callback, options and settings) over the one command: a shallow copy, the app's own
        # lists left as they are.
        root = copy.copy(app)
        root.registered_commands = [c for c in app.registered_commands if c.name == only]
        root.registered_groups = [g for g in app.registered_groups if g.name == only]
    built = typer.main.get_command(root)
    _route_help(built, list(built.context_settings.get("help_option_names") or ["--help"]))
    return built


def _terminal_width(env: Environment) -> int | None:
    """The width click formats help to: the caller's terminal (as click would measure its own: 50 to 78), or None
    for click to measure this process's."""
    return None if env.columns is None else max(min(env.columns, 80) - 2, 50)


def main(argv: list[str] | None = None, env: Environment | None = None, only: str | None = None) -> int:
    """The program with error handling: one line per error, a documented exit code, tracebacks only with --debug.
    `only`: the command word argv names, when the caller knows the root needs no other (see `command`)."""
    args = sys.argv[1:] if argv is None else argv
    state.reset(Environment.from_process() if env is None else env)
    state.argv = list(args)
    interrupts.install()  # SIGTERM and SIGHUP stop drover as Ctrl-C does (drover/interrupts.py)
    try:
        return _run(args, only)
    finally:
        # The Environment is this invocation's: a renderer called after it (a test, a script) prints to the
        # process's streams of that moment, not to streams this invocation was handed.
        state.env = None


def _dash_hint(exc: BaseException) -> str:
    """An unknown "option" that is no option's misspelling -- `send HOST:ID "--force Q7"` -- is most likely a text
    that starts with '-': say how to give one (click says only "No such option")."""
    name = getattr(exc, "option_name", None)
    if type(exc).__name__ != "NoSuchOption" or not isinstance(name, str) or getattr(exc, "possibilities", None):
        return ""
    return f"; a text that starts with '-' goes after '--': drover send HOST:ID -- {shlex.quote(name)}"


def _run(args: list[str], only: str | None = None) -> int:
    env = environment()
    try:
        result = int(
            command(only).main(args=args, prog_name="drover", standalone_mode=False, terminal_width=_terminal_width(env)) or 0
        )
        if result == ExitCode.INTERRUPTED:
            render.err().print("drover: interrupted", style="red")  # typer turns Ctrl-C into a silent exit 130
        return result
    except EXIT_ERRORS as exc:
        return int(getattr(exc, "exit_code", 0))
    except ABORT_ERRORS:
        render.err().print("drover: interrupted", style="red")
        return ExitCode.INTERRUPTED
    except USAGE_ERRORS as exc:
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        # The help of the command that was mistyped (`drover fleet add --help`), not the top level's.
        ctx = getattr(exc, "ctx", None)
        where = getattr(ctx, "command_path", "") or "drover"
        render.err().print("drover: " + render.safe(f"{message} (see `{where} --help`){_dash_hint(exc)}"), style="red")
        return ExitCode.USAGE
    except DroverError as exc:
        if state.debug:
            raise
        render.error_list([exc.to_dict()])
        return int(exc.exit_code)
    except KeyboardInterrupt:
        render.err().print("drover: interrupted", style="red")
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        return ExitCode.OK
    except Exception as exc:
        if state.debug:
            raise
        render.err().print(
            "drover: "
            + render.safe(f"internal error: {type(exc).__name__}: {exc} (a bug: run again with --debug for the traceback)"),
            style="red",
        )
        return ExitCode.INTERNAL
