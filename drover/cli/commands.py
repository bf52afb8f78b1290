"""The session and record commands: ls, status, send, wait, read, op, log, guard check.

Each parses its arguments, runs one op through `app.run` and prints its document through `app.finish`.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from drover.cli import completion, render
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
    duration,
    examples,
    finish,
    guard_app,
    log_app,
    read_text,
    recorded_target,
    run,
    session_target,
)
from drover.cli.app import target as parse_target
from drover.cli.completion import complete_engines, complete_hosts, complete_op, complete_target
from drover.errors import UsageError

TargetArg = Annotated[
    str, typer.Argument(help="HOST:ID, e.g. local:%3 or box-a:webapp", show_default=False, autocompletion=complete_target)
]


@app.command("ls", epilog=examples("drover ls", "drover ls --host 'h[1-3],!h2' --engine claude --json"))
def ls(
    host: HostsOpt = None,
    tag: TagsOpt = None,
    engine: Annotated[
        str | None, typer.Option("--engine", "-e", help="only sessions running this engine", autocompletion=complete_engines)
    ] = None,
    as_json: JsonOpt = False,
    fleet: FleetOpt = None,
    actor: ActorOpt = None,
    debug: DebugOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """List every session on every host (or the chosen ones): engine, state, directory."""
    common(fleet, actor, debug, timeout)
    doc = run("sessions.list", {"hosts": host or None, "tags": tag or None, "engine": engine})
    if not engine:  # what the hosts answered, for completing session names later (no host is asked on Tab)
        completion.remember(doc.data)
    finish(doc, as_json, render.sessions_table)


@app.command("status", epilog=examples("drover status box-a:webapp-f8", "drover status local:%3 --tail 20 --json"))
def status(
    target: TargetArg,
    tail: Annotated[int, typer.Option("--tail", help="screen lines to show")] = 8,
    as_json: JsonOpt = False,
    fleet: FleetOpt = None,
    actor: ActorOpt = None,
    debug: DebugOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Alive, and doing what? The session's state with its evidence."""
    common(fleet, actor, debug, timeout)
    t = session_target(target, "status")
    doc = run("sessions.status", {"host": t.host, "id": t.id, "tail": tail})
    finish(doc, as_json, render.status)


@app.command(
    "send",
    epilog=examples(
        "drover send box-a:webapp-f8 'rebase on master, the schema landed'", "git log -1 | drover send local:api - --actor ci"
    ),
)
def send(
    target: TargetArg,
    text: Annotated[str, typer.Argument(help="the message, or - to read it from stdin (after --, a text may start with -)")],
    via: Annotated[str, typer.Option("--via", help=VIA_HELP)] = "auto",
    expect_engine: Annotated[str | None, typer.Option("--expect-engine", help="refuse unless the pane runs this engine")] = None,
    as_owner: Annotated[
        bool, typer.Option("--as-owner", help="these are the owner's own words: declare the target's permission class")
    ] = False,
    raw: Annotated[
        bool, typer.Option("--raw", help="the pane runs no agent: paste the raw text anyway, but only at a shell prompt")
    ] = False,
    as_json: JsonOpt = False,
    fleet: FleetOpt = None,
    actor: ActorOpt = None,
    debug: DebugOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Deliver a message to one session. Refuses panes showing a dialog; records every message.

    Claude Code sessions get it in their own inbox, a Codex thread in its queue (no tmux involved, never a paste
    instead: --via tmux there is refused unless --as-owner); anything else in tmux by guarded paste.
    Agent engines get the text inside a <cross-session-message from-name="drover (ACTOR)" from-mode="prompting">
    envelope. A pane that runs no agent gets nothing unless --raw, and then the raw text only at its shell's own
    prompt (never into less, vim, a REPL or an rm -i question). Never over a person's unsent draft. Control
    characters arrive as visible symbols (ESC as ␛), never as keys.
    --as-owner (only where the fleet sets owner_relay = true) declares the class the target runs in, so the owner's
    own words reach a session that bypasses permission prompts instead of being held.
    """
    common(fleet, actor, debug, timeout)
    t = parse_target(target)
    payload: dict[str, Any] = {"host": t.host, "id": t.id, "text": read_text(text), "via": via, "as_owner": as_owner}
    if raw:
        payload["raw"] = True
    if expect_engine:
        payload["expect_engine"] = expect_engine
    doc = run("sessions.message", payload)
    finish(doc, as_json, render.outcome)


@app.command(
    "wait",
    epilog=examples(
        "drover wait box-a:webapp-f8 --until idle --timeout 600",
        "drover wait local:w1 box-a:w2 box-b:w3 --any --until idle",
        "drover wait box-a:w2 box-b:w3 --all --until done --timeout 2h",
    ),
)
def wait(
    targets: Annotated[
        list[str],
        typer.Argument(
            metavar="TARGETS",
            help="HOST:ID of each session, e.g. box-a:webapp",
            show_default=False,
            autocompletion=complete_target,
        ),
    ],
    until: Annotated[
        str, typer.Option("--until", help="idle, exited, done (from the record), waiting (on a person) or stalled")
    ] = "idle",
    any_: Annotated[bool, typer.Option("--any", help="several sessions: until the first of them gets there")] = False,
    all_: Annotated[bool, typer.Option("--all", help="several sessions: until every one of them gets there")] = False,
    stall_after: Annotated[
        float | None,
        typer.Option(
            "--stall-after",
            metavar="DURATION",
            parser=duration,
            help="--until stalled: working, no progress this long (default: the fleet's stall_after)",
        ),
    ] = None,
    timeout: WaitTimeoutOpt = 600.0,
    as_json: JsonOpt = False,
    fleet: FleetOpt = None,
    actor: ActorOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Block until a session is idle (or has exited); with several, until the first (--any) or every one (--all) is.

    Claude sessions notify; other engines are watched on their host. Several sessions: one request per host, whose
    helper watches all of them; `done` comes from the record (a `drover done` written before or while waiting).
    """
    from drover.cli import events_cmds

    common(fleet, actor, debug)
    mode = events_cmds.check_mode(any_, all_, targets)
    if mode is None and until in ("idle", "exited") and stall_after is None:
        t = session_target(targets[0], "wait")
        doc = run("sessions.wait", {"host": t.host, "id": t.id, "until": until, "timeout_s": timeout})
        finish(doc, as_json, render.waited)
    events_cmds.wait_many(targets, until, mode or "any", timeout, as_json, stall_after)


@app.command("verify", epilog=examples("drover verify msg_3f2a9c1e", "drover verify --json"))
def verify(
    ids: Annotated[list[str] | None, typer.Argument(help="message ids (default: recent delivered or queued, unverified)")] = None,
    as_json: JsonOpt = False,
    fleet: FleetOpt = None,
    actor: ActorOpt = None,
    debug: DebugOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Look for messages in their receivers' own records (Claude transcripts, Codex rollouts); record the ones found.

    A message queued behind a turn is `unverified` when sent; once the turn has run, `drover verify` finds it.
    """
    common(fleet, actor, debug, timeout)
    doc = run("messages.verify", {"ids": ids or None})
    finish(doc, as_json, render.verified_table)


@app.command("retry", epilog=examples("drover log --pending", "drover retry msg_3f2a9c1e"))
def retry(
    msg_id: Annotated[str, typer.Argument(help="the message id (msg_...) or a unique prefix")],
    as_json: JsonOpt = False,
    fleet: FleetOpt = None,
    actor: ActorOpt = None,
    debug: DebugOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Finish a pending, failed or uncertain message exactly once: it is looked for in the receiver's record and its
    input box first, and sent again only if it is provably absent. Never twice."""
    common(fleet, actor, debug, timeout)
    doc = run("messages.retry", {"id": msg_id})
    finish(doc, as_json, render.outcome)


@app.command(
    "read",
    epilog=examples("drover read box-a:webapp-f8 --last 20 --role assistant", "drover read local:api --grep migration --json"),
)
def read(
    target: Annotated[
        str,
        typer.Argument(
            help="HOST:ID (a Claude session, or a Codex rollout id), or bot:NAME (its replies)",
            show_default=False,
            autocompletion=complete_target,
        ),
    ],
    last: Annotated[int, typer.Option("--last", "-n", help="the last N matching events")] = 20,
    role: Annotated[list[str] | None, typer.Option("--role", help="user, assistant, peer or tool (repeatable)")] = None,
    grep: Annotated[str | None, typer.Option("--grep", help="only events matching this regex")] = None,
    since: Annotated[str | None, typer.Option("--since", help="10m, 2h, or an ISO time")] = None,
    raw: Annotated[bool, typer.Option("--raw", help="the raw transcript records (with --json)")] = False,
    as_json: JsonOpt = False,
    fleet: FleetOpt = None,
    actor: ActorOpt = None,
    debug: DebugOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Read a transcript, filtered on the host: text only, tool calls summarised, never the whole file unless asked."""
    common(fleet, actor, debug, timeout)
    t = parse_target(target)
    payload = {"host": t.host, "id": t.id, "last": last, "roles": role or None, "grep": grep, "since": since, "raw": raw}
    doc = run("sessions.read", payload)
    finish(doc, as_json, render.transcript)


@app.command(
    "op",
    epilog='Examples:\n\n\b\n  drover op --list\n  drover op sessions.message \'{"host":"box-a","id":"webapp-f8","text":"hi"}\'',
)
def op_cmd(
    verb: Annotated[
        str | None, typer.Argument(help="the op, e.g. sessions.message", show_default=False, autocompletion=complete_op)
    ] = None,
    request: Annotated[str | None, typer.Argument(help="the request as JSON, or - to read it from stdin")] = None,
    list_ops: Annotated[bool, typer.Option("--list", help="list the ops and their request fields")] = False,
    as_json: JsonOpt = False,
    fleet: FleetOpt = None,
    actor: ActorOpt = None,
    debug: DebugOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Run any op with a JSON request and print its JSON document: {"drover":1,"op","ok","data","errors"}."""
    common(fleet, actor, debug, timeout)
    if list_ops or verb is None:
        from drover.ops import describe  # every op: importing the package registers them all

        ops = describe()
        render.print_json({"drover": 1, "ops": ops}) if as_json else render.ops_list(ops)
        raise typer.Exit(0)
    payload = read_text(request, "the request") if request is not None else "{}"
    doc = run(verb, payload)
    render.print_json(doc)
    if not doc.ok:
        render.error_list(doc.errors)
    raise typer.Exit(doc.exit_code)


@log_app.callback()
def log(
    ctx: typer.Context,
    target: Annotated[
        str | None,
        typer.Option(
            "--target",
            help="HOST:ID: the session by any spelling (name, id or 8+ hex prefix, pid, pane %3, identity)",
            autocompletion=complete_target,
        ),
    ] = None,
    host: Annotated[
        list[str] | None,
        typer.Option(
            "--host",
            "-H",
            help="only messages to these hosts (repeatable): a name, a list or a range, as ls --host takes them",
            autocompletion=complete_hosts,
        ),
    ] = None,
    actor: Annotated[str | None, typer.Option("--actor", help="only this sender (here --actor filters)")] = None,
    outcome: Annotated[
        str | None, typer.Option("--outcome", help="delivered, queuedBehindTurn, held, refused, dropped, failed")
    ] = None,
    since: Annotated[str | None, typer.Option("--since", help="10m, 2h, 7d, or an ISO time")] = None,
    pending: Annotated[bool, typer.Option("--pending", help="only messages accepted with no outcome (a crash mid-send)")] = False,
    limit: Annotated[int, typer.Option("--limit", "-n", help="the newest N")] = 50,
    as_json: JsonOpt = False,
    fleet: FleetOpt = None,
    debug: DebugOpt = False,
) -> None:
    """What was sent, by whom, to whom, and what became of it. `drover log show ID` for one message."""
    common(fleet, None, debug)
    if ctx.invoked_subcommand:
        return
    payload: dict[str, Any] = {"actor": actor, "outcome": outcome, "since": since, "pending": pending, "limit": limit}
    if host:
        payload["hosts"] = host
    if target is not None:
        t = recorded_target(target)
        # A bare ID matches that ID on any host; HOST:ID only on that host.
        payload["target"] = t.id
        if t.named_host:
            payload["host"] = t.host
    doc = run("messages.list", payload)
    finish(doc, as_json, render.messages_table)


@log_app.command("show", epilog=examples("drover log show msg_3f2a9c1e"))
def log_show(
    msg_id: Annotated[str, typer.Argument(help="message id (msg_...) or a unique prefix")],
    as_json: JsonOpt = False,
    fleet: FleetOpt = None,
    actor: ActorOpt = None,
    debug: DebugOpt = False,
) -> None:
    """One message: full text, target, outcome, lane, detail."""
    common(fleet, actor, debug)
    doc = run("messages.get", {"id": msg_id})
    finish(doc, as_json, render.message)


@guard_app.command("check", epilog=examples("drover guard check --engine claude --file screen.txt"))
def guard_check(
    engine: Annotated[str, typer.Option("--engine", "-e", help="claude, codex, gemini, demo, shell, or one of fleet.toml")],
    file: Annotated[str, typer.Option("--file", "-f", help="a saved screen (tmux capture-pane -p > screen.txt), or -")],
    as_json: JsonOpt = False,
    fleet: FleetOpt = None,
    actor: ActorOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Classify a saved screen. Exit 0 = a paste would go ahead, 4 = it would be refused (as `send` exits)."""
    common(fleet, actor, debug)
    try:
        if file == "-":
            screen = read_text("-", "the screen")
        else:
            with open(file, encoding="utf-8", errors="replace") as f:
                screen = f.read()
    except OSError as exc:
        raise UsageError(f"cannot read {file}: {exc.strerror}") from None
    doc = run("guard.check", {"engine": engine, "screen": screen})

    def show(data: dict[str, Any]) -> None:
        style = render.STATE_STYLE.get(data["state"], "")
        render.out().print(f"{data['state']}: {data['reason']} → {data['verdict']}", style=style, markup=False)

    finish(doc, as_json, show)
