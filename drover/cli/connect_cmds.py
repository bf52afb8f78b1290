"""`drover connect HOST`: open the user's OpenSSH master for a `transport = "openssh"` host, on this terminal."""

from __future__ import annotations

from typing import Annotated

import typer

from drover.cli import render
from drover.cli.app import ActorOpt, DebugOpt, FleetOpt, TimeoutOpt, app, common, context, examples
from drover.cli.completion import complete_hosts
from drover.errors import UsageError


@app.command("connect", epilog=examples("drover connect hpc-login", "drover connect hpc-login --print"))
def connect(
    host: Annotated[str, typer.Argument(help='a host of the fleet with transport = "openssh"', autocompletion=complete_hosts)],
    print_only: Annotated[bool, typer.Option("--print", help="print the ssh command instead of running it")] = False,
    fleet: FleetOpt = None,
    actor: ActorOpt = None,
    debug: DebugOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Open the OpenSSH master a `transport = "openssh"` host's calls ride: you type the second factor once (it is
    never stored); every later drover command reaches the host through the master, with no prompt."""
    from drover.fleet import LOCAL  # here: `--help` must not load pydantic

    common(fleet, actor, debug, timeout)
    ctx = context()
    cfg = ctx.fleet.host(host)
    if host == LOCAL and not cfg.ssh:
        raise UsageError("local is this machine: there is no master to open")
    if cfg.transport != "openssh":
        raise UsageError(
            f"{host} uses the asyncssh transport, which does not ride an OpenSSH master",
            hint=f'set transport = "openssh" under [hosts.{host}] in fleet.toml first',
        )
    from drover.transport.openssh_config import OpenSSHCommand
    from drover.transport.openssh_master import connect as open_master

    seconds = ctx.timeout_s or cfg.connect_timeout or ctx.fleet.defaults.connect_timeout
    ssh = OpenSSHCommand(host, cfg, seconds)
    if print_only:
        render.out().print(ssh.connect_line(), markup=False, highlight=False)
        return
    open_master(ssh, seconds, lambda line: render.err().print(line, markup=False, highlight=False))
