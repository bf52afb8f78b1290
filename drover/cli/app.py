"""The CLI's shared core: the typer apps, the invocation's one Context (its state: drover/cli/state.py), `run`
and `finish`.

Command modules (`commands`, `fleet_cmds`, `demo`) import this module and register their commands on its apps;
`main` imports them all; `program` holds `main(argv, env)`.  Nothing here imports pydantic, asyncssh or the ops at import time,
so `drover --help` and `--version` stay fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from drover import __version__
from drover.cli import render
from drover.cli.completion import complete_hosts, complete_tags
from drover.cli.state import environment, state
from drover.errors import UsageError
from drover.paths import DURATION_FORMS, MAX_DURATION_S, parse_duration

if TYPE_CHECKING:
    from drover.ops.core import Context, Document
    from drover.targets import Target

EXIT_CODES = """Exit codes: 0 delivered or queued (or the op succeeded) · 1 internal error · 2 usage (bad arguments, malformed
JSON, unknown op, empty text or target) · 3 held for a human · 4 refused or dropped · 5 failed to reach the session ·
6 unknown host or unknown/ambiguous session · 7 invalid fleet file (or one that cannot be read or written), or truth
file unusable · 8 some hosts failed · 9 timed out waiting · 130 interrupted. guard check: 0 a paste would go ahead,
4 the guard would refuse."""

HELP = f"""Deliver text to AI coding-agent sessions (Claude Code, Codex, any program in tmux) on any host of your
fleet, safely, and keep a record of every message.

\b
  drover ls                               every session on every host
  drover status local:%3                  alive, and doing what?
  drover send local:%3 "rebase on master" deliver a message (guarded: never into a dialog)
  drover log                              what was sent, and what became of it
  drover op sessions.message '{{"host":"local","id":"%3","text":"hi"}}'

Targets are HOST:ID; HOST defaults to `local`. ID is a pane id (%3), session:window.pane, or a unique name.
--fleet, --actor and --debug go before or after the command; a text that starts with - goes after --.

\b
{EXIT_CODES}"""

app = typer.Typer(
    help=HELP,
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion
    pretty_exceptions_enable=False,  # never a traceback with local variables in it
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)
fleet_app = typer.Typer(help="Show and edit the fleet inventory (fleet.toml).", no_args_is_help=True)
guard_app = typer.Typer(help="Check the tmux guard's engine profiles against saved screens.", no_args_is_help=True)


def examples(*lines: str) -> str:
    """A command's epilog of usage examples, shown line by line as written (click's \\b stops the rewrap)."""
    return "Examples:\n\n\b\n" + "\n".join("  " + line for line in lines)


log_app = typer.Typer(
    help="Query the truth file: every message and what became of it.",
    invoke_without_command=True,
    epilog=examples("drover log -n 20", "drover log --pending --host 'h[1-3]' --json", "drover log show msg_3f2a9c1e"),
)
app.add_typer(fleet_app, name="fleet")
app.add_typer(guard_app, name="guard")
app.add_typer(log_app, name="log")


# The options every command takes, wherever they are typed: `drover --actor me send …` and `drover send … --actor me`.
FleetOpt = Annotated[
    str | None,
    typer.Option("--fleet", help="fleet file (default: $DROVER_FLEET, else ~/.config/drover/fleet.toml)", show_default=False),
]
ActorOpt = Annotated[
    str | None, typer.Option("--actor", help="who is sending (default: $DROVER_ACTOR, else user@host)", show_default=False)
]
DebugOpt = Annotated[bool, typer.Option("--debug", help="show tracebacks for internal errors", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="print the op's JSON document instead of a table")]
# What every command that talks to hosts takes: which hosts (pssh/clush habits: drover/hostsets.py), and how long each
# may take.
HostsOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--host",
        "-H",
        metavar="HOSTS",
        help="only these hosts (repeatable): a name, a list or a range -- h1,h3 · node[01-40] · 'h[1-3],!h2' (! leaves out)",
        autocompletion=complete_hosts,
    ),
]
TagsOpt = Annotated[
    list[str] | None,
    typer.Option("--tag", "-t", metavar="TAG", help="only hosts with this tag (repeatable)", autocompletion=complete_tags),
]


def duration(value: object) -> float:
    """A duration typed on the command line, by drover's one grammar (drover/paths.py): a usage error (exit 2) for
    anything else, as typer's own for a number that is not one.  A default arrives as the number it is."""
    if isinstance(value, int | float):
        return float(value)
    try:
        return parse_duration(str(value))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


# How a duration option's help ends: the forms it takes.
DURATION_HELP = f"({DURATION_FORMS})"
TimeoutOpt = Annotated[
    float | None,
    typer.Option(
        "--timeout",
        metavar="DURATION",
        parser=duration,
        help="how long each host may take to connect, and then to answer each request (overrides connect_timeout and "
        f"request_timeout of fleet.toml for this command; for a bot: or adapter: target, its own timeout) {DURATION_HELP}",
        show_default=False,
    ),
]
# `wait` and `wait-file`: how long they wait for the session or the file, not how long each host may take.
WaitTimeoutOpt = Annotated[
    float,
    typer.Option("--timeout", metavar="DURATION", parser=duration, help=f"how long before giving up (exit 9) {DURATION_HELP}"),
]
VIA_HELP = (
    "lane: auto (inbox for Claude, queue for a Codex thread, else tmux), inbox, queue, or tmux (refused, native_lane, "
    "for a session that has an inbox or a queue: only --as-owner pastes there)"
)


def common(fleet: str | None = None, actor: str | None = None, debug: bool = False, timeout: float | None = None) -> None:
    """Take --fleet, --actor and --debug (and a command's --timeout) as typed after the command; they win over those
    typed before it."""
    if timeout is not None:
        if not 0 < timeout <= MAX_DURATION_S:  # NaN included
            raise UsageError(f"--timeout {timeout:g}: give a duration above zero and at most 366d ({DURATION_FORMS})")
        state.timeout = timeout
    if fleet is not None:
        state.fleet = fleet
    if actor is not None:
        state.actor = actor
    state.debug = state.debug or debug


def context() -> Context:
    """This invocation's Context: one per run of `drover`, so the fleet file is read (and checked) once."""
    if state.ctx is None:
        from drover.ops.core import Context  # the class alone: the package would register every op

        make = environment().make_context or Context
        state.ctx = make(fleet_path=state.fleet, actor=state.actor, progress=_progress(), exit_on_interrupt=True)
        state.ctx.timeout_s = state.timeout
    return state.ctx


def _progress() -> Any:
    """A transient progress bar on stderr for fan-outs over more than a few hosts (TTY only)."""
    if not environment().isatty("stderr"):
        return None
    return render.FanOutProgress()


def run(name: str, payload: dict[str, Any] | str) -> Document:
    from drover.ops.core import run as run_op
    from drover.ops.loader import load

    load(name)  # only the op's own module (drover/ops/loader.py)
    return run_op(name, payload, context())


def finish(doc: Document, as_json: bool, show: Any) -> None:
    """Print the document (JSON, or the human rendering and one line per error) and exit with its code."""
    if as_json:
        render.print_json(doc)
    else:
        if doc.data is not None:
            show(render.clean(doc.data))
        # These renderings show their own problems (per host, or the refused outcome); others get one line each.
        if doc.data is None or doc.op not in ("sessions.message", "messages.retry", "sessions.wait", "fleet.check"):
            render.errors(doc)
    raise typer.Exit(doc.exit_code)


def target(value: str) -> Target:
    """HOST:ID as typed, against this invocation's fleet (an invalid fleet file is an error here too)."""
    from drover import targets

    return targets.parse(value, context().fleet)


def session_target(value: str, command: str) -> Target:
    """As `target`, for a command that needs a session: `bot:NAME` / `adapter:NAME` is a usage error saying so."""
    from drover import targets

    return targets.parse_session(value, context().fleet, command)


def recorded_target(value: str) -> Target:
    """HOST:ID for a query of the record: as `target`, and an identity (`claude:ID`) alone names it on any host."""
    from drover import targets

    return targets.parse_recorded(value, context().fleet)


def read_text(text: str, what: str = "the message") -> str:
    """An argument, or with `-` all of stdin; either must be UTF-8 (anything else is a usage error, exit 2)."""
    if text != "-":
        return _utf8(text, what)
    stdin = environment().stdin
    if stdin is None:  # started with stdin closed (`<&-`): nothing to read, and not an empty text either
        raise UsageError(f"{what} was to come from stdin (-), but stdin is closed", hint="give it as an argument instead")
    stream = getattr(stdin, "buffer", None)
    if stream is None:  # a text stream (tests, embedding): already decoded
        return _utf8(stdin.read(), what)
    raw = stream.read()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"{what} on stdin is not valid UTF-8 (byte {exc.start}: {exc.reason})",
            hint="convert it first, e.g. iconv -f latin1 -t utf-8",
        ) from None


def _utf8(text: str, what: str) -> str:
    # Arguments that were not UTF-8 arrive as lone surrogates (PEP 383): refuse them here, not in the truth file.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UsageError(f"{what} is not valid UTF-8 (character {exc.start})") from None
    return text


def _print_version(value: bool) -> None:
    if value:
        print(f"drover {__version__}", file=environment().stdout)
        raise typer.Exit(0)


@app.callback()
def _global(
    fleet: FleetOpt = None,
    actor: ActorOpt = None,
    debug: DebugOpt = False,
    version: Annotated[
        bool, typer.Option("--version", help="print the version and exit", is_eager=True, callback=_print_version)
    ] = False,
) -> None:
    common(fleet, actor, debug)
