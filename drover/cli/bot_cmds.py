"""`drover webhook serve` (the bots' reply listener, drover/bots/callback.py) and `drover bot pass-on` (a reply
passed on to a session, wrapped as data).  Sending to a bot is `drover send bot:NAME TEXT`; reading its replies
`drover read bot:NAME`."""

from __future__ import annotations

from typing import Annotated

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
    context,
    examples,
    finish,
    read_text,
    run,
    target,
)
from drover.cli.state import environment
from drover.errors import ConfigError, ExitCode, UsageError

webhook_app = typer.Typer(
    help="The listener for bots' signed replies (Standard Webhooks), recorded as untrusted chat events.",
    no_args_is_help=True,
    epilog=examples("drover webhook serve", "drover webhook serve --listen 127.0.0.1:9901"),
)
app.add_typer(webhook_app, name="webhook")
bot_app = typer.Typer(
    help="Bots' replies: pass one on to a session, wrapped as data (send with `drover send bot:NAME`).",
    no_args_is_help=True,
    epilog=examples("drover read bot:triage", "drover bot pass-on chat_0193a1b2c3d4e5f6a7b8c9 box-a:webapp-f8"),
)
app.add_typer(bot_app, name="bot")


@webhook_app.command("serve", epilog=examples("drover webhook serve", "drover webhook serve --listen 127.0.0.1:9901"))
def serve(
    listen: Annotated[
        str | None, typer.Option("--listen", help="ADDR:PORT (default: [webhook] listen of fleet.toml, 127.0.0.1:8789)")
    ] = None,
    fleet: FleetOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Listen in the foreground for bots' replies: POST /drover/reply?bot=NAME, signed with that bot's secret.
    Each accepted reply is recorded as a chat event marked untrusted; each refused one (bad signature, stale
    timestamp, replayed id, a reply to a message drover never sent that bot) is recorded and answered 4xx.
    One line per request on stderr. A non-loopback address needs public = true in [webhook]."""
    from drover.bots.callback import serve as run_server
    from drover.bots.config import check_listen

    common(fleet, None, debug)
    ctx = context()
    where = listen or ctx.fleet.webhook.listen
    try:
        addr, port = check_listen(where, ctx.fleet.webhook.public)
    except ValueError as exc:
        raise UsageError(str(exc), hint="give --listen 127.0.0.1:PORT, or set public = true in [webhook]") from None
    if not ctx.fleet.bots:
        raise ConfigError("the fleet has no bots: nothing could sign a reply", hint="add a [bots.NAME] table to fleet.toml")
    stream = environment().stderr
    try:
        run_server(ctx.fleet, ctx.truth, addr, port, stream)
    except OSError as exc:
        raise UsageError(f"cannot listen on {where}: {exc.strerror or exc}", hint="choose another --listen ADDR:PORT") from None
    except KeyboardInterrupt:
        raise typer.Exit(ExitCode.OK) from None


@bot_app.command(
    "pass-on", epilog=examples("drover bot pass-on chat_0193a1b2c3d4e5f6a7b8c9 box-a:webapp-f8 --note 'the triage bot says:'")
)
def pass_on(
    chat: Annotated[str, typer.Argument(help="the reply's id (chat_...), as `drover read bot:NAME` shows it")],
    to: Annotated[str, typer.Argument(help="HOST:ID of the session to pass it on to", show_default=False)],
    note: Annotated[str | None, typer.Option("--note", help="a line of your own before it; - reads it from stdin")] = None,
    as_json: JsonOpt = False,
    fleet: FleetOpt = None,
    actor: ActorOpt = None,
    debug: DebugOpt = False,
    timeout: TimeoutOpt = None,
) -> None:
    """Send a bot's reply on to a session as data: inside a wrapper with a random delimiter and a notice that it is
    not instructions; nothing in the reply can close the wrapper or forge drover's envelope. Recorded as any send."""
    common(fleet, actor, debug, timeout)
    t = target(to)
    payload = {"chat": chat, "host": t.host, "id": t.id, "note": read_text(note, "the note") if note else None}
    doc = run("bots.pass_on", payload)
    finish(doc, as_json, render.outcome)
