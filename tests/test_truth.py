"""The truth file: write-ahead, one whole line per event under concurrency, pending after a crash, limits."""

from __future__ import annotations

import itertools
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import drover
from tests.conftest import ROOT, Pane, Tmux, drover_process, stays, wait_for

LOOSE_LIMITS = "[limits]\nbucket_size = 100000\nduplicate_window_s = 0\n"


def truth_lines(home: Path) -> list[str]:
    return (home / "truth.jsonl").read_text(encoding="utf-8").splitlines()


# Eight writers at once, each sending SENDS messages: the truth file must come out whole, every line valid JSON,
# every send's two events there exactly once, every pane's messages in order.  What proves it is that the writers'
# appends overlap, not how many there are: they start together (a barrier, after their slow imports) and each send
# sleeps settle_s between its paste and its Enter, so eight workers keep interleaving for the whole run -- which
# the test checks in the file itself.  200 sends each (1,600) took longer than its timeout at a load average of 17
# on two cores, and 50 each took 240 s of the 300 at 29; 25 each is the same proof at a size that holds there.
WORKERS, SENDS = 8, 25


def test_eight_processes_sending_at_once_never_interleave_or_lose_a_line(tmux: Tmux, isolated: Path) -> None:
    fleet = isolated / "fleet.toml"
    fleet.write_text(LOOSE_LIMITS + "[defaults]\nsettle_s = 0.5\n", encoding="utf-8")
    panes = [tmux.agent(f"w{i}") for i in range(WORKERS)]
    barrier = isolated / "barrier"
    barrier.mkdir()
    script = textwrap.dedent(
        """
        import pathlib, sys, time, drover
        target, worker, barrier, sends = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3]), int(sys.argv[4])
        (barrier / f"ready-{worker}").touch()
        while not (barrier / "go").exists():
            time.sleep(0.05)
        for n in range(sends):
            doc = drover.run("sessions.message", {"id": target, "text": f"worker {worker} message {n}"}, actor=f"w{worker}")
            assert doc.data["outcome"] == "delivered", doc.data
        """
    )
    env = {**os.environ, "DROVER_FLEET": str(fleet), "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-c", script]
    procs = [
        subprocess.Popen([*argv, p.address, str(i), str(barrier), str(SENDS)], env=env, stderr=subprocess.PIPE, text=True)
        for i, p in enumerate(panes)
    ]
    ready = lambda: len(list(barrier.glob("ready-*"))) == WORKERS or any(p.poll() is not None for p in procs)  # noqa: E731
    wait_for(ready, 120, what="every worker ready")
    (barrier / "go").touch()
    for proc in procs:
        _, err = proc.communicate(timeout=280)  # within pytest's own 300 s
        assert proc.returncode == 0, err[-2000:]

    total = WORKERS * SENDS
    lines = truth_lines(isolated / "home")
    events = [json.loads(line) for line in lines]  # every line is whole, valid JSON
    kinds = Counter(e["event"] for e in events)
    assert kinds == {"accepted": total, "outcome": total}
    accepted = [e["id"] for e in events if e["event"] == "accepted"]
    assert len(set(accepted)) == total
    assert Counter(e["id"] for e in events if e["event"] == "outcome") == Counter(accepted)
    assert {e["outcome"] for e in events if e["event"] == "outcome"} == {"delivered"}
    # The writers did overlap: one worker's run of accepted events is broken by another's many times (run one after
    # another, the file would hold WORKERS blocks, WORKERS - 1 changes of actor).
    actors = [e["actor"] for e in events if e["event"] == "accepted"]
    changes = sum(a != b for a, b in itertools.pairwise(actors))
    assert changes >= 4 * WORKERS, f"the workers hardly overlapped ({changes} changes of writer): nothing was proved"
    for i, pane in enumerate(panes):

        def all_arrived(pane: Pane = pane) -> bool:
            return len(pane.messages()) == SENDS

        wait_for(all_arrived, timeout=120, what=f"worker {i}'s messages")
        got = [m.split("\n")[1] for m in pane.messages()]  # the body, inside drover's envelope
        assert got == [f"worker {i} message {n}" for n in range(SENDS)]


def test_send_killed_between_accept_and_outcome_shows_as_pending(tmux: Tmux, isolated: Path, cli: Any) -> None:
    pane = tmux.agent("victim")
    # kill -9 right after the accepted event is written (drover's fault injection point for tests)
    proc = subprocess.run(
        [sys.executable, "-m", "drover", "--actor", "crasher", "send", pane.address, "never finished"],
        cwd=str(ROOT),
        capture_output=True,
        env={**os.environ, "DROVER_FAULT": "after_accept"},
        timeout=60,
    )
    assert proc.returncode == -signal.SIGKILL
    res = cli("log", "--pending", "--json")
    assert res.code == 0
    pending = res.json()["data"]["messages"]
    assert len(pending) == 1
    assert pending[0]["actor"] == "crasher" and pending[0]["outcome"] is None and pending[0]["pending"] is True
    human = cli("log", "show", pending[0]["id"][:12])
    assert "pending" in human.out and "never finished" in human.out
    stays(lambda: pane.messages() == [])


def test_truth_file_is_private_and_records_everything(tmux: Tmux, isolated: Path, cli: Any) -> None:
    pane = tmux.agent("rec")
    res = cli("--actor", "alice", "send", pane.address, "hello record", "--json")
    assert res.code == 0
    doc = res.json()
    path = isolated / "home" / "truth.jsonl"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    accepted, outcome = (json.loads(line) for line in truth_lines(isolated / "home"))
    assert accepted["event"] == "accepted" and accepted["id"] == doc["data"]["id"]
    assert accepted["text"] == "hello record" and accepted["actor"] == "alice"
    assert accepted["host"] == "local" and accepted["target"] == pane.address
    assert outcome["event"] == "outcome" and outcome["outcome"] == "delivered" and outcome["lane"] == "tmux"
    assert outcome["session"]["id"] == pane.id and outcome["session"]["engine"] == "demo"
    assert accepted["ts"] <= outcome["ts"]


def test_log_filters(tmux: Tmux, isolated: Path, cli: Any) -> None:
    a = tmux.agent("alpha")
    b = tmux.agent("beta")
    assert cli("--actor", "alice", "send", "alpha", "one").code == 0
    assert cli("--actor", "bob", "send", "beta", "two").code == 0
    os.kill(b.pid, signal.SIGUSR1)
    wait_for(lambda: "Do you want to proceed?" in b.screen())
    assert cli("--actor", "bob", "send", "beta", "three").code == 4
    assert cli("--actor", "carol", "send", "nobody-here", "four").code == 6

    def ids(*args: str) -> list[str]:
        res = cli("log", "--json", *args)
        assert res.code == 0, res.err
        return [m["text"] for m in res.json()["data"]["messages"]]

    assert ids() == ["one", "two", "three", "four"]
    assert ids("--actor", "bob") == ["two", "three"]
    assert ids("--target", "local:beta") == ["two", "three"]
    assert ids("--outcome", "refused") == ["three"]
    assert ids("--outcome", "failed") == ["four"]
    assert ids("--since", "1h", "--limit", "2") == ["three", "four"]
    assert ids("--pending") == []
    table = cli("log")
    assert "alice" in table.out and "refused" in table.out and "delivered" in table.out
    assert a.messages() and b.messages()
    res = cli("log", "show", "msg_nope")
    assert res.code == 6 and "no message 'msg_nope'" in res.err
    res = cli("log", "--since", "yesterday")
    assert res.code == 2 and "neither a duration" in res.err


def test_duplicate_and_burst_limits_hold_across_processes(tmux: Tmux, isolated: Path) -> None:
    fleet = isolated / "fleet.toml"
    fleet.write_text("[limits]\nbucket_size = 3\nbucket_refill_per_s = 0.01\n", encoding="utf-8")
    pane = tmux.agent("limited")
    env = {"DROVER_FLEET": str(fleet)}
    first = drover_process("send", pane.address, "same text", env=env)
    assert first.code == 0, first.err
    dup = drover_process("send", pane.address, "same text", env=env)
    assert dup.code == 4 and "same text went to" in dup.err
    assert drover_process("send", pane.address, "second", env=env).code == 0
    assert drover_process("send", pane.address, "third", env=env).code == 0
    burst = drover_process("send", pane.address, "fourth", "--json", env=env)
    assert burst.code == 4
    assert burst.json()["data"]["code"] == "rate_limited"
    wait_for(lambda: len(pane.messages()) == 3)
    msgs = drover.run("messages.list", {"outcome": "refused"}).data["messages"]
    assert [m["code"] for m in msgs] == ["duplicate", "rate_limited"]
