"""fleet.show / fleet.init / fleet.add / fleet.remove: read and edit `fleet.toml`, keeping its comments.

The edits themselves (tomlkit, the lock, the validation, the atomic replace) live in `drover.fleet`; these ops
name what to change and answer the standard document.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from drover import fleet as fleet_mod
from drover import fleet_editor
from drover.ops.core import Context, Request, Result, op


class ShowRequest(Request):
    pass


class AddRequest(Request):
    # Values are checked by the fleet's own model after the edit (an invalid one is exit 7, the file untouched),
    # so the request only needs their types.
    name: str = Field(..., description="the host's name in drover (letters, digits, '.', '_', '-')")
    ssh: str | None = Field(None, description="ssh target: hostname or ~/.ssh/config alias (default: the name)")
    user: str | None = Field(None, description="ssh user")
    port: int | None = Field(None, description="ssh port")
    identity: str | None = Field(None, description="private key file")
    proxy_jump: str | None = Field(None, description="jump host, as for ssh -J")
    python: str | None = Field(None, description="the python3 on the host")
    tags: list[str] | None = Field(None, description="tags, for selecting hosts")
    known_hosts: str | None = Field(None, description="a known_hosts file checked as well as ~/.ssh/known_hosts")
    accept_new: bool | None = Field(None, description="trust the host key on first use")
    owner_relay: bool | None = Field(None, description="allow --as-owner for this host")
    connect_timeout: float | None = Field(None, description="seconds to connect (default: [defaults])")
    request_timeout: float | None = Field(None, description="seconds per request (default: [defaults])")
    replace: bool = Field(False, description="overwrite a host of that name (its other keys are dropped)")


class InitRequest(Request):
    force: bool = Field(False, description="replace an existing fleet file")
    print_only: bool = Field(False, description="answer the example's text instead of writing it")


class RemoveRequest(Request):
    name: str = Field(..., description="the host to remove")


@op("fleet.show", ShowRequest, "the fleet, validated: its file, hosts, limits and timeouts", "drover fleet show")
async def fleet_show(ctx: Context, req: ShowRequest) -> Result:
    fleet = ctx.fleet  # invalid -> FleetInvalid (exit 7) with every problem and its line
    return Result(
        {
            "path": str(ctx.fleet_file) if ctx.fleet_file else None,
            "default_path": str(fleet_mod.default_path()),
            "hosts": fleet.host_names(),
            "fleet": fleet.model_dump(mode="json"),
        }
    )


@op("fleet.init", InitRequest, "write a commented fleet.toml documenting every key", "drover fleet init")
async def fleet_init(ctx: Context, req: InitRequest) -> Result:
    if req.print_only:
        return Result({"path": None, "text": fleet_editor.commented_example()})
    fleet, path, created = fleet_editor.edit(ctx.fleet_path, lambda text, p: fleet_editor.init(text, p, req.force))
    ctx.forget_fleet()
    return Result({"path": str(path), "created": created, "hosts": fleet.host_names()})


@op("fleet.add", AddRequest, "add a host to fleet.toml (created if missing), keeping its comments", "drover fleet add")
async def fleet_add(ctx: Context, req: AddRequest) -> Result:
    entry: dict[str, Any] = {"ssh": req.ssh or req.name}
    for key in AddRequest.model_fields:
        value = getattr(req, key)
        if key not in ("name", "ssh", "replace") and value not in (None, []):
            entry[key] = value
    # `created` is decided under the fleet's lock: of two concurrent adds to a missing file, one created it.
    fleet, path, created = fleet_editor.edit(
        ctx.fleet_path, lambda text, p: fleet_editor.add_host(text, p, req.name, entry, req.replace)
    )
    ctx.forget_fleet()
    return Result({"path": str(path), "created": created, "host": req.name, "entry": entry, "hosts": fleet.host_names()})


@op("fleet.remove", RemoveRequest, "remove a host from fleet.toml, keeping its comments", "drover fleet remove")
async def fleet_remove(ctx: Context, req: RemoveRequest) -> Result:
    # A missing file has no host to remove: that is said (exit 6) without creating its directory or lock file.
    fleet, path, _created = fleet_editor.edit(
        ctx.fleet_path, lambda text, p: fleet_editor.remove_host(text, p, req.name), create=False
    )
    ctx.forget_fleet()
    return Result({"path": str(path), "host": req.name, "hosts": fleet.host_names()})
