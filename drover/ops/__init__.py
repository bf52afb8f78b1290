"""The ops registry and the ops themselves; importing this package registers every op."""

from drover.ops import (  # noqa: F401 - registration side effect
    board,
    bots,
    broadcast,
    done,
    events,
    file_wait,
    fleet_check,
    fleet_edit,
    guard,
    handoff,
    messages,
    nudge,
    nudge_run,
    send,
    sessions,
    spawn,
    wait_many,
    watch,
)
from drover.ops.core import REGISTRY, Context, Document, describe, run, run_async

__all__ = ["REGISTRY", "Context", "Document", "describe", "run", "run_async"]
