"""`drover handoff HOST:OLD HOST:NEW`: record a handoff; `drover handoff --show HOST:NAME`: see a chain."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from drover.cli import render
from drover.cli.app import ActorOpt, DebugOpt, FleetOpt, JsonOpt, TimeoutOpt, app, common, examples, finish, run, session_target
from drover.cli.commands import TargetArg
from drover.errors import UsageError
from drover.remote import protocol as P


def _recorded(data: dict[str, Any]) -> None:
    old, new = data["from"], data["to"]
    gone = "" if data.get("old_live") else " (not live now)"
    render.out().print(
        Text.assemble(("handoff recorded", "bold green"), f": {old['host']}:{old['ref']}{gone} → {new['host']}:{new['ref']}")
    )
    chain = data.get("chain") or []
    if len(chain) > 2:
        render.out().print(Text("  chain: " + " → ".join(f"{g['host']}:{g.get('name') or g['ref']}" for g in chain), style="dim"))
    render.out().print(
        Text(
            f"  messages to {old['host']}:{old['ref']} go to it while it lives, then to the newest live generation",
            style="dim",
        )
    )


def _chain(data: dict[str, Any]) -> None:
    rows = data.get("chain") or []
    if not rows:
        render.out().print(f"{data['host']}:{data['id']} handed nothing over (no handoff starts there)", style="dim")
    else:
        table = Table(box=None, header_style="bold", pad_edge=False)
        for col in ("GEN", "HOST", "NAME", "ID", "STATE"):
            table.add_column(col)
        for i, r in enumerate(rows, 1):
            state = Text(r["state"], style="green" if r["live"] else "yellow")
            table.add_row(str(i), r["host"], r.get("name") or r["ref"], r.get("id") or "", state)
        render.out().print(table)
    goes = data.get("delivers_to")
    if goes:
        how = "redirected" if goes.get("redirected") else "not redirected"
        where = f"{goes['host']}:{goes.get('name') or goes['ref']}"
        render.out().print(f"a message to {data['host']}:{data['id']} goes to {where} ({how})")
    elif rows and (data.get("error") or {}).get("code") in (None, P.HANDOFF_BROKEN, P.SESSION_NOT_FOUND):
        render.err().print(f"a message to {data['host']}:{data['id']} would fail: no generation is live", style="yellow")


@app.command(
    "handoff", epilog=examples("drover handoff box-a:webapp-f8 box-a:webapp-f9", "drover handoff --show box-a:webapp-f8")
)
def handoff(
    old: TargetArg,
    new: Annotated[
        str | None, typer.Argument(help="HOST:ID of the live successor (HOST defaults to OLD's host)", show_default=False)
    ] = None,
    note: Annotated[str | None, typer.Option("--note", help="why, in a few words (kept in the record)")] = None,
    show: Annotated[bool, typer.Option("--show", help="show the chain that starts at OLD, and where a message goes")] = False,
    as_json: JsonOpt = False,
    fleet: FleetOpt = None,
    actor: ActorOpt = None,
    debug: DebugOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Record that OLD handed its work to NEW: messages to OLD reach NEW (or a newer generation) once OLD is gone.

    \b
      drover handoff box-a:ocean box-a:ocean-2     ocean's work now goes on in ocean-2
      drover handoff --show box-a:ocean            the chain, each generation live or gone
    A message is never redirected while the session it names is live.
    """
    common(fleet, actor, debug, timeout)
    o = session_target(old, "handoff")
    if show:
        if new is not None:
            raise UsageError("--show takes one session: drover handoff --show HOST:ID")
        finish(run("sessions.chain", {"host": o.host, "id": o.id}), as_json, _chain)
    if new is None:
        raise UsageError("name the successor: drover handoff HOST:OLD HOST:NEW (or --show HOST:OLD to see a chain)")
    # NEW without a host is on OLD's host (a bare "ocean-2" must not mean the local host when OLD is remote).
    n = session_target(new, "handoff")
    to_host = n.host if n.named_host else o.host
    payload = {"host": o.host, "id": o.id, "to_host": to_host, "to": n.id, "note": note, "actor": actor}
    finish(run("sessions.handoff", payload), as_json, _recorded)
