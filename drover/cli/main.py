"""The `drover` command: parsing and rendering only; every command runs an op.

`main()` is the program with error handling; the typer app is the program without (httpie's split), so errors
are turned into one line and an exit code in exactly one place.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from drover import __version__
from drover.cli import render
from drover.errors import DroverError, ExitCode

EXIT_CODES = """Exit codes: 0 delivered or queued (or the op succeeded) · 1 internal error · 2 usage (bad arguments, malformed
JSON, unknown op, empty text) · 3 held for a human · 4 refused or dropped · 5 failed to reach the session ·
6 unknown host or unknown/ambiguous session · 7 invalid fleet file · 8 some hosts failed · 9 timed out waiting ·
130 interrupted."""

HELP = f"""Deliver text to AI coding-agent sessions (Claude Code, Codex, any program in tmux) on any host of your
fleet, safely, and keep a record of every message.

\b
  drover ls                               every session on every host
  drover status local:%3                  alive, and doing what?
  drover send local:%3 "rebase on master" deliver a message (guarded: never into a dialog)
  drover log                              what was sent, and what became of it
  drover op sessions.message '{{"host":"local","id":"%3","text":"hi"}}'

Targets are HOST:ID; HOST defaults to `local`. ID is a pane id (%3), session:window.pane, or a unique name.

\b
{EXIT_CODES}"""

app = typer.Typer(
    help=HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,  # never a traceback with local variables in it
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)
fleet_app = typer.Typer(help="Show and edit the fleet inventory (fleet.toml).", no_args_is_help=True)
guard_app = typer.Typer(help="Check the tmux guard's engine profiles against saved screens.", no_args_is_help=True)
log_app = typer.Typer(help="Query the truth file: every message and what became of it.", invoke_without_command=True)
app.add_typer(fleet_app, name="fleet")
app.add_typer(guard_app, name="guard")
app.add_typer(log_app, name="log")


class State:
    fleet: str | None = None
    actor: str | None = None
    debug: bool = False


state = State()

JsonOpt = Annotated[bool, typer.Option("--json", help="print the op's JSON document instead of a table")]


def context() -> Any:
    from drover.ops import Context

    return Context(fleet_path=state.fleet, actor=state.actor, progress=_progress())


def _progress() -> Any:
    """A transient progress bar on stderr for fan-outs over more than a few hosts (TTY only)."""
    if not sys.stderr.isatty():
        return None
    return render.FanOutProgress()


def run(name: str, payload: dict[str, Any]) -> Any:
    from drover.ops import run as run_op

    return run_op(name, payload, context())


def finish(doc: Any, as_json: bool, show: Any) -> None:
    """Print the document (JSON, or the human rendering and one line per error) and exit with its code."""
    if as_json:
        render.print_json(doc)
    else:
        if doc.data is not None:
            show(doc.data)
        # These renderings show their own problems (per host, or the refused outcome); others get one line each.
        if doc.data is None or doc.op not in ("sessions.message", "fleet.check"):
            render.errors(doc)
    raise typer.Exit(doc.exit_code)


def split_target(value: str) -> tuple[str, str]:
    """HOST:ID -> (host, id). The part before the first ':' is a host only if the fleet knows it."""
    from drover.fleet import LOCAL

    if ":" in value:
        head, rest = value.split(":", 1)
        try:
            hosts = context().fleet.host_names()
        except DroverError:
            hosts = [LOCAL]
        if head in hosts:
            return head, rest
    return LOCAL, value


def read_text(text: str) -> str:
    if text == "-":
        return sys.stdin.read()
    return text


def _print_version(value: bool) -> None:
    if value:
        print(f"drover {__version__}")
        raise typer.Exit(0)


@app.callback()
def _global(
    fleet: Annotated[
        str | None, typer.Option("--fleet", help="fleet file (default: $DROVER_FLEET, else ~/.config/drover/fleet.toml)")
    ] = None,
    actor: Annotated[str | None, typer.Option("--actor", help="who is sending (default: $DROVER_ACTOR, else user@host)")] = None,
    debug: Annotated[bool, typer.Option("--debug", help="show tracebacks for internal errors")] = False,
    version: Annotated[
        bool, typer.Option("--version", help="print the version and exit", is_eager=True, callback=_print_version)
    ] = False,
) -> None:
    state.fleet, state.actor, state.debug = fleet, actor, debug


@app.command("ls")
def ls(
    host: Annotated[list[str] | None, typer.Option("--host", "-H", help="only this host (repeatable)")] = None,
    tag: Annotated[list[str] | None, typer.Option("--tag", "-t", help="only hosts with this tag (repeatable)")] = None,
    engine: Annotated[str | None, typer.Option("--engine", "-e", help="only sessions running this engine")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List every session on every host (or the chosen ones): engine, state, directory."""
    doc = run("sessions.list", {"hosts": host or None, "tags": tag or None, "engine": engine})
    finish(doc, as_json, render.sessions_table)


@app.command("status")
def status(
    target: Annotated[str, typer.Argument(help="HOST:ID, e.g. local:%3 or box-a:webapp")],
    tail: Annotated[int, typer.Option("--tail", help="screen lines to show")] = 8,
    as_json: JsonOpt = False,
) -> None:
    """Alive, and doing what? The session's state with its evidence."""
    host, sid = split_target(target)
    doc = run("sessions.status", {"host": host, "id": sid, "tail": tail})
    finish(doc, as_json, render.status)


@app.command("send")
def send(
    target: Annotated[str, typer.Argument(help="HOST:ID, e.g. local:%3 or box-a:webapp")],
    text: Annotated[str, typer.Argument(help="the message, or - to read it from stdin")],
    via: Annotated[str, typer.Option("--via", help="lane: auto (inbox for Claude, else tmux), inbox, or tmux")] = "auto",
    expect_engine: Annotated[str | None, typer.Option("--expect-engine", help="refuse unless the pane runs this engine")] = None,
    as_owner: Annotated[
        bool, typer.Option("--as-owner", help="these are the owner's own words: declare the target's permission class")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Deliver a message to one session. Refuses panes showing a dialog; records every message.

    Claude Code sessions get it in their own inbox (no tmux involved); anything else in tmux by guarded paste.
    Agent engines get the text inside a <cross-session-message from-name="drover (ACTOR)" from-mode="prompting">
    envelope; plain shells get the raw text. Control characters arrive as visible symbols (ESC as ␛), never as keys.
    --as-owner (only where the fleet sets owner_relay = true) declares the class the target runs in, so the owner's
    own words reach a session that bypasses permission prompts instead of being held.
    """
    host, sid = split_target(target)
    payload: dict[str, Any] = {"host": host, "id": sid, "text": read_text(text), "via": via, "as_owner": as_owner}
    if expect_engine:
        payload["expect_engine"] = expect_engine
    doc = run("sessions.message", payload)
    finish(doc, as_json, render.outcome)


@app.command("wait")
def wait(
    target: Annotated[str, typer.Argument(help="HOST:ID")],
    until: Annotated[str, typer.Option("--until", help="idle or exited")] = "idle",
    timeout: Annotated[float, typer.Option("--timeout", help="seconds before giving up (exit 9)")] = 600.0,
    as_json: JsonOpt = False,
) -> None:
    """Block until a session is idle (or has exited). Claude sessions notify; other engines are watched on their host."""
    host, sid = split_target(target)
    doc = run("sessions.wait", {"host": host, "id": sid, "until": until, "timeout_s": timeout})
    finish(doc, as_json, render.waited)


@app.command("read")
def read(
    target: Annotated[str, typer.Argument(help="HOST:ID (a Claude session, or a Codex rollout id)")],
    last: Annotated[int, typer.Option("--last", "-n", help="the last N matching events")] = 20,
    role: Annotated[list[str] | None, typer.Option("--role", help="user, assistant, peer or tool (repeatable)")] = None,
    grep: Annotated[str | None, typer.Option("--grep", help="only events matching this regex")] = None,
    since: Annotated[str | None, typer.Option("--since", help="10m, 2h, or an ISO time")] = None,
    raw: Annotated[bool, typer.Option("--raw", help="the raw transcript records (with --json)")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Read a transcript, filtered on the host: text only, tool calls summarised, never the whole file unless asked."""
    host, sid = split_target(target)
    payload = {"host": host, "id": sid, "last": last, "roles": role or None, "grep": grep, "since": since, "raw": raw}
    doc = run("sessions.read", payload)
    finish(doc, as_json, render.transcript)


@app.command("op", context_settings={"ignore_unknown_options": False})
def op_cmd(
    verb: Annotated[str | None, typer.Argument(help="the op, e.g. sessions.message")] = None,
    request: Annotated[str | None, typer.Argument(help="the request as JSON, or - to read it from stdin")] = None,
    list_ops: Annotated[bool, typer.Option("--list", help="list the ops and their request fields")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Run any op with a JSON request and print its JSON document: {"drover":1,"op","ok","data","errors"}."""
    from drover.ops import describe

    if list_ops or verb is None:
        ops = describe()
        render.print_json({"drover": 1, "ops": ops}) if as_json else render.ops_list(ops)
        raise typer.Exit(0)
    payload = read_text(request) if request is not None else "{}"
    from drover.ops import run as run_op

    doc = run_op(verb, payload, context())
    render.print_json(doc)
    if not doc.ok:
        for e in doc.errors:
            render.err.print("drover: " + render.error_line(e), style="red", markup=False)
    raise typer.Exit(doc.exit_code)


@log_app.callback()
def log(
    ctx: typer.Context,
    target: Annotated[str | None, typer.Option("--target", help="HOST:ID as it was addressed")] = None,
    actor: Annotated[str | None, typer.Option("--actor", help="only this sender")] = None,
    outcome: Annotated[
        str | None, typer.Option("--outcome", help="delivered, queuedBehindTurn, held, refused, dropped, failed")
    ] = None,
    since: Annotated[str | None, typer.Option("--since", help="10m, 2h, 7d, or an ISO time")] = None,
    pending: Annotated[bool, typer.Option("--pending", help="only messages accepted with no outcome (a crash mid-send)")] = False,
    limit: Annotated[int, typer.Option("--limit", "-n", help="the newest N")] = 50,
    as_json: JsonOpt = False,
) -> None:
    """What was sent, by whom, to whom, and what became of it. `drover log show ID` for one message."""
    if ctx.invoked_subcommand:
        return
    payload = {"target": target, "actor": actor, "outcome": outcome, "since": since, "pending": pending, "limit": limit}
    doc = run("messages.list", payload)
    finish(doc, as_json, render.messages_table)


@log_app.command("show")
def log_show(
    msg_id: Annotated[str, typer.Argument(help="message id (msg_...) or a unique prefix")],
    as_json: JsonOpt = False,
) -> None:
    """One message: full text, target, outcome, lane, detail."""
    doc = run("messages.get", {"id": msg_id})
    finish(doc, as_json, render.message)


@guard_app.command("check")
def guard_check(
    engine: Annotated[str, typer.Option("--engine", "-e", help="claude, codex, gemini, demo, shell, or one of fleet.toml")],
    file: Annotated[str, typer.Option("--file", "-f", help="a saved screen (tmux capture-pane -p > screen.txt), or -")],
    as_json: JsonOpt = False,
) -> None:
    """Classify a saved screen. Exit 0 = a paste would go ahead, 1 = it would be refused."""
    try:
        screen = sys.stdin.read() if file == "-" else open(file, encoding="utf-8", errors="replace").read()
    except OSError as exc:
        from drover.errors import UsageError

        raise UsageError(f"cannot read {file}: {exc.strerror}") from None
    doc = run("guard.check", {"engine": engine, "screen": screen})

    def show(data: dict[str, Any]) -> None:
        style = render.STATE_STYLE.get(data["state"], "")
        render.out.print(f"{data['state']}: {data['reason']} → {data['verdict']}", style=style, markup=False)

    finish(doc, as_json, show)


from drover.cli import demo as _demo  # noqa: E402  - registers `drover demo`
from drover.cli import fleet_cmds as _fleet_cmds  # noqa: E402  - registers `drover fleet ...`

_ = (_demo, _fleet_cmds)


# typer vendors click (typer._click): its Exit, Abort and usage errors are typer's own classes.
EXIT_ERRORS: tuple[type[BaseException], ...] = (typer.Exit,)
ABORT_ERRORS: tuple[type[BaseException], ...] = (typer.Abort,)
USAGE_ERRORS: tuple[type[BaseException], ...] = (typer.TyperException,)


def main(argv: list[str] | None = None) -> int:
    """The program with error handling: one line per error, a documented exit code, tracebacks only with --debug."""
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    try:
        result = app(args=args, prog_name="drover", standalone_mode=False)
        return int(result or 0)
    except EXIT_ERRORS as exc:
        return int(getattr(exc, "exit_code", 0))
    except ABORT_ERRORS:
        render.err.print("drover: interrupted", style="red")
        return ExitCode.INTERRUPTED
    except USAGE_ERRORS as exc:
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        render.err.print(f"drover: {message} (see `drover --help`)", style="red", markup=False)
        return ExitCode.USAGE
    except DroverError as exc:
        if debug:
            raise
        render.err.print("drover: " + exc.line(), style="red", markup=False)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        render.err.print("drover: interrupted", style="red")
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        return ExitCode.OK
    except Exception as exc:
        if debug:
            raise
        render.err.print(
            f"drover: internal error: {type(exc).__name__}: {exc} (a bug: run again with --debug for the traceback)",
            style="red",
            markup=False,
        )
        return ExitCode.INTERNAL
