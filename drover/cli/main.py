"""The `drover` program: every command module, registered on the app of `drover.cli.app`, and `main(argv, env)`
(drover/cli/program.py) to run it.  The top of the CLI: nothing imports this module but the front."""

from __future__ import annotations

from drover.cli import (  # noqa: F401 - importing a command module registers it
    bot_cmds,
    commands,
    connect_cmds,
    daemon_cmds,
    demo,
    done_cmds,
    events_cmds,
    fleet_cmds,
    fleetwide_cmds,
    handoff_cmds,
    mcp_cmds,
    nudge_cmds,
    spawn_cmds,
    watch_cmds,
)
from drover.cli.program import main

__all__ = ["main"]
