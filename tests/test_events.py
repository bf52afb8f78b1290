"""drover events [--follow]: the record as JSON lines with cursors; a follower killed and resumed misses and repeats
nothing; a cursor of another record is refused; a reader gone ends a follower quietly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from drover import lifecycle
from drover.ops.events import tail
from drover.truth import TruthFile
from tests.conftest import ROOT, drover_process, wait_for

HARD_S = 120


def write(truth: TruthFile, n: int, kind: str = "done", pad: int = 0) -> list[str]:
    ids = []
    for i in range(n):
        ev = lifecycle.event(kind, host="local", session={"identity": f"tmux:default/%{i}@1"}, summary="x" * pad)
        lifecycle.record(truth, ev)
        ids.append(ev["id"])
    return ids


def follower(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "drover", "events", "--follow", "--json", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=str(ROOT),
        env=dict(os.environ),
    )


def test_the_last_n_each_with_a_cursor_that_reads_on_from_it(cli: Any) -> None:
    truth = TruthFile()
    ids = write(truth, 5) + write(truth, 2, "exited")
    res = cli("events", "-n", "3", "--json")
    assert res.code == 0, res.err
    lines = [json.loads(line) for line in res.out.splitlines()]
    assert [x["event"]["id"] for x in lines] == ids[-3:]
    # From the cursor of the fifth event: the two after it, no more, no less.
    res = cli("events", "--since", lines[0]["cursor"], "--json")
    assert [json.loads(line)["event"]["id"] for line in res.out.splitlines()] == ids[-2:]
    only = cli("events", "--kind", "exited", "-n", "10", "--json")
    assert [json.loads(line)["event"]["event"] for line in only.out.splitlines()] == ["exited", "exited"]
    human = cli("events", "-n", "1")
    assert "exited" in human.out and lines[-1]["cursor"] in human.out


def test_the_tail_across_blocks_and_a_torn_last_line(isolated: Path) -> None:
    truth = TruthFile()
    ids = write(truth, 300, pad=700)  # ~250 KB: the backward read crosses several 64 KB blocks
    with open(truth.path, "ab") as f:
        f.write(b'{"v":1,"event":"done","id":"torn')  # a writer not finished: never given, never a cursor inside it
    rows, nxt = tail(truth, 1000, None)
    assert [ev["id"] for ev, _c in rows] == ids
    forward, _ = lifecycle.read_forward(truth, lifecycle.parse_cursor(truth, "start"))
    assert [str(c) for _e, c in forward] == [str(c) for _e, c in rows]
    assert nxt == forward[-1][1]
    rows, _ = tail(truth, 7, None)
    assert [ev["id"] for ev, _c in rows] == ids[-7:]


def test_a_cursor_of_another_record_is_refused_in_one_line(isolated: Path, cli: Any) -> None:
    truth = TruthFile()
    write(truth, 2)
    inode = os.stat(truth.path).st_ino
    for bad in (f"{inode + 1}:0", f"{inode}:999999", "yesterday"):
        res = cli("events", "--since", bad)
        assert res.code == 2, (bad, res.err)
        assert len(res.err.strip().splitlines()) == 1 and "cursor" in res.err
    res = cli("op", "events.read", '{"since": "end", "wait_s": 3600}')
    assert res.code == 2


def test_the_op_waits_for_the_next_event_within_its_bound(isolated: Path) -> None:
    from drover.ops import run

    truth = TruthFile()
    write(truth, 1)
    end = run("events.read", {"since": "end"}).data["cursor"]
    later: list[str] = []

    def writer() -> None:
        time.sleep(0.5)  # only so the read below is already waiting (its answer is the same either way)
        later.extend(write(truth, 1, "exited"))

    t = threading.Thread(target=writer)
    t.start()
    doc = run("events.read", {"since": end, "wait_s": 50})
    t.join()
    assert [e["event"]["id"] for e in doc.data["events"]] == later
    empty = run("events.read", {"since": doc.data["cursor"], "wait_s": 0.3})
    assert empty.data["events"] == [] and empty.data["cursor"] == doc.data["cursor"]


def _lines(proc: subprocess.Popen[bytes], want: int, got: list[dict[str, Any]]) -> int:
    assert proc.stdout is not None
    while len(got) < want:
        line = proc.stdout.readline()
        if not line.endswith(b"\n"):
            break  # killed mid-line (or ended): only whole lines were printed
        got.append(json.loads(line))
    return len(got)


def test_a_follower_killed_and_resumed_from_its_last_cursor_misses_and_repeats_nothing(isolated: Path) -> None:
    truth = TruthFile()
    write(truth, 3)
    start = drover_process("events", "-n", "1", "--json").out
    cursor = json.loads(start.splitlines()[-1])["cursor"]
    written: list[str] = []
    stop = threading.Event()

    def writer() -> None:
        while not stop.is_set() and len(written) < 400:
            written.extend(write(truth, 1, "exited"))
            time.sleep(0.005)

    t = threading.Thread(target=writer)
    t.start()
    seen: list[dict[str, Any]] = []
    try:
        for _round in range(3):
            proc = follower("--since", cursor)
            _lines(proc, len(seen) + 40, seen)
            proc.kill()  # kill -9, while the writer goes on
            proc.wait(timeout=HARD_S)
            cursor = seen[-1]["cursor"]
        stop.set()
        t.join()
        proc = follower("--since", cursor)
        wait_for(lambda: _lines(proc, len(written), seen) >= len(written), what="the rest")
        proc.kill()
        proc.wait(timeout=HARD_S)
    finally:
        stop.set()
        t.join()
    assert [x["event"]["id"] for x in seen] == written


def test_head_ends_a_follower_quietly_and_ctrl_c_ends_it_with_130(isolated: Path) -> None:
    truth = TruthFile()
    write(truth, 1)
    pipeline = subprocess.Popen(
        ["bash", "-c", f"{sys.executable} -m drover events --follow --json | head -3; echo rc=${{PIPESTATUS[0]}} >&2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=str(ROOT),
        env=dict(os.environ),
    )
    stop = threading.Event()

    def writer() -> None:
        while not stop.is_set():
            write(truth, 1, "exited")
            time.sleep(0.05)

    t = threading.Thread(target=writer)
    t.start()
    try:
        out, err = pipeline.communicate(timeout=HARD_S)
    finally:
        stop.set()
        t.join()
    assert len(out.splitlines()) == 3
    assert err.decode().strip() == "rc=0", err  # no traceback, no "Exception ignored", exit 0

    # Ctrl-C: exit 130, one line.  Events keep coming until the follower has printed one (it starts at the end).
    proc = follower()
    stop.clear()
    t = threading.Thread(target=writer)
    t.start()
    got: list[dict[str, Any]] = []
    try:
        _lines(proc, 1, got)  # it is following now
    finally:
        stop.set()
        t.join()
    proc.send_signal(signal.SIGINT)
    _out, err2 = proc.communicate(timeout=HARD_S)
    assert proc.returncode == 130
    assert b"interrupted" in err2 and b"Traceback" not in err2


def test_the_record_replaced_under_a_follower_is_refused_not_replayed(isolated: Path) -> None:
    truth = TruthFile()
    write(truth, 2)
    proc = follower("--since", "start")
    got: list[dict[str, Any]] = []
    _lines(proc, 2, got)
    replacement = truth.path.with_name("other.jsonl")
    replacement.write_bytes(truth.path.read_bytes()[:10])  # another file at the path: another inode
    os.replace(replacement, truth.path)
    _out, err = proc.communicate(timeout=HARD_S)
    assert proc.returncode == 2
    assert "another record" in err.decode() and len(err.decode().strip().splitlines()) == 1
