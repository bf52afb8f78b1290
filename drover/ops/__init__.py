"""The ops registry and the ops themselves.

Asking this package for its registry or its API (`from drover.ops import REGISTRY, Context, run, ...`) registers
every op, as importing it always did.  Importing one op's module (`drover.ops.core`, `drover.ops.send`) no longer
imports the others: a cold command that runs one op pays for its module alone (drover/ops/loader.py), not for
every op's pydantic models (~40 ms).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from drover.ops.core import REGISTRY, Context, Document, describe, run, run_async

__all__ = ["REGISTRY", "Context", "Document", "describe", "register_all", "run", "run_async"]

# Every module of drover/ops that registers an op (drover/ops/loader.py names the op each one registers).
OP_MODULES = (
    "board",
    "bots",
    "broadcast",
    "done",
    "events",
    "file_wait",
    "fleet_check",
    "fleet_edit",
    "guard",
    "handoff",
    "messages",
    "nudge",
    "nudge_run",
    "send",
    "sessions",
    "spawn",
    "wait_many",
    "watch",
)
_API = frozenset(["REGISTRY", "Context", "Document", "describe", "run", "run_async"])


def register_all() -> None:
    """Import every op module: each registers its ops in drover.ops.core.REGISTRY."""
    for module in OP_MODULES:
        importlib.import_module(f"drover.ops.{module}")


def __getattr__(name: str) -> Any:
    # Only the API registers everything: the import system asks for submodules (`from drover.ops import sightings`)
    # through here too, and must hear "no such attribute" to go and import the submodule itself.
    if name not in _API:
        raise AttributeError(f"module 'drover.ops' has no attribute {name!r}")
    register_all()
    from drover.ops import core

    value = getattr(core, name)
    globals()[name] = value
    return value
