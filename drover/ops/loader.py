"""One op without the others: `load(name)` imports only the module that registers it.

Importing the `drover.ops` package registers every op, and each op module builds its pydantic request models as it
is imported -- ~60 ms of a cold command that runs one op.  The CLI's `run` (drover/cli/app.py) asks for its op
here; an op this table does not name (unknown, or added without a line here) imports them all, so the unknown-op
error lists every op as before.  tests/test_coldstart.py checks the table against the registry the package fills.
"""

from __future__ import annotations

import importlib

from drover.ops.core import REGISTRY

# Every op, by the module of drover/ops that registers it.
MODULES = {
    "board": "board",
    "bots.pass_on": "bots",
    "events.read": "events",
    "files.wait": "file_wait",
    "fleet.add": "fleet_edit",
    "fleet.check": "fleet_check",
    "fleet.init": "fleet_edit",
    "fleet.remove": "fleet_edit",
    "fleet.show": "fleet_edit",
    "guard.check": "guard",
    "messages.get": "messages",
    "messages.list": "messages",
    "messages.retry": "send",
    "messages.verify": "send",
    "nudge.run": "nudge_run",
    "sessions.broadcast": "broadcast",
    "sessions.chain": "handoff",
    "sessions.done": "done",
    "sessions.handoff": "handoff",
    "sessions.list": "sessions",
    "sessions.message": "send",
    "sessions.nudge": "nudge",
    "sessions.read": "sessions",
    "sessions.spawn": "spawn",
    "sessions.spawns": "spawn",
    "sessions.status": "sessions",
    "sessions.wait": "sessions",
    "sessions.wait_many": "wait_many",
    "watch.run": "watch",
}


def load(name: str) -> None:
    """Make sure the op `name` is registered (when it exists): its own module, else every op."""
    if name in REGISTRY:
        return
    module = MODULES.get(name) if isinstance(name, str) else None
    if module is not None:
        importlib.import_module(f"drover.ops.{module}")
    if name not in REGISTRY:
        from drover.ops import register_all

        register_all()
