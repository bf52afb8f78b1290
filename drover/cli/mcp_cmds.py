"""`drover mcp serve` and `drover mcp install`: the MCP front (drover/mcp/).  Both import the SDK only when run,
so `drover --help` stays fast."""

from __future__ import annotations

import typer

from drover.cli.app import app, examples

mcp_app = typer.Typer(
    help="drover as an MCP server for agents: serve it over stdio, or register it with Claude Code or Codex.",
    no_args_is_help=True,
    epilog=examples("drover mcp install claude --scope user", "drover mcp install codex --print", "drover mcp serve"),
)
app.add_typer(mcp_app, name="mcp")
