"""The ops registry and the ops themselves; importing this package registers every op."""

from drover.ops import fleet_edit, fleet_ops, guard, messages, send, sessions  # noqa: F401 - registration side effect
from drover.ops.core import REGISTRY, Context, Document, describe, run, run_async

__all__ = ["REGISTRY", "Context", "Document", "describe", "run", "run_async"]
