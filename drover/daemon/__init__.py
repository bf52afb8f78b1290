"""Persistent mode: a per-user daemon that keeps one SSH connection and live helpers per host.

`paths` (where the socket lives, and the checks that make it the user's alone), `protocol` (the framing) and
`client` (what the `drover` front calls) import the standard library only: the hot path of `drover send` must not
pay for typer, rich, pydantic or asyncssh.  `server` is the daemon itself and imports the whole of drover.
"""
