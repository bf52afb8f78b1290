"""drover nudge HOST:ID TEXT (deliver only when it is safe) and drover nudge run (the fleet's [[nudge]] schedule)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from drover.cli import render
from drover.cli.app import (
    DURATION_HELP,
    VIA_HELP,
    ActorOpt,
    DebugOpt,
    FleetOpt,
    JsonOpt,
    TimeoutOpt,
    app,
    common,
    duration,
    examples,
    read_text,
    run,
    session_target,
)
from drover.cli.completion import complete_engines, complete_nudge_target
from drover.errors import UsageError

if TYPE_CHECKING:
    from drover.ops.core import Document

RUN = "run"


@app.command("nudge", epilog=examples("drover nudge box-a:webapp-f8 'carry on with the next item'", "drover nudge run --dry-run"))
def nudge(
    target: Annotated[
        str,
        typer.Argument(
            help="HOST:ID of the session to nudge; or `run`: send the fleet's [[nudge]] entries that are due",
            autocompletion=complete_nudge_target,
        ),
    ],
    text: Annotated[str | None, typer.Argument(help="the message, or - to read it from stdin")] = None,
    create_if_missing: Annotated[
        bool, typer.Option("--create-if-missing", help="not live: start it (--engine, --cwd), with the text as its brief")
    ] = False,
    engine: Annotated[
        str | None,
        typer.Option("--engine", "-e", help="with --create-if-missing: what to start", autocompletion=complete_engines),
    ] = None,
    cwd: Annotated[str | None, typer.Option("--cwd", help="with --create-if-missing: where (absolute or ~/...)")] = None,
    name: Annotated[str | None, typer.Option("--name", help="with --create-if-missing: its name (default: ID)")] = None,
    via: Annotated[str, typer.Option("--via", help=VIA_HELP)] = "auto",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="run: say what is due, send nothing")] = False,
    entry: Annotated[list[str] | None, typer.Option("--entry", help="run: only this entry (repeatable)")] = None,
    wait: Annotated[
        float,
        typer.Option(
            "--wait", metavar="DURATION", parser=duration, help=f"run: how long to wait for another run's lock {DURATION_HELP}"
        ),
    ] = 50.0,
    as_json: JsonOpt = False,
    fleet: FleetOpt = None,
    actor: ActorOpt = None,
    debug: DebugOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Deliver a message only when it is safe: refuse a session that is not live (a nudge never starts one; a
    worker drover spawned that died is said so, `session_exited`), one that is generating, one waiting on a human
    (a dialog, Claude's permission prompt, a person's draft: `waiting_on_human`), and one that shares its
    directory with another live session. Every refusal is recorded with its reason (`drover log`), exit 4.

    `drover nudge run` sends the [[nudge]] entries of fleet.toml that are due, with the same refusals, and
    remembers each entry's last send in the truth file: `* * * * * drover nudge run` is all a crontab needs. It
    prints nothing when nothing was due. (A session named `run` is `local:run`.)
    """
    common(fleet, actor, debug, timeout)
    if target == RUN and text is not None:
        # `drover nudge run jj` means the schedule's entry jj far more often than a session named run.
        raise UsageError(
            f"drover nudge run takes no text (got {text!r})",
            hint="--entry NAME picks entries (drover nudge run --entry NAME); a session named run is local:run "
            "(drover nudge local:run TEXT)",
        )
    if target == RUN:
        if create_if_missing or engine or cwd or name or via != "auto":
            raise UsageError(
                "drover nudge run takes its targets and options from the [[nudge]] entries",
                hint="--create-if-missing, --engine, --cwd, --name and --via go with drover nudge HOST:ID TEXT",
            )
        payload: dict[str, Any] = {"dry_run": dry_run, "entries": entry or None, "lock_wait_s": wait}
        show_doc(run("nudge.run", payload), as_json, show_run)
        return
    if text is None:
        raise UsageError("no text to send", hint="drover nudge HOST:ID TEXT (or - for stdin); drover nudge run for the schedule")
    if dry_run or entry:
        raise UsageError("--dry-run and --entry go with drover nudge run", hint="drover nudge run --dry-run")
    t = session_target(target, "nudge")
    payload = {"host": t.host, "id": t.id, "text": read_text(text), "via": via}
    if create_if_missing:
        payload.update(create_if_missing=True, engine=engine, cwd=cwd, name=name)
    elif engine or cwd or name:
        raise UsageError("--engine, --cwd and --name only mean something with --create-if-missing")
    show_doc(run("sessions.nudge", payload), as_json, show_nudge)


def show_doc(doc: Document, as_json: bool, show: Any) -> None:
    """As app.finish, but a nudge's rendering shows its own refusal (once), so only a document without data gets
    the error lines."""
    if as_json:
        render.print_json(doc)
    elif doc.data is not None:
        show(render.clean(doc.data), doc)
    if not as_json and doc.data is None:
        render.errors(doc)
    raise typer.Exit(doc.exit_code)


def show_nudge(data: dict[str, Any], doc: Document) -> None:
    spawned = data.get("spawned")
    if spawned:
        render.out().print(
            f"started {spawned.get('host')}:{spawned.get('id')} ({spawned.get('engine')} {spawned.get('name')}) "
            f"in {spawned.get('cwd')}: it was not live",
            markup=False,
        )
    if data.get("outcome"):
        render.outcome(data)
    else:
        render.errors(doc)


def show_run(data: dict[str, Any], doc: Document) -> None:
    rows = data.get("entries") or []
    if data.get("dry_run"):
        if not rows:
            render.out().print(f"no [[nudge]] entries in {data.get('fleet')}", markup=False)
        for r in rows:
            mark = "due" if r.get("due") else "pending" if r.get("pending") else "not due"
            when = f" (next {r['next']})" if r.get("next") else ""
            render.out().print(f"{mark:8} {r['entry']} → {r['target']}: {r.get('why', '')}{when}", markup=False)
    else:
        # Quiet when nothing was due: cron mails whatever a job prints, every minute.  A killed run's message that
        # this run finished (or tried to) is said like a send.
        for r in rows:
            if not (r.get("due") or (r.get("pending") and r.get("outcome"))):
                continue
            line = f"nudge {r['entry']}: {r.get('outcome') or 'failed'} → {r['target']}: {r.get('detail') or ''}"
            if r.get("id"):
                line += f"  {r['id']}"
            (render.out() if r.get("sent") else render.err()).print(line, markup=False)
            for w in r.get("warnings") or []:
                render.err().print(f"warning: {w.get('message', w) if isinstance(w, dict) else w}", markup=False)
    for w in data.get("warnings") or []:
        render.err().print(f"warning: {w.get('message', w) if isinstance(w, dict) else w}", markup=False)
    if data.get("locked"):
        render.errors(doc)
