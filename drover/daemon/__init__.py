"""Persistent mode: a per-user daemon that keeps one SSH connection and live helpers per host.

`paths` (where the socket lives, and the checks that make it the user's alone), `protocol` (the framing) and
`client` (what the `drover` front calls) import the standard library only: the hot path of `drover send` must not
pay for typer, rich, pydantic or asyncssh.  `server` is the daemon itself (the socket, its checks, idle exit),
`run` one command run for one client in a thread of its own, `pool` the per-host connections and long-lived
helpers they share; those import the whole of drover.
"""
