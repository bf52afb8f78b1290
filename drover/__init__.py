"""drover: deliver text to AI coding-agent sessions anywhere in a fleet, safely, with a record.

The library is the ops registry; the CLI, `drover op` and MCP are thin fronts over it (drover/api.py):

    import drover
    doc = drover.run("sessions.message", host="local", id="%3", text="rebase on master")
    doc["ok"], doc["data"]["outcome"]          # the document `drover op` prints, as a dict (also doc.ok, doc.data)
    doc = await drover.arun("sessions.wait", host="h1", id="worker-1")
    with drover.Client(actor="coordinator") as c: ...
    async with drover.AsyncClient(actor="coordinator") as c: ...
"""

from __future__ import annotations

# Not `from typing import ...`: the `drover` front imports this package on every run, and typing costs it ~3 ms.
# For the same reason drover.api (pydantic, the ops) is imported on first use, not here.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from drover.api import AsyncClient, Client, Reply

__version__ = "0.2.0"


def run(op: str, args: dict[str, Any] | None = None, /, **fields: Any) -> Reply:
    """Run one op and return its document: {"drover": 1, "op", "ok", "data", "errors"} (a dict; `.ok`, `.data`,
    `.errors` and `.exit_code` too).  The request is a dict, keyword arguments, or both.  SSH connections are kept
    for the next call (a running daemon's, else this process's own); works inside a running event loop too."""
    from drover import api

    return api.run(op, args, **fields)


async def arun(op: str, args: dict[str, Any] | None = None, /, **fields: Any) -> Reply:
    """drover.run for async code: the same arguments and document, awaited; the caller's loop goes on meanwhile."""
    from drover import api

    return await api.arun(op, args, **fields)


def close() -> None:
    """Close the connections drover.run and drover.arun keep (the next call opens new ones); also done at exit."""
    import sys

    if "drover.api" in sys.modules:
        # Imported again rather than read from sys.modules: another thread's first drover.run may be importing
        # it right now, and the import waits for that to finish instead of finding a module without close() yet.
        from drover import api

        api.close()


def terminal_columns() -> int:
    """The terminal's width as shutil.get_terminal_size would say it (shutil itself costs an import).  Here, below
    both, because the front (drover/front.py, for --help) and the daemon's client (drover/daemon/client.py, for the
    request it sends) each need it; not part of the library's API (__all__)."""
    import os
    import sys

    try:
        cols = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        cols = 0
    if cols <= 0:
        try:
            cols = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            cols = 0
    return cols or 80


def __getattr__(name: str) -> Any:
    # drover.Client, drover.AsyncClient and drover.Reply, imported when first named.
    if name in ("Client", "AsyncClient", "Reply"):
        from drover import api

        return getattr(api, name)
    raise AttributeError(f"module 'drover' has no attribute {name!r}")


__all__ = ["AsyncClient", "Client", "Reply", "__version__", "arun", "close", "run"]
