"""drover spawn (start a session and brief it) and drover spawns (which sessions drover started, for whom)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from drover.cli import render
from drover.cli.app import (
    ActorOpt,
    DebugOpt,
    FleetOpt,
    JsonOpt,
    TimeoutOpt,
    app,
    common,
    examples,
    finish,
    read_text,
    recorded_target,
    run,
)
from drover.cli.completion import complete_engines, complete_hosts
from drover.cli.state import state
from drover.errors import UsageError


@app.command(
    "spawn",
    epilog=examples(
        "drover spawn box-a --engine claude --cwd ~/src/webapp --name webapp-f9 --brief 'fix the flaky test'",
        "drover spawn box-a --engine claude --cwd ~/src/webapp --brief 'review it' -- --model opus",
        "drover spawn box-a --engine claude --headless --cwd ~/src/webapp --name hl-1 --brief 'fix the flaky test'",
        "drover spawn box-a --engine claude --headless --resume hl-1",
    ),
)
def spawn(
    host: Annotated[str, typer.Argument(help="the host to start it on", show_default=False, autocompletion=complete_hosts)],
    engine: Annotated[
        str,
        typer.Option(
            "--engine", "-e", help="claude, codex, or one with [spawn.ENGINE] in the fleet", autocompletion=complete_engines
        ),
    ],
    cwd: Annotated[str | None, typer.Option("--cwd", help="the directory it starts in, on the host (absolute or ~/...)")] = None,
    brief: Annotated[str | None, typer.Option("--brief", help="its first message, or - to read it from stdin")] = None,
    engine_args: Annotated[
        list[str] | None,
        typer.Argument(
            help="after --: arguments appended to the engine's command line for this spawn only (-- --model X)",
            show_default=False,
            metavar="-- ENGINE_ARGS",
        ),
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="its name (default: DIR-ENGINE-xxxx)")] = None,
    parent_msg: Annotated[
        str | None, typer.Option("--parent-msg", help="the message id this spawn answers (recorded as its parent)")
    ] = None,
    headless: Annotated[
        bool, typer.Option("--headless", help="Claude Code (or Codex) with no terminal, held on the host by drover's holder")
    ] = False,
    resume: Annotated[
        str | None, typer.Option("--resume", help="with --headless: a new holder for this headless session (its name)")
    ] = None,
    as_json: JsonOpt = False,
    fleet: FleetOpt = None,
    actor: ActorOpt = None,
    debug: DebugOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Start a new agent session in tmux on HOST, wait until it is ready, and brief it.

    The brief arrives after a snapshot: host, directory, git branch and commit, who dispatched it. A folder the
    engine does not trust yet stops at its trust dialog: drover never answers it, reports the session as waiting
    (exit 3) and does not brief it; list the folder under the host's `trusted = [...]` to pre-trust it.

    Arguments after `--` are appended to the engine's command line for this spawn only (its [spawn.ENGINE]
    template, or the built-in one), each as exactly one argument: no shell reads them.

    --headless starts Claude Code with no terminal (stream-json), held by a small process drover ships to the host
    (--engine codex: `codex app-server`);
    --resume NAME starts a new holder for a headless session whose holder or claude is gone (docs/lanes.md).
    """
    common(fleet, actor, debug, timeout)
    from drover.fleet import ENDPOINT_KINDS
    from drover.targets import not_a_session

    kind, sep, rest = host.partition(":")
    if kind in ENDPOINT_KINDS:  # `spawn bot`, `spawn bot:x`: a receiver, never a host to start a session on
        raise not_a_session(kind, rest if sep else "NAME", "spawn")
    if resume and not headless:
        raise UsageError("--resume is for headless sessions", hint="drover spawn HOST --engine claude --headless --resume NAME")
    if not resume and (cwd is None or brief is None):
        missing = " and ".join(f for f, v in (("--cwd", cwd), ("--brief", brief)) if v is None)
        raise UsageError(f"missing {missing}", hint="drover spawn HOST --engine E --cwd DIR --brief TEXT")
    after = state.argv[state.argv.index("--") + 1 :] if "--" in state.argv else []
    if engine_args and engine_args != after:
        # click takes stray words for these arguments whether or not `--` came first: a word that was meant as
        # something else (`drover spawn box-a claude ...`) must not reach the engine's command line unasked.
        raise UsageError(
            f"unexpected words {' '.join(w for w in engine_args if w not in after)!r}: arguments for the engine go after `--`",
            hint="drover spawn HOST --engine E --cwd DIR --brief TEXT -- --model X",
        )
    payload: dict[str, Any] = {
        "host": host,
        "engine": engine,
        "cwd": cwd or "",
        "name": name,
        "brief": read_text(brief, "the brief") if brief is not None else "",
        "parent_msg": parent_msg,
        "args": engine_args or None,
    }
    if headless:
        payload.update(headless=True, resume=resume)
    doc = run("sessions.spawn", payload)
    finish(doc, as_json, show_spawn)


def show_spawn(data: dict[str, Any]) -> None:
    where = f"{data['host']}:{data['id']}"
    git = data.get("git") or {}
    code = f"  {git.get('branch') or 'detached'}@{git.get('commit') or '-'}" if git else ""
    render.out().print(f"{data['state']} → {where} ({data['engine']} {data['name']}) in {data['cwd']}{code}", markup=False)
    brief = data.get("brief")
    if brief:
        render.outcome(brief)
    elif data["state"] == "waiting":
        render.out().print(f"not briefed: {data['reason']}", style="yellow", markup=False)
        for line in data.get("tail", [])[-6:]:
            render.out().print(f"  │ {line}", style="dim", markup=False)
    render.out().print(f"spawn {data['spawn_id']}", style="dim", markup=False)
    for w in data.get("warnings") or []:
        render.err().print(f"warning: {w.get('message', w) if isinstance(w, dict) else w}", style="yellow", markup=False)


@app.command("spawns", epilog=examples("drover spawns --host box-a --json"))
def spawns(
    host: Annotated[
        str | None,
        typer.Option(
            "--host",
            "-H",
            help="only sessions spawned on these hosts: h1, h1,h3, node[01-40], 'h[1-3],!h2'",
            autocompletion=complete_hosts,
        ),
    ] = None,
    parent: Annotated[
        str | None, typer.Option("--parent", help="only those dispatched by this actor, or for this message id")
    ] = None,
    target: Annotated[
        str | None,
        typer.Option("--target", help="HOST:ID: only the session named so (name, id or 8+ hex prefix, pane %3, pid, identity)"),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", help="the newest N")] = 50,
    as_json: JsonOpt = False,
    fleet: FleetOpt = None,
    actor: ActorOpt = None,
    debug: DebugOpt = False,
) -> None:
    """The sessions drover started: where, which engine, who dispatched them (the parent), and their brief."""
    common(fleet, actor, debug)
    payload: dict[str, Any] = {"host": host, "parent": parent, "limit": limit}
    if target is not None:
        t = recorded_target(target)  # checked here (an unknown host is exit 6); the op reads HOST: again
        payload["target"] = str(t) if t.named_host else t.id
    doc = run("sessions.spawns", payload)
    asked = [f"{flag} {value}" for flag, value in (("--host", host), ("--target", target), ("--parent", parent)) if value]
    finish(doc, as_json, lambda data: show_spawns(data, asked))


def show_spawns(data: dict[str, Any], asked: list[str] | None = None) -> None:
    from rich.table import Table

    rows = data.get("spawns", [])
    if not rows:
        # A filter that matched nothing is not an empty record: say which filter it was.
        said = f"no spawn matches {' '.join(asked)}" if asked else "no spawned sessions in the record"
        render.out().print(said, style="dim", markup=False)
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("TIME", "HOST", "ID", "NAME", "ENGINE", "STATE", "PROGRESS", "PARENT", "BRIEF", "CWD"):
        table.add_column(col, overflow="fold" if col == "CWD" else "ellipsis", no_wrap=col != "CWD")
    for r in rows:
        parent = r.get("parent") or {}
        who = str(parent.get("actor") or "") + (f" ({parent['msg']})" if parent.get("msg") else "")
        brief = f"{r.get('brief_outcome') or '-'} {r.get('brief_msg') or ''}".strip()
        table.add_row(
            str(r.get("time") or ""),
            str(r.get("host") or ""),
            str(r.get("id") or "-"),
            str(r.get("name") or ""),
            str(r.get("engine") or ""),
            str(r.get("state") or ""),
            render.ago(r.get("last_progress")),
            who,
            brief,
            str(r.get("cwd") or ""),
        )
    render.out().print(table)
