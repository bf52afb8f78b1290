"""The `drover` program: the command modules, registered on the app of `drover.cli.app`, and `main()`.

`main()` is the program with error handling; the typer app is the program without (httpie's split), so errors
are turned into one line and an exit code in exactly one place.
"""

from __future__ import annotations

import sys

import typer

from drover.cli import (  # noqa: F401 - importing a command module registers it
    commands,
    connect_cmds,
    daemon_cmds,
    demo,
    fleet_cmds,
    fleetwide_cmds,
    handoff_cmds,
    nudge_cmds,
    render,
    spawn_cmds,
)
from drover.cli.app import app, state
from drover.errors import DroverError, ExitCode

# typer vendors click (typer._click): its Exit, Abort and usage errors are typer's own classes.
EXIT_ERRORS: tuple[type[BaseException], ...] = (typer.Exit,)
ABORT_ERRORS: tuple[type[BaseException], ...] = (typer.Abort,)
USAGE_ERRORS: tuple[type[BaseException], ...] = (typer.TyperException,)


def main(argv: list[str] | None = None) -> int:
    """The program with error handling: one line per error, a documented exit code, tracebacks only with --debug."""
    args = sys.argv[1:] if argv is None else argv
    state.reset()
    try:
        result = int(app(args=args, prog_name="drover", standalone_mode=False) or 0)
        if result == ExitCode.INTERRUPTED:
            render.err.print("drover: interrupted", style="red")  # typer turns Ctrl-C into a silent exit 130
        return result
    except EXIT_ERRORS as exc:
        return int(getattr(exc, "exit_code", 0))
    except ABORT_ERRORS:
        render.err.print("drover: interrupted", style="red")
        return ExitCode.INTERRUPTED
    except USAGE_ERRORS as exc:
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        # The help of the command that was mistyped (`drover fleet add --help`), not the top level's.
        ctx = getattr(exc, "ctx", None)
        where = getattr(ctx, "command_path", "") or "drover"
        render.err.print("drover: " + render.safe(f"{message} (see `{where} --help`)"), style="red")
        return ExitCode.USAGE
    except DroverError as exc:
        if state.debug:
            raise
        render.error_list([exc.to_dict()])
        return int(exc.exit_code)
    except KeyboardInterrupt:
        render.err.print("drover: interrupted", style="red")
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        return ExitCode.OK
    except Exception as exc:
        if state.debug:
            raise
        render.err.print(
            "drover: "
            + render.safe(f"internal error: {type(exc).__name__}: {exc} (a bug: run again with --debug for the traceback)"),
            style="red",
        )
        return ExitCode.INTERNAL
