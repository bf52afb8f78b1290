"""`drover mcp serve` and `drover mcp install`: the MCP front (drover/mcp/).  Both import the SDK only when run,
so `drover --help` stays fast."""

from __future__ import annotations

import shlex
from typing import Annotated, Any

import typer

from drover.cli import render
from drover.cli.app import ActorOpt, DebugOpt, FleetOpt, JsonOpt, app, common, examples
from drover.errors import DroverError

mcp_app = typer.Typer(
    help="drover as an MCP server for agents: serve it over stdio, or register it with Claude Code or Codex.",
    no_args_is_help=True,
    epilog=examples("drover mcp install claude --scope user", "drover mcp install codex --print", "drover mcp serve"),
)
app.add_typer(mcp_app, name="mcp")


@mcp_app.command("serve", epilog=examples("drover mcp serve", "claude --mcp-config drover-mcp.json"))
def serve(
    fleet: FleetOpt = None,
    debug: Annotated[bool, typer.Option("--debug", help="log each tool call on stderr (stdout stays the protocol's)")] = False,
) -> None:
    """Serve drover's ops as MCP tools over stdio, for the agent session that starts it (Claude Code, Codex).
    Messages are from that session, named on proof; outside one, from $DROVER_ACTOR (else user@host).
    docs/mcp.md lists the tools."""
    from drover.cli.state import state
    from drover.mcp.server import serve as run_server

    common(fleet)
    raise typer.Exit(run_server(state.fleet, debug=debug or state.debug, starter_actor=state.actor))


@mcp_app.command(
    "install",
    epilog=examples(
        "drover mcp install claude",
        "drover mcp install claude --scope project --print",
        "drover --fleet ~/work/fleet.toml mcp install codex --json",
    ),
)
def install(
    engine: Annotated[str, typer.Argument(help="claude or codex", metavar="claude|codex")],
    scope: Annotated[
        str | None,
        typer.Option(
            "--scope", help="claude only: user (every project, the default) or project (the cwd's .mcp.json)", show_default=False
        ),
    ] = None,
    print_only: Annotated[
        bool, typer.Option("--print", help="show the command or file change it would make; change nothing")
    ] = False,
    force: Annotated[bool, typer.Option("--force", help="replace a `drover` server registered with another command")] = False,
    as_json: JsonOpt = False,
    fleet: FleetOpt = None,
    actor: ActorOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Register drover's MCP server (this drover's own executable, `mcp serve`, and --fleet when given) under the
    name `drover`, through `claude mcp add` / `codex mcp add`, or by writing their config where the CLI is not on
    PATH.  Running it again changes nothing; another `drover` entry is replaced only with --force."""
    from drover.cli.state import state
    from drover.mcp import install as mcp_install

    common(fleet, actor, debug)
    try:
        plan = mcp_install.plan(engine, scope, state.fleet, force)
        if not print_only:
            mcp_install.apply(plan)
    except DroverError as exc:
        if not as_json:
            raise
        render.print_json({"drover": 1, "op": "mcp.install", "ok": False, "data": None, "errors": [exc.to_dict()]})
        raise typer.Exit(int(exc.exit_code)) from None
    data = plan.to_dict(done=not print_only)
    data["printed"] = print_only
    if as_json:
        render.print_json({"drover": 1, "op": "mcp.install", "ok": True, "data": data, "errors": []})
        return
    _show(data, mcp_install.entry_text(plan) if print_only and not plan.runs else None)


def _show(data: dict[str, Any], entry: str | None) -> None:
    """What install did or would do, in words; `entry`: the file's new entry, for --print without the CLI."""
    from rich.text import Text

    where = f"{data['engine']} ({data['scope']} scope)" if data["scope"] else data["engine"]
    line = shlex.join([data["command"], *data["args"]])
    if data["action"] == "unchanged":
        # soft_wrap: a command line or path is never broken by a newline of rich's (a copied command must run)
        render.out().print(
            Text(f"drover is already registered with {where} in {data['path']}: {line} (nothing changed)"), soft_wrap=True
        )
    elif data["printed"]:
        verb = "replace the `drover` server " + shlex.join(data["previous"]) + " with" if data["previous"] else "register"
        render.out().print(Text(f"would {verb} {line} for {where}; nothing changed"), soft_wrap=True)
        for run in data["runs"]:
            render.out().print(Text(f"  would run: {run}"), soft_wrap=True)
        if entry is not None:
            render.out().print(Text(f"  would write {data['path']} ({data['engine']}'s CLI is not on PATH):"), soft_wrap=True)
            render.out().print(Text(entry), soft_wrap=True)
    else:
        how = f"through `{data['via']}`" if data["runs"] else f"by writing {data['path']} ({data['engine']}'s CLI is not on PATH)"
        render.out().print(Text(f"{data['action']} drover for {where} {how}: {line}"), soft_wrap=True)
    for note in data["notes"]:
        render.err().print(Text(f"note: {note}"), style="yellow")
