"""The fleet-wide commands: broadcast, board, wait-file -- and how each prints its document."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from drover.cli import render
from drover.cli.app import (
    VIA_HELP,
    ActorOpt,
    DebugOpt,
    FleetOpt,
    HostsOpt,
    JsonOpt,
    TagsOpt,
    TimeoutOpt,
    WaitTimeoutOpt,
    app,
    common,
    examples,
    finish,
    read_text,
    run,
)
from drover.cli.completion import complete_engines, complete_hosts


# -- broadcast ---------------------------------------------------------------------------------------------------
@app.command(
    "broadcast",
    epilog=examples(
        "drover broadcast --tag gpu 'freeze merges until 5pm'", "drover broadcast --all --engine claude 'stand-up in 5'"
    ),
)
def broadcast(
    text: Annotated[str, typer.Argument(help="the message, or - to read it from stdin (after --, a text may start with -)")],
    host: HostsOpt = None,
    tag: TagsOpt = None,
    engine: Annotated[
        list[str] | None,
        typer.Option(
            "--engine", "-e", metavar="ENGINE", help="only sessions running this engine (once)", autocompletion=complete_engines
        ),
    ] = None,
    name: Annotated[
        list[str] | None, typer.Option("--name", metavar="GLOB", help="only sessions whose name matches this glob (once)")
    ] = None,
    cwd: Annotated[
        list[str] | None, typer.Option("--cwd", metavar="GLOB", help="only sessions whose directory matches this glob (once)")
    ] = None,
    all_: Annotated[bool, typer.Option("--all", help="every agent session of the fleet (needed without a selector)")] = False,
    via: Annotated[str, typer.Option("--via", help=VIA_HELP)] = "auto",
    as_json: JsonOpt = False,
    fleet: FleetOpt = None,
    actor: ActorOpt = None,
    debug: DebugOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """The same message to every agent session a selector matches; sessions waiting on a human are skipped.

    A session in a dialog, in Claude's `waiting`, or with a person's draft in its input is skipped and recorded as
    refused (waiting_on_human), so `drover log` shows every session meant. Each delivery is a `drover send` of its
    own: its own id, limits, record and guard. One row per session, one summary line; the exit code is the worst
    outcome's (a skip counts as refused, 4). A selector (--host, --tag, --engine, --name, --cwd) or --all is required.
    """
    common(fleet, actor, debug, timeout)
    payload: dict[str, Any] = {
        "text": read_text(text),
        "hosts": host or None,
        "tags": tag or None,
        "engine": _one("--engine", engine),
        "name": _one("--name", name),
        "cwd": _one("--cwd", cwd),
        "all": all_,
        "via": via,
    }
    doc = run("sessions.broadcast", payload)
    finish(doc, as_json, broadcast_table)


def _one(option: str, given: list[str] | None) -> str | None:
    """One value of an option that takes one: a second is refused, never silently the only one kept."""
    if given and len(given) > 1:
        from drover.errors import UsageError

        many = (
            "one engine per broadcast: broadcast once per engine"
            if option == "--engine"
            else "one glob can match many ('worker-*')"
        )
        raise UsageError(
            f"{option} given {len(given)} times: give it once", hint=f"{many}; --host and --tag are the repeatable selectors"
        )
    return given[0] if given else None


def _who(row: dict[str, Any]) -> str:
    session = row.get("session") or {}
    if not session:
        return "-"
    name, sid = session.get("name") or "", session.get("id") or row.get("target") or ""
    sid = sid[:8] if len(sid) > 12 else sid
    return f"{name} ({sid})" if name and name != sid else sid


def broadcast_table(data: dict[str, Any]) -> None:
    rows = data.get("messages", [])
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("HOST", "SESSION", "ENGINE", "OUTCOME", "DETAIL", "MESSAGE"):
        table.add_column(col, no_wrap=col != "DETAIL", overflow="fold")
    for r in rows:
        outcome = r.get("outcome") or "pending"
        style = "yellow" if outcome == "skipped" else render.OUTCOME_STYLE.get(outcome, "")
        table.add_row(
            r["host"],
            _who(r),
            (r.get("session") or {}).get("engine") or "-",
            Text(outcome, style=style),
            r.get("detail") or "",
            r.get("id") or "-",
        )
    if rows:
        render.out().print(table)
    ok = {"delivered", "queuedBehindTurn"}
    everyone = rows and all(r.get("outcome") in ok for r in rows)
    render.out().print(Text(data.get("summary", "")), style="green" if everyone else "")
    _warn(data)


def _warn(data: dict[str, Any]) -> None:
    for w in data.get("warnings", []):
        where = f"{w['host']}: " if isinstance(w, dict) and w.get("host") else ""
        said = w.get("message", w) if isinstance(w, dict) else w
        render.err().print(Text(f"warning: {where}{said}"), style="yellow")


# -- board -------------------------------------------------------------------------------------------------------
@app.command("board", epilog=examples("drover board", "drover board --tag gpu --json"))
def board(
    host: HostsOpt = None,
    tag: TagsOpt = None,
    held_since: Annotated[str | None, typer.Option("--held-since", help="held messages since: 2h, 7d, or an ISO time")] = None,
    as_json: JsonOpt = False,
    fleet: FleetOpt = None,
    actor: ActorOpt = None,
    debug: DebugOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Who is waiting on a human across the fleet, oldest first: sessions in a dialog or in Claude's `waiting` (what
    for, since when), and messages a receiver holds for its human's approval."""
    common(fleet, actor, debug, timeout)
    doc = run("board", {"hosts": host or None, "tags": tag or None, "held_since": held_since})
    finish(doc, as_json, board_tables)


def board_tables(data: dict[str, Any]) -> None:
    waiting, held = data.get("waiting", []), data.get("held", [])
    if waiting:
        table = Table(box=None, header_style="bold", pad_edge=False, title="waiting on a human", title_justify="left")
        for col in ("SINCE", "HOST", "SESSION", "ENGINE", "STATE", "WHAT FOR"):
            table.add_column(col, no_wrap=col != "WHAT FOR", overflow="fold")
        for w in waiting:
            sid = str(w.get("id") or "")
            sid = sid[:8] if len(sid) > 12 else sid
            who = f"{w.get('name')} ({sid})" if w.get("name") and w.get("name") != sid else sid
            since = render.ago(w.get("since")) + (" (first seen)" if w.get("since_source") == "first_seen" else "")
            table.add_row(
                since,
                w["host"],
                who,
                w.get("engine") or "-",
                Text(w.get("screen_state") or w["state"], style="yellow"),
                w.get("reason") or "",
            )
        render.out().print(table)
    if held:
        table = Table(box=None, header_style="bold", pad_edge=False, title="held for approval", title_justify="left")
        for col in ("SENT", "MESSAGE", "TO", "FROM", "DETAIL"):
            table.add_column(col, no_wrap=col != "DETAIL", overflow="fold")
        for h in held:
            table.add_row(
                render.ago(h.get("ts")), h["id"], f"{h['host']}:{h['target']}", h.get("actor") or "", h.get("detail") or ""
            )
        render.out().print(table)
    if not waiting and not held:
        asked = data.get("hosts", [])
        answered = [h for h in asked if h.get("ok")]
        if not asked:
            line = "no host was asked"
        elif not answered:
            line = f"no host answered ({len(asked)} host(s) asked): who waits there is unknown"
        elif len(answered) < len(asked):
            line = f"nobody is waiting on a human on the hosts that answered ({len(answered)} of {len(asked)} host(s))"
        else:
            line = f"nobody is waiting on a human ({len(asked)} host(s) asked)"
        render.out().print(line, style="dim")
    _warn(data)


# -- wait-file ---------------------------------------------------------------------------------------------------
@app.command("wait-file", epilog=examples("drover wait-file box-a /srv/work/status.json --changed --timeout 3600"))
def wait_file(
    host_name: Annotated[
        str,
        typer.Argument(metavar="HOST", help="the host the file is on (local for this machine)", autocompletion=complete_hosts),
    ],
    path: Annotated[str, typer.Argument(help="the file: absolute, ~/..., or relative to the home directory there")],
    changed: Annotated[bool, typer.Option("--changed", help="wait for a change even if the file exists now")] = False,
    exists: Annotated[bool, typer.Option("--exists", help="wait until the file exists (the default)")] = False,
    timeout: WaitTimeoutOpt = 600.0,
    poll: Annotated[bool, typer.Option("--poll", help="look with stat, not inotify (e.g. NFS written from elsewhere)")] = False,
    as_json: JsonOpt = False,
    fleet: FleetOpt = None,
    actor: ActorOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Block until a file on a host exists (or, with --changed, changes); how a coordinator waits on status files.

    The host does the waiting (inotify on Linux, seeing a file renamed into place, written and closed, or
    touched; a bounded poll elsewhere); nothing polls over SSH. Exit 0 with the event (exists, created, changed),
    9 on timeout, 6 when the file's directory does not exist or cannot be looked into.
    """
    common(fleet, actor, debug)
    if changed and exists:
        from drover.errors import UsageError

        raise UsageError("--changed and --exists ask different things: give one", hint="--exists is the default")
    doc = run("files.wait", {"host": host_name, "path": path, "changed": changed, "timeout_s": timeout, "poll": poll})
    finish(doc, as_json, waited_file)


def waited_file(data: dict[str, Any]) -> None:
    if data.get("reached"):  # a timeout is said by its error line
        # One line, whatever the path holds: a newline in a name is shown (␤), not printed.
        where = render.safe(f"{data['host']}:{data.get('path')}").replace("\n", "\u2424")
        size = data.get("size")
        how = f"after {data.get('waited_s', 0):.1f}s; {data.get('how')}"
        render.out().print(Text(f"{where} {data['event']} ({size} bytes; {how})"))
