"""drover done: a delegate's terminal signal, recorded about its own session and reported to its parent."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from drover.cli import render
from drover.cli.app import ActorOpt, DebugOpt, FleetOpt, JsonOpt, TimeoutOpt, app, common, examples, finish, read_text, run


@app.command(
    "done",
    epilog=examples(
        "drover done --summary 'the flaky test is fixed' --evidence 'commit 1a2b3c4' --evidence 'pytest: 212 passed'",
        "drover done --failed --summary 'the schema migration needs a human' --to box-a:webapp-f8",
    ),
)
def done(
    summary: Annotated[str | None, typer.Option("--summary", help="what was done (or why not); - reads it from stdin")] = None,
    evidence: Annotated[
        list[str] | None, typer.Option("--evidence", help="what shows it (a commit, a test run); may be repeated")
    ] = None,
    failed: Annotated[bool, typer.Option("--failed", help="the task could not be done: reported as failed")] = False,
    to: Annotated[
        str | None, typer.Option("--to", help="HOST:ID to report to (default: the session that spawned this one)")
    ] = None,
    session: Annotated[
        str | None, typer.Option("--session", help="HOST:ID of the session that is done: must be the one this runs in")
    ] = None,
    as_json: JsonOpt = False,
    fleet: FleetOpt = None,
    actor: ActorOpt = None,
    debug: DebugOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Say this session has finished its task: record it (done, or --failed) and report it to its parent.

    Run it inside the session that finished (drover checks that from the process tree). The report goes to the
    session whose `drover spawn` started this one, or to --to, as an ordinary recorded message whose first line
    is `[drover done] NAME@HOST: SUMMARY`. Run again after a report was cut off, it finishes that report instead
    of sending a second one. With no parent known it records the end, says so, and exits 0.
    """
    common(fleet, actor, debug, timeout)
    payload: dict[str, Any] = {
        "summary": read_text(summary, "the summary") if summary is not None else None,
        "evidence": evidence or None,
        "failed": failed,
        "to": to,
        "session": session,
    }
    doc = run("sessions.done", payload)
    finish(doc, as_json, show_done)


def show_done(data: dict[str, Any]) -> None:
    s = data.get("session") or {}
    state = "recorded" if data.get("recorded") else "already recorded"
    render.out().print(f"{data.get('event')} {state} for {s.get('host')}:{s.get('id')} ({s.get('name')})", markup=False)
    if data.get("detail"):
        render.out().print(str(data["detail"]), style="dim", markup=False)
    report = data.get("report")
    if report:
        render.outcome(report)
