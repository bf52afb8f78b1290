"""`drover events [--follow]`: the record as JSON lines, each event with its own cursor; and how `drover wait A B C
--any|--all` prints its answer (the command itself is `wait`, in commands.py: one session keeps its old path).

--follow asks events.read again and again with `wait_s`, from the cursor the last answer gave: each answer comes
as soon as an event is written (the op looks at the record's size every 0.2 s; a stat, no reading), so a follower
costs nothing while the record is quiet.  A reader that goes away (`| head -3`) ends the follower quietly, exit 0.
"""

from __future__ import annotations

import json
import os
from typing import Annotated, Any

import typer
from rich.text import Text

from drover.cli import render
from drover.cli.app import ActorOpt, DebugOpt, FleetOpt, JsonOpt, app, common, examples, finish, run
from drover.cli.state import environment
from drover.environment import Environment
from drover.errors import UsageError
from drover.lifecycle import READ_LIMIT

# One request of a follower; the next starts where it ended.  Short, so a reader gone while the record is quiet
# (`| head -3` after its third line) is noticed within it: between two requests, stdout is looked at.
FOLLOW_WAIT_S = 1.0


def _line(item: dict[str, Any]) -> str:
    ev = item["event"]
    session = ev.get("session") if isinstance(ev.get("session"), dict) else {}
    who = ev.get("target") or session.get("name") or session.get("id") or ev.get("name") or session.get("identity") or ""
    where = f"{ev.get('host')}:{who}" if ev.get("host") else str(who)
    extra = ev.get("outcome") or ev.get("summary") or ""
    if ev.get("event") in ("chat", "callback_refused"):  # a bot's reply (its words are data), or a refused callback
        where = f"bot:{ev.get('bot')}"
        extra = f"[untrusted] re {ev.get('in_reply_to')}" if ev.get("event") == "chat" else str(ev.get("reason"))
    stamp = (ev.get("time") or "")[:19].replace("T", " ")
    return f"{stamp}  {ev.get('event', '?'):<15} {where}  {ev.get('id', '')}  {extra}".rstrip() + f"  @{item['cursor']}"


def _quiet_stdout(env: Environment) -> None:
    """The reader is gone: point stdout at /dev/null so the interpreter's last flush does not complain at exit."""
    try:
        fd = env.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def _reader_gone(env: Environment) -> bool:
    """The other end of stdout closed (a pipe's reader exited): poll reports an error on our end, nothing written."""
    import select

    try:
        poller = select.poll()
        poller.register(env.stdout.fileno(), 0)  # no events asked for: errors and hang-ups are always reported
        return bool(poller.poll(0))
    except (AttributeError, OSError, ValueError):  # not a real descriptor (a test's buffer)
        return False


def _fail(doc: Any) -> None:
    """An error ends the stream: one line on stderr (stdout holds only events, even with --json), its exit code."""
    render.errors(doc)
    raise typer.Exit(doc.exit_code or 1)


def _emit(items: list[dict[str, Any]], as_json: bool) -> None:
    env = environment()
    try:
        for item in items:
            if as_json:
                env.stdout.write(json.dumps(item, ensure_ascii=False, separators=(",", ":")) + "\n")
            else:
                render.out().print(Text(render.safe(_line(item))), soft_wrap=True)
        env.stdout.flush()
    except BrokenPipeError:
        _quiet_stdout(env)
        raise typer.Exit(0) from None


@app.command(
    "events",
    epilog=examples(
        "drover events -n 5",
        "drover events --follow --kind done --kind exited --json",
        "drover events --since 2163175:8623 --json",
    ),
)
def events(
    follow: Annotated[bool, typer.Option("--follow", "-f", help="print events as they are written (Ctrl-C ends it)")] = False,
    since: Annotated[
        str | None, typer.Option("--since", metavar="CURSOR", help="a cursor drover printed (INODE:OFFSET), start or end")
    ] = None,
    limit: Annotated[
        int | None,
        typer.Option("-n", "--limit", min=1, max=10000, help="the last N events (default 20); with --since: at most N"),
    ] = None,
    kinds: Annotated[
        list[str] | None, typer.Option("--kind", help="only events of this kind (accepted, outcome, spawned, done, spawn*)")
    ] = None,
    as_json: JsonOpt = False,
    fleet: FleetOpt = None,
    actor: ActorOpt = None,
    debug: DebugOpt = False,
) -> None:
    """The record's events (messages, outcomes, spawns, handoffs, done/failed/exited/stalled), each with its cursor.

    Without --since: the last N. With --since: every event from the cursor on (at most N with -n; then stderr says
    where to read on). With --follow: from the end (or after the last N, with -n), then each event as it is
    written. A follower killed and restarted with `--since` and the last cursor it printed misses and repeats nothing.
    """
    common(fleet, actor, debug)
    kinds = kinds or None
    if not follow and since is None:
        doc = run("events.read", {"limit": limit or 20, "kinds": kinds})
        if doc.data is None or doc.errors:
            _fail(doc)
        _emit(doc.data["events"], as_json)
        raise typer.Exit(doc.exit_code)
    if not follow:
        _since(since, limit, kinds, as_json)
    cursor = since
    if cursor is None:
        if limit is None:
            cursor = "end"
        else:  # tail -f: the last N first
            doc = run("events.read", {"limit": limit, "kinds": kinds})
            if doc.data is None or doc.errors:
                _fail(doc)
            _emit(doc.data["events"], as_json)
            cursor = doc.data["cursor"]
    while True:
        if _reader_gone(environment()):
            _quiet_stdout(environment())
            raise typer.Exit(0)
        doc = run("events.read", {"since": cursor, "limit": limit or 1000, "kinds": kinds, "wait_s": FOLLOW_WAIT_S})
        if doc.data is None or doc.errors:
            _fail(doc)  # the record replaced under us: one line, exit 2
        _emit(doc.data["events"], as_json)
        cursor = doc.data["cursor"]


def _since(since: str | None, limit: int | None, kinds: list[str] | None, as_json: bool) -> None:
    """--since without --follow: every wanted event from the cursor to the end of the record, paged; with -n N at
    most N, and then a line on stderr with the cursor to resume from (the last printed event's own cursor)."""
    cursor = since
    left = limit
    while True:
        page = min(left, READ_LIMIT) if left is not None else READ_LIMIT
        doc = run("events.read", {"since": cursor, "limit": page, "kinds": kinds})
        if doc.data is None or doc.errors:
            _fail(doc)
        _emit(doc.data["events"], as_json)
        cursor = doc.data["cursor"]
        if left is not None:
            left -= len(doc.data["events"])
        if not doc.data.get("more"):
            raise typer.Exit(0)
        if left is not None and left <= 0:
            render.err().print(
                Text(f"drover: more events after {cursor}: drover events --since {cursor} to read on"), soft_wrap=True
            )
            raise typer.Exit(0)


# -- drover wait A B C --any|--all ---------------------------------------------------------------------------------
def wait_many(targets: list[str], until: str, mode: str, timeout: float, as_json: bool, stall_after: float | None) -> None:
    payload: dict[str, Any] = {"targets": targets, "until": until, "mode": mode, "timeout_s": timeout}
    if stall_after is not None:
        payload["stall_after_s"] = stall_after
    doc = run("sessions.wait_many", payload)
    finish(doc, as_json, _waited_many)


def _waited_many(data: dict[str, Any]) -> None:
    for r in data.get("sessions", []):
        where = f"{r['host']}:{r.get('name') or r['target']}"
        mark = "✓" if r.get("reached") else "·"
        line = f"{mark} {where} {r['state']}"
        if r.get("how"):
            line += f" ({r['how']})"
        render.out().print(Text(render.safe(line)), style="green" if r.get("reached") else "")
    word = "every one" if data.get("mode") == "all" else "the first"
    if data.get("reached"):
        render.out().print(Text(f"{word} is {data['until']}: {', '.join(data['which'])} (after {data['waited_s']:.1f}s)"))


def check_mode(any_: bool, all_: bool, targets: list[str]) -> str | None:
    """--any or --all: never both; with several sessions, one of them (which one is meant is not guessed)."""
    if any_ and all_:
        raise UsageError("--any and --all exclude each other", hint="wait for the first (--any) or for every one (--all)")
    if len(targets) > 1 and not (any_ or all_):
        raise UsageError(f"{len(targets)} sessions named: say --any (the first) or --all (every one)")
    return "all" if all_ else "any" if any_ else None
