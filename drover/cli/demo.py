"""`drover demo`: the whole main job on the `local` host, end to end, with real tmux and a real program.

It starts a throwaway tmux server running drover's demo agent, lists it, sends it a message, shows that the
message arrived, makes the agent draw a permission dialog and shows drover refusing to paste into it, prints the
truth-file record of both messages, and cleans up.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Annotated, Any

import typer
from rich.rule import Rule
from rich.text import Text

from drover.cli import render
from drover.cli.main import app, context
from drover.errors import DroverError, ExitCode, UsageError


def _step(n: int, title: str, command: str = "") -> None:
    render.out.print(Rule(f"[bold]{n}. {title}", align="left"))
    if command:
        render.out.print(Text(f"$ {command}", style="bold cyan"))


def _wait_state(ctx: Any, sid: str, want: str, timeout: float = 15.0) -> dict[str, Any]:
    import asyncio

    from drover.ops import run_async

    deadline = time.monotonic() + timeout
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        doc = asyncio.run(run_async(ctx, "sessions.status", {"id": sid}))
        if doc.ok:
            last = doc.data["session"]
            if last.get("state") == want:
                return last
        time.sleep(0.1)
    raise DroverError(f"the demo agent did not become {want} within {timeout:g}s (last seen: {last.get('state')})")


def _agent_events(log: str) -> list[dict[str, Any]]:
    try:
        with open(log, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


@app.command("demo")
def demo(
    keep: Annotated[bool, typer.Option("--keep", help="leave the demo's tmux server running afterwards")] = False,
) -> None:
    """Run the main job end to end on this machine: list, send, refuse a dialog, show the record."""
    if not shutil.which("tmux"):
        raise UsageError("tmux is not installed", hint="apt-get install tmux")
    from drover.ops import run as run_op

    server = f"drover-demo-{os.getpid()}"
    workdir = tempfile.mkdtemp(prefix="drover-demo-")
    log = os.path.join(workdir, "agent.jsonl")
    agent = f"{sys.executable} -m drover.demo_agent --log {log} --name demo"
    actor = context().actor or "drover-demo"
    try:
        subprocess.run(
            ["tmux", "-L", server, "new-session", "-d", "-s", "drover-demo", "-x", "110", "-y", "28", "-c", workdir, agent],
            check=True,
            capture_output=True,
            timeout=10,
        )
        ctx = context()
        ctx.actor = actor
        session = _wait_state(ctx, "drover-demo", "idle")
        sid = f"{server}/{session['id']}"

        _step(1, "every session on this machine", "drover ls")
        doc = run_op("sessions.list", {}, context())
        render.sessions_table(doc.data)

        _step(2, "send the demo agent a message", f"drover send local:{sid} 'coordinator here: rebase on master'")
        text = "coordinator here: rebase on master, the schema landed"
        doc = run_op("sessions.message", {"id": sid, "text": text, "actor": actor}, context())
        render.outcome(doc.data)
        sent_id = doc.data["id"]
        time.sleep(0.3)

        _step(3, "what the agent received (its own log of what it read)")
        got = [e for e in _agent_events(log) if e["type"] == "message"]
        for e in got:
            render.out.print(Text(e["text"]), style="green")
        if not got or text not in got[-1]["text"]:
            raise DroverError("the demo agent did not record the message: delivery is broken on this machine")

        _step(
            4, "the agent shows a permission dialog; drover refuses to type into it", f"drover send local:{sid} 'yes, go ahead'"
        )
        start = next(e for e in _agent_events(log) if e["type"] == "start")
        os.kill(int(start["pid"]), signal.SIGUSR1)
        _wait_state(ctx, sid, "dialog")
        screen = subprocess.run(
            ["tmux", "-L", server, "capture-pane", "-p", "-t", session["id"]], capture_output=True, text=True
        ).stdout
        for line in [ln for ln in screen.splitlines() if ln.strip()][-6:]:
            render.out.print(Text("  │ " + line), style="yellow")
        doc = run_op("sessions.message", {"id": sid, "text": "yes, go ahead", "actor": actor}, context())
        render.outcome(doc.data, expected=True)
        refused_id = doc.data["id"]
        answered = [e for e in _agent_events(log) if e["type"] in ("dialog", "dialog_input")]
        render.out.print(
            Text(f"the dialog received {len(answered)} keystrokes from drover; it is still waiting for its human"),
            style="green" if not answered else "bold red",
        )

        _step(5, "the truth file's record of both messages", "drover log show ID --json")
        truth = context().truth
        for event in truth.events():
            if event.get("id") in (sent_id, refused_id):
                render.out.print(Text(json.dumps(event, ensure_ascii=False)), style="dim", soft_wrap=True)
        render.out.print(f"truth file: {truth.path}")
        doc = run_op("messages.list", {"actor": actor, "limit": 2}, context())
        render.messages_table(doc.data)
    finally:
        if not keep:
            subprocess.run(["tmux", "-L", server, "kill-server"], capture_output=True, timeout=10)
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            render.out.print(f"left running: tmux -L {server} attach -t drover-demo")
    render.out.print(Rule("[bold green]demo finished: delivered once, refused once, both recorded"))
    raise typer.Exit(ExitCode.OK)
