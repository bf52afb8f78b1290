"""`drover watch run`: spawned sessions that exited without a terminal signal, recorded once and told to their
parents; messages left queued in a session that died, resolved (drover/ops/watch.py).  Meant for cron."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from drover.cli import render
from drover.cli.app import DURATION_HELP, ActorOpt, DebugOpt, FleetOpt, JsonOpt, TimeoutOpt, app, common, duration, examples, run

watch_app = typer.Typer(
    help="No silent stops: spawned sessions that exited without `drover done`, told to their parents once.",
    no_args_is_help=True,
)
app.add_typer(watch_app, name="watch")


@watch_app.command("run", epilog=examples("drover watch run", "drover watch run --json", "* * * * * drover watch run  # crontab"))
def watch_run(
    host: Annotated[
        list[str] | None, typer.Option("--host", "-H", metavar="HOST", help="only sessions on this host (repeatable)")
    ] = None,
    wait: Annotated[
        float,
        typer.Option(
            "--wait", metavar="DURATION", parser=duration, help=f"how long to wait for another run's lock {DURATION_HELP}"
        ),
    ] = 50.0,
    as_json: JsonOpt = False,
    fleet: FleetOpt = None,
    actor: ActorOpt = None,
    debug: DebugOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Ask each host with spawned sessions that gave no terminal signal yet (one listing per host) whether they are
    still live, by identity. Each one gone is recorded `exited` once, with its evidence (last seen, last lines,
    exit status where known), and its parent session, when the spawn names one, gets a message saying so. A
    message still queued to a session that died is resolved: failed, session_exited (`drover retry ID` offers it
    to a handoff successor). A host that does not answer is never taken for dead: nothing is recorded about it,
    and the run says so (exit 5, or 8 when some hosts answered). Prints nothing when there is nothing to say."""
    common(fleet, actor, debug, timeout)
    doc = run("watch.run", {"hosts": host or None, "lock_wait_s": wait, "actor": actor})
    if as_json:
        render.print_json(doc)
    elif doc.data is not None:
        _show(render.clean(doc.data))
    if not as_json:
        render.errors(doc)
    raise typer.Exit(doc.exit_code)


SENT = ("delivered", "queuedBehindTurn", "held")


def _fate(head: str, row: dict[str, Any]) -> None:
    """One line: what became of a message the run sent (or finished), and why, when it did not go."""
    outcome = row.get("outcome") or "failed"
    line = f"{head}: {outcome}"
    detail = " ".join(str(row.get("detail") or "").split())  # one line, whatever the detail held
    if detail and outcome not in SENT:
        line += f" ({detail})"
    if row.get("given_up"):
        line += f"; given up after {row['given_up']} tries"
    if row.get("id"):
        line += f"  {row['id']}"
    (render.out() if outcome in SENT else render.err()).print(line, markup=False)


def _show(data: dict[str, Any]) -> None:
    say = render.out()
    for ev in data.get("exited") or []:
        s = ev.get("session") or {}
        status = "" if ev.get("exit_status") is None else f", exit status {ev['exit_status']}"
        status += f", killed by signal {ev['exit_signal']}" if ev.get("exit_signal") else ""
        say.print(
            f"exited: {ev.get('host')}:{s.get('name') or s.get('id')} ({s.get('engine')}, spawn {ev.get('spawn')}), "
            f"last seen {ev.get('last_seen')}{status}",
            markup=False,
        )
    for n in data.get("notices") or []:
        p = n.get("parent") or {}
        _fate(f"notice to {p.get('host')}:{p.get('name') or p.get('id')}", n)
    for r in data.get("reports") or []:
        w, p = r.get("worker") or {}, r.get("parent") or {}
        _fate(f"{r.get('event')} report of {w.get('host')}:{w.get('name') or w.get('id')} to {p.get('host')}:{p.get('id')}", r)
    for m in data.get("resolved") or []:
        say.print(f"resolved {m['id']} to {m['host']}:{m['target']}: failed, session_exited (was {m['was']})", markup=False)
