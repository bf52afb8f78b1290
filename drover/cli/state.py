"""One invocation's state: what it was told (--fleet, --actor, --debug, --timeout), the Environment it was handed,
and the one Context its commands share.  Below every CLI module (render included), above nothing of the CLI's."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from drover.environment import Environment

if TYPE_CHECKING:
    from drover.ops.core import Context


class State(threading.local):
    """Per thread: the daemon (drover/daemon/server.py) runs several invocations at once, one thread each, each
    with the Environment it built for its caller."""

    def __init__(self) -> None:
        self.env: Environment | None = None
        self.reset()

    def reset(self, env: Environment | None = None) -> None:
        self.fleet: str | None = None
        self.actor: str | None = None
        self.debug = False
        self.timeout: float | None = None
        self.ctx: Context | None = None
        self.env = env
        self.argv: list[str] = []  # the words it was given, as typed (click drops a `--` from what it parses)


state = State()


def environment() -> Environment:
    """The running invocation's Environment; outside one (a renderer called on its own), this process's."""
    return state.env if state.env is not None else Environment.from_process()
