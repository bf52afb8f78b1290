"""`drover fleet show | init | add | remove | check`: thin fronts over the fleet.* ops."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from drover.cli import render
from drover.cli.app import (
    ActorOpt,
    DebugOpt,
    FleetOpt,
    HostsOpt,
    JsonOpt,
    TagsOpt,
    TimeoutOpt,
    common,
    examples,
    finish,
    fleet_app,
    run,
)
from drover.cli.completion import complete_hosts


@fleet_app.command("show", epilog=examples("drover fleet show --json"))
def show(as_json: JsonOpt = False, fleet: FleetOpt = None, actor: ActorOpt = None, debug: DebugOpt = False) -> None:
    """Validate the fleet file and show its hosts (with none, the built-in fleet: just `local`)."""
    common(fleet, actor, debug)
    finish(run("fleet.show", {}), as_json, render.fleet_show)


@fleet_app.command(
    "init", epilog=examples("drover fleet init && $EDITOR ~/.config/drover/fleet.toml", "drover fleet init --print | less")
)
def init(
    force: Annotated[bool, typer.Option("--force", help="replace an existing fleet file")] = False,
    print_only: Annotated[bool, typer.Option("--print", help="print the commented example instead of writing it")] = False,
    as_json: JsonOpt = False,
    fleet: FleetOpt = None,
    actor: ActorOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Write a fleet file that documents every key, all commented out (a valid fleet: just `local`)."""
    common(fleet, actor, debug)

    def said(data: dict[str, Any]) -> None:
        if data.get("text") is not None:
            render.out().file.write(data["text"])
        else:
            render.out().print(f"wrote {data['path']}: every setting, commented out; `drover fleet show` checks it", markup=False)

    finish(run("fleet.init", {"force": force, "print_only": print_only}), as_json, said)


@fleet_app.command("add", epilog=examples("drover fleet add box-a --ssh box-a.example.com --user dev --tag gpu"))
def add(
    name: Annotated[str, typer.Argument(help="the host's name in drover (letters, digits, . _ -)")],
    ssh: Annotated[str | None, typer.Option("--ssh", help="ssh target: hostname or ~/.ssh/config alias (default: NAME)")] = None,
    user: Annotated[str | None, typer.Option("--user", help="ssh user")] = None,
    port: Annotated[int | None, typer.Option("--port", help="ssh port")] = None,
    identity: Annotated[str | None, typer.Option("--identity", help="private key file")] = None,
    proxy_jump: Annotated[str | None, typer.Option("--proxy-jump", help="jump host, as for ssh -J")] = None,
    python: Annotated[str | None, typer.Option("--python", help="python3 path on the host")] = None,
    tag: Annotated[list[str] | None, typer.Option("--tag", help="a tag (repeatable)")] = None,
    known_hosts: Annotated[str | None, typer.Option("--known-hosts", help="a known_hosts file checked as well")] = None,
    accept_new: Annotated[bool, typer.Option("--accept-new", help="trust the host key on first use")] = False,
    owner_relay: Annotated[bool, typer.Option("--owner-relay", help="allow --as-owner for this host")] = False,
    replace: Annotated[bool, typer.Option("--replace", help="overwrite an existing host of that name")] = False,
    as_json: JsonOpt = False,
    fleet: FleetOpt = None,
    actor: ActorOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Add a host to the fleet file (created if missing). Comments and layout are kept; an invalid result is refused."""
    common(fleet, actor, debug)
    payload: dict[str, Any] = {"name": name, "replace": replace}
    for key, value in (
        ("ssh", ssh),
        ("user", user),
        ("port", port),
        ("identity", identity),
        ("proxy_jump", proxy_jump),
        ("python", python),
        ("tags", tag or None),
        ("known_hosts", known_hosts),
        ("accept_new", accept_new or None),
        ("owner_relay", owner_relay or None),
    ):
        if value is not None:
            payload[key] = value

    def show_added(data: dict[str, Any]) -> None:
        if data.get("created"):
            render.out().print(f"created {data['path']} with {data['host']}", markup=False)
        else:
            render.out().print(f"added {data['host']} to {data['path']}", markup=False)

    finish(run("fleet.add", payload), as_json, show_added)


@fleet_app.command("remove", epilog=examples("drover fleet remove box-a"))
def remove(
    name: Annotated[str, typer.Argument(help="the host to remove", autocompletion=complete_hosts)],
    as_json: JsonOpt = False,
    fleet: FleetOpt = None,
    actor: ActorOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Remove a host from the fleet file (comments that describe it go with it; the others stay)."""
    common(fleet, actor, debug)

    def show_removed(data: dict[str, Any]) -> None:
        render.out().print(f"removed {data['host']} from {data['path']}", markup=False)

    finish(run("fleet.remove", {"name": name}), as_json, show_removed)


@fleet_app.command("check", epilog=examples("drover fleet check", "drover fleet check --host 'node[01-40]' --timeout 5"))
def check(
    host: HostsOpt = None,
    tag: TagsOpt = None,
    as_json: JsonOpt = False,
    fleet: FleetOpt = None,
    actor: ActorOpt = None,
    debug: DebugOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Per host: reachable, host key, auth, python, tmux, engines found, round-trip time. Broken hosts are named."""
    common(fleet, actor, debug, timeout)
    doc = run("fleet.check", {"hosts": host or None, "tags": tag or None})
    finish(doc, as_json, render.fleet_check)
