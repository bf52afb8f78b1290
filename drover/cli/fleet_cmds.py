"""`drover fleet show | add | remove`: the inventory, read and written through drover.fleet."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from drover.cli import render
from drover.cli.main import JsonOpt, fleet_app, state
from drover.errors import UsageError


def _path() -> Any:
    from drover import fleet as fleet_mod

    path, _named = fleet_mod.find_path(state.fleet)
    return path


@fleet_app.command("show")
def show(as_json: JsonOpt = False) -> None:
    """Validate the fleet file and show its hosts (with none, the built-in fleet: just `local`)."""
    from drover import fleet as fleet_mod

    fleet, path = fleet_mod.load(state.fleet)
    if as_json:
        render.print_json({"drover": 1, "path": str(path) if path else None, "fleet": fleet.model_dump(mode="json")})
        return
    render.out.print(f"fleet file: {path or '(none: the built-in fleet, ' + str(fleet_mod.default_path()) + ' not found)'}")
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("HOST", "SSH", "USER", "PORT", "PYTHON", "TAGS"):
        table.add_column(col)
    for name in fleet.host_names():
        h = fleet.host(name)
        ssh = "(this machine)" if name == fleet_mod.LOCAL and not h.ssh else (h.ssh or name)
        table.add_row(name, ssh, h.user or "-", str(h.port or "-"), h.python, ",".join(h.tags) or "-")
    render.out.print(table)
    d, lim = fleet.defaults, fleet.limits
    render.out.print(
        f"limits: {lim.max_chars:,} chars, burst {lim.bucket_size} then {lim.bucket_refill_per_s:g}/s, "
        f"duplicates refused within {lim.duplicate_window_s:g}s · timeouts: connect {d.connect_timeout:g}s, "
        f"request {d.request_timeout:g}s · concurrency {d.concurrency}",
        style="dim",
    )
    if fleet.engines:
        render.out.print("engine profiles overridden: " + ", ".join(sorted(fleet.engines)), style="dim")


@fleet_app.command("add")
def add(
    name: Annotated[str, typer.Argument(help="the host's name in drover (letters, digits, . _ -)")],
    ssh: Annotated[str | None, typer.Option("--ssh", help="ssh target: hostname or ~/.ssh/config alias (default: NAME)")] = None,
    user: Annotated[str | None, typer.Option("--user", help="ssh user")] = None,
    port: Annotated[int | None, typer.Option("--port", help="ssh port")] = None,
    identity: Annotated[str | None, typer.Option("--identity", help="private key file")] = None,
    proxy_jump: Annotated[str | None, typer.Option("--proxy-jump", help="jump host, as for ssh -J")] = None,
    python: Annotated[str | None, typer.Option("--python", help="python3 path on the host")] = None,
    tag: Annotated[list[str] | None, typer.Option("--tag", help="a tag (repeatable)")] = None,
    accept_new: Annotated[bool, typer.Option("--accept-new", help="trust the host key on first use")] = False,
    replace: Annotated[bool, typer.Option("--replace", help="overwrite an existing host of that name")] = False,
) -> None:
    """Add a host to the fleet file (created if missing)."""
    from drover import fleet as fleet_mod

    path = _path()
    data = fleet_mod.read_raw(path)
    hosts = data.setdefault("hosts", {})
    if name in hosts and not replace:
        raise UsageError(f"host {name!r} is already in {path}", hint="use --replace to overwrite it")
    entry: dict[str, Any] = {"ssh": ssh or name}
    for key, value in (("user", user), ("port", port), ("identity", identity), ("proxy_jump", proxy_jump), ("python", python)):
        if value is not None:
            entry[key] = value
    if tag:
        entry["tags"] = list(tag)
    if accept_new:
        entry["accept_new"] = True
    hosts[name] = entry
    fleet_mod.write_raw(path, data)
    render.out.print(f"added {name} to {path}")


@fleet_app.command("remove")
def remove(name: Annotated[str, typer.Argument(help="the host to remove")]) -> None:
    """Remove a host from the fleet file."""
    from drover import fleet as fleet_mod

    path = _path()
    data = fleet_mod.read_raw(path)
    if name not in data.get("hosts", {}):
        from drover.errors import UnknownHost

        raise UnknownHost(f"host {name!r} is not in {path}")
    del data["hosts"][name]
    fleet_mod.write_raw(path, data)
    render.out.print(f"removed {name} from {path}")


@fleet_app.command("check")
def check(
    host: Annotated[list[str] | None, typer.Option("--host", "-H", help="only this host (repeatable)")] = None,
    tag: Annotated[list[str] | None, typer.Option("--tag", "-t", help="only hosts with this tag (repeatable)")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Per host: reachable, host key, auth, python, tmux, engines found, round-trip time. Broken hosts are named."""
    from drover.cli.main import finish, run

    doc = run("fleet.check", {"hosts": host or None, "tags": tag or None})
    finish(doc, as_json, render.fleet_check)
