"""drover: deliver text to AI coding-agent sessions anywhere in a fleet, safely, with a record.

The library is the ops registry; the CLI, `drover op` and MCP are thin fronts over it:

    import drover
    doc = drover.run("sessions.message", {"host": "local", "id": "%3", "text": "rebase on master"})
    doc.ok, doc.data["outcome"]
"""

from __future__ import annotations

# Not `from typing import ...`: the `drover` front imports this package on every run, and typing costs it ~3 ms.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__version__ = "0.1.0"


def run(name: str, payload: dict[str, Any] | str | None = None, **context: Any) -> Any:
    """Run one op and return its Document (`.ok`, `.data`, `.errors`, `.exit_code`, `.to_dict()`)."""
    from drover.ops import Context
    from drover.ops import run as run_op

    return run_op(name, payload, Context(**context))


__all__ = ["__version__", "run"]
