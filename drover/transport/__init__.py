"""How drover reaches a host's helper: in-process for `local`, over SSH for the others.

Every transport answers `call(op, args)` with the helper's data, or raises a DroverError naming the host.
One transport per host per invocation, shared by everything that host must do.
"""

from __future__ import annotations

from typing import Any, Protocol


class Transport(Protocol):
    host: str

    async def call(self, op: str, args: dict[str, Any], *, timeout: float) -> Any: ...

    async def close(self) -> None: ...
