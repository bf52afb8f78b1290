"""`drover mcp serve` and `drover mcp install`: the MCP front (drover/mcp/).  Both import the SDK only when run,
so `drover --help` stays fast."""

from __future__ import annotations

from typing import Annotated

import typer

from drover.cli.app import FleetOpt, app, common, examples

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
