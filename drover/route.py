"""A host resolved once: everything a command needs to know about reaching one host, looked up in the fleet once.

A send used to ask the fleet for its host's entry five times from four places (the send itself, the handoff
lookup, the transport, every request's timeout) and decide "local or SSH?" twice.  A `Route` is made once per host
per command (`Context.route`) and read by all of them: the send (owner relay, raw), handoffs, the transports and
the fan-outs (broadcast, board, ls).  It is a plain frozen value built from the fleet alone, so that a later choice
(which SSH transport a host uses) is one more field here, not another lookup where it is used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from drover.fleet import LOCAL, Defaults, Fleet, HostConfig


@dataclass(frozen=True)
class Route:
    host: str
    # The host's entry as the fleet file wrote it (the daemon's pool keys its connections by it).
    config: HostConfig
    # The same entry as this command's SSH transport connects with: a --timeout is its connect timeout.
    ssh_config: HostConfig
    defaults: Defaults
    # `local` with no ssh target: the helper runs in this process, no SSH.
    local: bool
    connect_timeout: float
    # How long one request to the host may take (a persistent connection's request includes its connecting).
    request_timeout: float
    owner_relay: bool
    # The sessions (as addressed) that run no agent but may get raw text at a shell prompt.
    raw: tuple[str, ...]
    # The fleet's engine profile overrides, sent with every helper request.  Read, never changed: a transport is
    # handed a copy.
    profiles: dict[str, Any]

    @classmethod
    def of(cls, fleet: Fleet, host: str, timeout_s: float | None = None) -> Route:
        """Resolve `host` in `fleet` (an unknown host raises UnknownHost); `timeout_s`: the command's --timeout,
        every connect and request timeout of this command whatever the fleet says."""
        cfg = fleet.host(host)
        defaults = fleet.defaults
        ssh_cfg = cfg if timeout_s is None else cfg.model_copy(update={"connect_timeout": timeout_s})
        return cls(
            host=host,
            config=cfg,
            ssh_config=ssh_cfg,
            defaults=defaults,
            local=host == LOCAL and not cfg.ssh,
            connect_timeout=ssh_cfg.connect_timeout or defaults.connect_timeout,
            request_timeout=timeout_s if timeout_s is not None else cfg.request_timeout or defaults.request_timeout,
            owner_relay=cfg.owner_relay,
            raw=tuple(cfg.raw),
            profiles=fleet.profile_overrides(),
        )

    def raw_ok(self, ref: str) -> bool:
        """Whether the fleet lets the session addressed as `ref` get raw text (without --raw)."""
        return ref in self.raw
