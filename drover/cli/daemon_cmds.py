"""`drover daemon status | start | stop`: persistent mode's daemon for this environment (drover/daemon/)."""

from __future__ import annotations

import json
import os
import time
from typing import Annotated, Any

import typer

from drover.cli import render
from drover.cli.app import DURATION_HELP, app, duration, examples
from drover.cli.state import environment
from drover.errors import ExitCode

daemon_app = typer.Typer(
    help="Persistent mode: the per-user daemon that keeps SSH connections and helpers warm (started on first use; "
    "exits when idle; DROVER_DAEMON=0 or `daemon = false` in the fleet file turns it off).",
    no_args_is_help=True,
)
app.add_typer(daemon_app, name="daemon")

READY_WAIT_S = 15.0


def _path() -> str:
    from drover import paths

    return paths.socket_path()


def _status(path: str) -> dict[str, Any] | None:
    from drover.daemon import client

    answer = client.control(path, {"t": "status"})
    return answer if answer and answer.get("t") == "status" else None


def _silent(path: str) -> int | None:
    """The pid of a daemon that lives but does not answer (stopped with SIGSTOP, wedged)."""
    from drover.daemon import client

    return client.unanswering(path)


def _silent_line(pid: int) -> str:
    return f"a daemon (pid {pid}) is not answering (stopped? `kill -CONT {pid}`, or `kill {pid}`)"


def _show(info: dict[str, Any]) -> None:
    hosts = info.get("hosts") or []
    connected = [h["host"] for h in hosts if h.get("connected")]
    render.out().print(
        f"drover daemon {info.get('version')}: pid {info.get('pid')}, up {info.get('uptime_s')}s, "
        f"{info.get('served')} requests served ({info.get('active')} running), idle {info.get('idle_s')}s "
        f"of {info.get('idle_timeout_s'):g}s",
        markup=False,
    )
    render.out().print(f"socket: {info.get('socket')}", markup=False)
    render.out().print(f"hosts connected: {', '.join(connected) or 'none'}", markup=False)
    if info.get("max_links") is not None:
        closed = f"; {info.get('evicted')} closed as the least recently used" if info.get("evicted") else ""
        render.out().print(f"hosts kept: {len(hosts)} of at most {info['max_links']}{closed}", markup=False)
    for h in hosts:
        render.out().print(
            f"  {h['host']}: {'connected' if h.get('connected') else 'not connected'}, {h.get('helpers')} helpers "
            f"({h.get('busy')} busy), {h.get('connects')} connections opened",
            markup=False,
        )


@daemon_app.command("status", epilog=examples("drover daemon status --json"))
def status(as_json: Annotated[bool, typer.Option("--json", help="print the daemon's status as JSON")] = False) -> None:
    """Is a daemon running for this environment? Its pid, uptime, hosts connected, requests served, socket.
    Exit 0 when one answers, 5 when none does."""
    path = _path()
    info = _status(path)
    silent = _silent(path) if info is None else None
    if as_json:
        extra = {"pid": silent, "answering": False} if silent else {}
        document = {"running": info is not None, "socket": path, **extra, **(info or {})}
        print(json.dumps(document, default=str), file=environment().stdout)
    elif silent is not None:
        render.out().print(_silent_line(silent), markup=False)
    elif info is None:
        render.out().print(f"no daemon for this environment (socket {path})", markup=False)
    else:
        _show(info)
    raise typer.Exit(ExitCode.OK if info is not None else ExitCode.FAILED)


@daemon_app.command("stop", epilog=examples("drover daemon stop"))
def stop() -> None:
    """Stop this environment's daemon (requests it is running finish first)."""
    from drover.daemon import client

    path = _path()
    answer = client.control(path, {"t": "stop"})
    if answer is None:
        silent = _silent(path)
        if silent is not None:
            render.err().print(f"drover: {_silent_line(silent)}: it was asked to stop and will when it runs again", markup=False)
            raise typer.Exit(ExitCode.FAILED)
        render.out().print("no daemon running for this environment", markup=False)
        raise typer.Exit(ExitCode.OK)
    deadline = time.monotonic() + READY_WAIT_S
    while os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    render.out().print(f"stopped the daemon (pid {answer.get('pid')})", markup=False)
    raise typer.Exit(ExitCode.OK)


@daemon_app.command("start", epilog=examples("drover daemon start --idle 30m"))
def start(
    foreground: Annotated[bool, typer.Option("--foreground", help="run it here, logging to stderr (for debugging)")] = False,
    idle: Annotated[
        float | None,
        typer.Option(
            "--idle",
            metavar="DURATION",
            parser=duration,
            help=f"how long idle before it exits (default: the fleet's) {DURATION_HELP}",
        ),
    ] = None,
) -> None:
    """Start this environment's daemon now (it also starts by itself on first use)."""
    from drover import paths
    from drover.daemon import autostart

    path = _path()
    info = _status(path)
    if info is not None:
        render.out().print(f"already running: pid {info.get('pid')}, socket {path}", markup=False)
        raise typer.Exit(ExitCode.OK)
    silent = _silent(path)
    if silent is not None:
        render.err().print(f"drover: {_silent_line(silent)}", markup=False)
        raise typer.Exit(ExitCode.FAILED)
    if idle is not None and not 0 < idle <= paths.MAX_DURATION_S:  # NaN included
        raise typer.BadParameter("--idle must be above zero and at most 366d")
    if foreground:
        raise typer.Exit(_serve(path, idle))
    try:
        paths.ensure_dir(os.path.dirname(path))
    except (OSError, paths.Unsafe) as exc:
        render.err().print(f"drover: {exc}", style="red", markup=False)
        raise typer.Exit(ExitCode.CONFIG) from None
    autostart.spawn(path, idle)
    deadline = time.monotonic() + READY_WAIT_S
    while (info := _status(path)) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if info is None:
        render.err().print(
            f"drover: the daemon did not answer within {READY_WAIT_S:g}s: see {paths.daemon_log(path)}", style="red"
        )
        raise typer.Exit(ExitCode.FAILED)
    render.out().print(f"started: pid {info.get('pid')}, socket {path}", markup=False)
    raise typer.Exit(ExitCode.OK)


def _serve(path: str, idle: float | None) -> int:
    """Run the daemon here, handing it the program its requests run through: the CLI's own entry point, a callable
    taking argv and an Environment (the daemon builds one per request; it imports nothing of the CLI)."""
    from drover import paths
    from drover.cli import program
    from drover.daemon import server

    program.command()  # built now, once, not by the first request
    return server.main(["--socket", path] + (["--idle", paths.seconds_text(idle)] if idle is not None else []), program.main)


@daemon_app.command("serve", hidden=True)
def serve(
    socket: Annotated[str | None, typer.Option("--socket", help="the socket (default: this environment's)")] = None,
    idle: Annotated[
        float | None,
        typer.Option("--idle", metavar="DURATION", parser=duration, help=f"how long idle before it exits {DURATION_HELP}"),
    ] = None,
) -> None:
    """The daemon itself, as `drover daemon start` and the first use start it (drover/daemon/autostart.py)."""
    raise typer.Exit(_serve(socket or _path(), idle))
