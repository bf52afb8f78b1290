"""`drover demo`: the whole main job on the `local` host, end to end, with real tmux and a real program.

It starts a throwaway tmux server running drover's demo agent, lists it, sends it a message, shows that the
message arrived, makes the agent draw a permission dialog and shows drover refusing to paste into it, prints the
truth-file record of both messages, and cleans up.  Its records go to a truth file of its own, in a temporary
DROVER_HOME that is removed afterwards: the user's record never holds demo messages.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.rule import Rule
from rich.text import Text

from drover.cli import render
from drover.cli.app import ActorOpt, DebugOpt, FleetOpt, app, common, examples, state
from drover.errors import DroverError, ExitCode, UsageError


def _step(n: int, title: str, command: str = "") -> None:
    render.out().print(Rule(Text(f"{n}. {title}", style="bold"), align="left"))
    if command:
        render.out().print(Text(f"$ {command}", style="bold cyan"))


def _until(cond: Callable[[], Any], what: str, timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise DroverError(f"the demo agent {what} within {timeout:g}s: delivery is broken on this machine")
        time.sleep(0.05)


def _agent_events(log: str) -> list[dict[str, Any]]:
    try:
        with open(log, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


@app.command("demo", epilog=examples("drover demo"))
def demo(
    keep: Annotated[bool, typer.Option("--keep", help="leave the demo's tmux server and truth file afterwards")] = False,
    fleet: FleetOpt = None,
    actor: ActorOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Run the main job end to end on this machine: list, send, refuse a dialog, show the record.

    The demo keeps its records in a throwaway truth file of its own; yours is not touched.
    """
    common(fleet, actor, debug)
    from drover.ops import Context
    from drover.ops import run as run_op

    # A broken fleet file is its own error (exit 7), at once: not a demo agent that "did not start" 15 s later.
    _ = Context(fleet_path=state.fleet).fleet
    if not shutil.which("tmux"):
        raise UsageError("tmux is not installed", hint="apt-get install tmux")
    server = f"drover-demo-{os.getpid()}"
    workdir = tempfile.mkdtemp(prefix="drover-demo-")
    home = Path(workdir) / "home"
    log = os.path.join(workdir, "agent.jsonl")
    agent = f"{shlex.quote(sys.executable)} -m drover.demo_agent --log {shlex.quote(log)} --name demo"
    who = state.actor or "drover-demo"
    # The demo's own Context: the user's fleet (for local's settings), its own truth file.
    ctx = Context(fleet_path=state.fleet, actor=who, home=home)
    env_prefix = f"DROVER_HOME={shlex.quote(str(home))} "

    def op(name: str, payload: dict[str, Any]) -> Any:
        return run_op(name, payload, ctx)

    def state_of(sid: str) -> dict[str, Any]:
        doc = op("sessions.status", {"id": sid})
        return doc.data["session"] if doc.ok else {}

    def send_line(sid: str, text: str) -> str:
        return f"{env_prefix}drover send local:{sid} {shlex.quote(text)} --actor {shlex.quote(who)}"

    try:
        new = ["tmux", "-L", server, "new-session", "-d", "-P", "-F", "#{pane_id}", "-s", "drover-demo", "-x", "110", "-y", "28"]
        pane = subprocess.run([*new, "-c", workdir, agent], check=True, capture_output=True, text=True, timeout=10).stdout.strip()
        sid = f"{server}/{pane}"
        _until(lambda: state_of(sid).get("state") == "idle", "did not start")

        _step(1, "every session on this machine", f"{env_prefix}drover ls --host local")
        render.sessions_table(render.clean(op("sessions.list", {"hosts": ["local"]}).data))

        text = "coordinator here: rebase on master, the schema landed"
        _step(2, "send the demo agent a message", send_line(sid, text))
        doc = op("sessions.message", {"id": sid, "text": text})
        render.outcome(render.clean(doc.data))
        sent_id = doc.data["id"]

        _step(3, "what the agent received (its own log of what it read)")
        got = _until(lambda: [e for e in _agent_events(log) if e["type"] == "message"], "recorded no message")
        for e in got:
            render.out().print(Text(render.safe(e["text"]), style="green"))
        if text not in got[-1]["text"]:
            raise DroverError("the demo agent received something else than was sent: delivery is broken on this machine")

        refusal = "yes, go ahead"
        _step(4, "the agent shows a permission dialog; drover refuses to type into it", send_line(sid, refusal))
        start = next(e for e in _agent_events(log) if e["type"] == "start")
        os.kill(int(start["pid"]), signal.SIGUSR1)
        _until(lambda: state_of(sid).get("screen_state") == "dialog", "drew no dialog")
        screen = subprocess.run(
            ["tmux", "-L", server, "capture-pane", "-p", "-t", pane], capture_output=True, text=True, timeout=10
        ).stdout
        for line in [ln for ln in screen.splitlines() if ln.strip()][-6:]:
            render.out().print(Text("  │ " + render.safe(line), style="yellow"))
        doc = op("sessions.message", {"id": sid, "text": refusal})
        render.outcome(render.clean(doc.data), expected=True)
        refused_id = doc.data["id"]
        answered = [e for e in _agent_events(log) if e["type"] in ("dialog", "dialog_input")]
        render.out().print(
            Text(f"the dialog received {len(answered)} keystrokes from drover; it is still waiting for its human"),
            style="green" if not answered else "bold red",
        )

        _step(5, "the record of both messages, in the demo's own truth file", f"{env_prefix}drover log -n 2")
        for event in ctx.truth.events():
            if event.get("id") in (sent_id, refused_id):
                render.out().print(Text(render.safe(json.dumps(event, ensure_ascii=False)), style="dim"), soft_wrap=True)
        render.messages_table(render.clean(op("messages.list", {"limit": 2}).data))
        render.out().print(Text(f"demo truth file: {ctx.truth.path} (yours is untouched)"))
    finally:
        if not keep:
            subprocess.run(["tmux", "-L", server, "kill-server"], capture_output=True, timeout=10)
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            render.out().print(Text(f"left running: tmux -L {server} attach -t drover-demo; the record: {home}"))
    render.out().print(Rule(Text("demo finished: delivered once, refused once, both recorded", style="bold green")))
    raise typer.Exit(ExitCode.OK)
