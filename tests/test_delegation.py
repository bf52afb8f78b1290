"""Delegation end to end, across the parts of issue 18 as they fit together: a coordinator session (the demo agent
with --tools in a real tmux pane) spawns two workers with `drover spawn` from its own shell tool; one ends with
`drover done`, the other is killed with kill -9.  `wait --any --until done` returns the first, `status` says `done`
and `exited`, `drover watch run` tells the coordinator of the killed one once, the coordinator's pane shows both
reports, and `drover events` carries each transition once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import ROOT, Pane, stays, wait_for
from tests.test_done import DROVER, coordinator, log_of, reports, script, tools, truth

__all__ = ["coordinator"]  # the fixture, used by name


def spawn_from(cli: Any, parent: Pane, isolated: Path, name: str, brief: str) -> dict[str, Any]:
    """The parent runs `drover spawn` as its own tool, so the spawn records it as the parent session."""
    assert parent.log is not None
    log = parent.log
    out = isolated / f"{name}.spawn.json"
    spawn = script(
        isolated / f"spawn-{name}.sh",
        f"{DROVER} spawn local --engine demo --cwd {isolated} --name {name} --brief '{brief}' --json > {out}",
    )
    sent = cli("send", f"local:{parent.address}", f"run: {spawn}")
    assert sent.code == 0, sent.err
    wait_for(lambda: out.exists() and out.stat().st_size > 0, timeout=120, what=f"{name} spawned")
    wait_for(
        lambda: [t for t in tools(log) if t["command"] == f"sh {isolated}/spawn-{name}.sh"],
        timeout=120,
        what=f"the spawn of {name} to end",
    )
    doc = json.loads(out.read_text())
    assert doc["ok"], doc
    return dict(doc["data"])


def drover_cmd(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "drover", *args], capture_output=True, text=True, timeout=timeout, env=os.environ, cwd=ROOT
    )


def test_a_coordinator_follows_two_workers_to_their_ends(cli: Any, coordinator: Pane, isolated: Path) -> None:
    # worker-b only sits there; worker-a finishes its task and says so.
    assert coordinator.log is not None
    coordinator_log = coordinator.log
    sitter = spawn_from(cli, coordinator, isolated, "worker-b", "wait for more")
    work = script(isolated / "work-a.sh", f"{DROVER} done --summary 'schema migrated' --evidence 'commit 1a2b3c4'")
    finisher = spawn_from(cli, coordinator, isolated, "worker-a", f"run: {work}")
    # `wait --any --until done` over both returns the one that finished, and why.
    waited = drover_cmd("wait", "local:worker-a", "local:worker-b", "--any", "--until", "done", "--timeout", "120", "--json")
    assert waited.returncode == 0, waited.stderr + waited.stdout
    rows = json.loads(waited.stdout)["data"]
    assert "worker-a" in json.dumps(rows) and finisher["identity"] in json.dumps(rows), rows
    # The coordinator's pane shows the terminal report, naming the worker.
    wait_for(lambda: [r for r in reports(coordinator_log) if "[drover done] worker-a@" in r], timeout=120, what="the report")
    st = cli("status", "local:worker-a", "--json")
    assert st.code == 0 and st.json()["data"]["session"]["state"] == "done", st.out
    st_b = cli("status", "local:worker-b", "--json")
    assert st_b.code == 0 and st_b.json()["data"]["session"]["state"] in ("idle", "working"), st_b.out

    # worker-b crashes: kill -9 its program, then its window goes.
    pid = int(
        subprocess.run(
            ["tmux", "-L", "default", "display-message", "-p", "-t", sitter["pane"], "#{pane_pid}"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    )
    os.kill(pid, signal.SIGKILL)
    subprocess.run(["tmux", "-L", "default", "kill-window", "-t", sitter["pane"]], capture_output=True, timeout=10)
    # Two watch runs at once, then a third: one exited event, one notice in the coordinator's pane.
    argv = [sys.executable, "-m", "drover", "watch", "run"]
    pipe = subprocess.PIPE
    runs = [subprocess.Popen(argv, cwd=ROOT, env=os.environ, text=True, stdout=pipe, stderr=pipe) for _ in range(2)]
    for run in runs:
        _out, err = run.communicate(timeout=300)
        assert run.returncode == 0, err
    third = drover_cmd("watch", "run")
    assert (third.returncode, third.stdout) == (0, ""), third.stderr
    events = truth(isolated)
    exited = [e for e in events if e["event"] == "exited"]
    assert [e["session"]["identity"] for e in exited] == [sitter["identity"]]
    notices = lambda: [m for m in coordinator.messages() if "worker-b" in m and "exited without `drover done`" in m]  # noqa: E731
    wait_for(notices, timeout=120, what="the coordinator told of worker-b")
    stays(lambda: len(notices()) == 1, 1.0, "one notice")
    gone = cli("status", "local:worker-b", "--json")
    assert gone.code == 0 and gone.json()["data"]["session"]["state"] == "exited", gone.out
    # A misspelt name is still no session: never taken for the worker that died.
    assert cli("status", "local:worker-bb").code == 6

    # The stream: each end once, in the order they happened, each with a cursor to resume from.
    stream = drover_cmd("events", "--since", "start", "--kind", "done", "--kind", "exited", "--json")
    assert stream.returncode == 0, stream.stderr
    lines = [json.loads(line) for line in stream.stdout.splitlines() if line.strip()]
    assert [(x["event"]["event"], x["event"]["session"]["name"]) for x in lines] == [("done", "worker-a"), ("exited", "worker-b")]
    after_done = drover_cmd("events", "--since", lines[0]["cursor"], "--kind", "done", "--kind", "exited", "--json")
    assert [json.loads(x)["event"]["event"] for x in after_done.stdout.splitlines() if x.strip()] == ["exited"]
    # The record follows each worker by any spelling: its brief and, for worker-a, the report it sent.
    for spelling in (finisher["pane"], "worker-a", str(finisher["pid"])):
        found = cli("log", "--target", f"local:{spelling}", "--json")
        assert found.code == 0, found.err
        mine = [
            m for m in found.json()["data"]["messages"] if m["options"].get("session", {}).get("identity") == finisher["identity"]
        ]
        assert mine and mine[0]["text"].startswith("drover started this session: worker-a"), (spelling, found.out)
    # worker-a, done, then gone: `status` says both, the way its task ended first (a stranger's find: only the
    # exit was shown, the done was in --json alone).
    os.kill(int(finisher["pid"]), signal.SIGKILL)
    subprocess.run(["tmux", "-L", "default", "kill-window", "-t", finisher["pane"]], capture_output=True, timeout=10)
    ended = wait_for(
        lambda: (r := cli("status", "local:worker-a")).code == 0 and "exited" in r.out and r, timeout=60, what="exited"
    )
    assert "signal" in ended.out and "done" in ended.out and "schema migrated" in ended.out, ended.out
    assert log_of(coordinator_log)  # the coordinator itself stayed up throughout
