"""Lifecycle events in the truth file: written once under the lock, found by any spelling, read forward by cursor."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from drover import lifecycle as lc
from drover.errors import InvalidRequest
from drover.truth import TruthFile

WORKER = {"identity": "claude:5f2c9e1a-0000", "id": "5f2c9e1a-0000", "name": "worker-1", "pane": "%4", "pid": 4242}


@pytest.fixture
def truth(tmp_path: Path) -> TruthFile:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    return TruthFile(home)


def lines(truth: TruthFile) -> list[bytes]:
    return [raw for raw in truth.path.read_bytes().split(b"\n") if raw]


def test_an_event_carries_the_sessions_spellings_and_refuses_an_unknown_kind() -> None:
    ev = lc.event("done", host="box-a", session={**WORKER, "cwd": "/w", "server": None}, spawn="spawn_1", summary="ok")
    assert ev["event"] == "done" and ev["host"] == "box-a" and ev["spawn"] == "spawn_1" and ev["summary"] == "ok"
    assert ev["session"] == WORKER  # only the spellings, only those with a value
    assert ev["id"].startswith("lc_")
    with pytest.raises(ValueError):
        lc.event("finished", host="box-a", session=WORKER)


def test_record_once_writes_a_key_once(truth: TruthFile) -> None:
    first, wrote = lc.record_once(truth, lc.event("exited", host="h", session=WORKER), "exited:spawn_1")
    assert wrote
    again, wrote = lc.record_once(truth, lc.event("exited", host="h", session=WORKER), "exited:spawn_1")
    assert not wrote and again["id"] == first["id"]
    other, wrote = lc.record_once(truth, lc.event("exited", host="h", session=WORKER), "exited:spawn_2")
    assert wrote and other["id"] != first["id"]
    assert len(lines(truth)) == 2


def test_two_watchers_racing_on_one_death_record_it_once(truth: TruthFile) -> None:
    start = threading.Barrier(8)
    written: list[bool] = []

    def watcher() -> None:
        start.wait()
        _ev, wrote = lc.record_once(truth, lc.event("exited", host="h", session=WORKER), "exited:spawn_race")
        written.append(wrote)

    threads = [threading.Thread(target=watcher) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(written) == [False] * 7 + [True]
    assert len(lines(truth)) == 1


def test_record_once_with_a_time_bound_does_not_miss_a_key_written_after_it(truth: TruthFile) -> None:
    ev, _ = lc.record_once(truth, lc.event("exited", host="h", session=WORKER), "k1")
    for i in range(50):
        truth.accept(actor="a", host="h", target="t", text=f"m{i}", options={})
    _again, wrote = lc.record_once(truth, lc.event("exited", host="h", session=WORKER), "k1", since_ts=ev["ts"] - 1)
    assert not wrote


def test_latest_finds_the_event_by_any_spelling_on_its_host(truth: TruthFile) -> None:
    lc.record(truth, lc.event("done", host="h1", session=WORKER, summary="first"))
    lc.record(truth, lc.event("exited", host="h2", session={"name": "worker-1", "id": "%9"}))
    for spelling in ("worker-1", "5f2c9e1a-0000", "%4", "4242", "claude:5f2c9e1a-0000"):
        found = lc.latest(truth, "h1", [spelling])
        assert found is not None and found["summary"] == "first", spelling
    assert lc.latest(truth, "h1", ["worker-2"]) is None
    assert lc.latest(truth, "h3", ["worker-1"]) is None
    newest = lc.latest(truth, None, ["worker-1"])
    assert newest is not None and newest["host"] == "h2"
    # A bound at the session's start: an older event is about a session the name once meant.
    assert lc.latest(truth, "h1", ["worker-1"], since_ts=newest["ts"] + 1) is None
    assert lc.latest(truth, "h1", ["worker-1"], kinds=("stalled",)) is None


def test_a_cursor_resumes_after_its_event_and_misses_nothing(truth: TruthFile) -> None:
    for i in range(5):
        truth.accept(actor="a", host="h", target="t", text=f"m{i}", options={})
    got, end = lc.read_forward(truth, lc.parse_cursor(truth, "start"))
    assert [ev["text"] for ev, _ in got] == [f"m{i}" for i in range(5)]
    assert str(end) == str(got[-1][1])
    # A reader killed after the third event resumes from the cursor it printed with it.
    resumed, _ = lc.read_forward(truth, lc.parse_cursor(truth, str(got[2][1])))
    assert [ev["text"] for ev, _ in resumed] == ["m3", "m4"]
    # `end`: only what comes next.
    tail = lc.parse_cursor(truth, "end")
    assert lc.read_forward(truth, tail)[0] == []
    lc.record(truth, lc.event("done", host="h", session=WORKER))
    after, _ = lc.read_forward(truth, tail)
    assert [ev["event"] for ev, _ in after] == ["done"]


def test_paging_with_a_limit_gives_each_event_once(truth: TruthFile) -> None:
    for i in range(7):
        truth.accept(actor="a", host="h", target="t", text=f"m{i}", options={})
    cur, seen = lc.parse_cursor(truth, "start"), []
    for _ in range(10):
        page, cur = lc.read_forward(truth, cur, limit=3)
        seen += [ev["text"] for ev, _ in page]
        if not page:
            break
    assert seen == [f"m{i}" for i in range(7)]


def test_an_unfinished_line_is_left_for_the_next_read(truth: TruthFile) -> None:
    truth.accept(actor="a", host="h", target="t", text="whole", options={})
    with open(truth.path, "ab") as f:
        f.write(b'{"v":1,"event":"done","ts":1.0,"host":"h","sess')  # a writer mid-line
    got, cur = lc.read_forward(truth, lc.parse_cursor(truth, "start"))
    assert [ev["text"] for ev, _ in got] == ["whole"]
    assert cur.offset < truth.path.stat().st_size
    # The next writer ends the fragment with a newline; the fragment is skipped, the new event read once.
    lc.record(truth, lc.event("done", host="h", session=WORKER))
    more, cur2 = lc.read_forward(truth, cur)
    assert [ev["event"] for ev, _ in more] == ["done"]
    assert cur2.offset == truth.path.stat().st_size


@pytest.mark.parametrize("text", ["nonsense", "12", "12:", ":5", "a:b", "1:2:3", "9" * 30 + ":1"])
def test_a_malformed_cursor_is_a_clear_error(truth: TruthFile, text: str) -> None:
    truth.accept(actor="a", host="h", target="t", text="x", options={})
    with pytest.raises(InvalidRequest, match="cursor"):
        lc.parse_cursor(truth, text)


def test_a_cursor_of_another_record_is_refused_not_replayed(truth: TruthFile) -> None:
    truth.accept(actor="a", host="h", target="t", text="x", options={})
    _got, cur = lc.read_forward(truth, lc.parse_cursor(truth, "start"))
    ino = truth.path.stat().st_ino
    with pytest.raises(InvalidRequest, match="another record"):
        lc.parse_cursor(truth, f"{ino + 1}:{cur.offset}")
    with pytest.raises(InvalidRequest, match="past the end"):
        lc.parse_cursor(truth, f"{ino}:{cur.offset + 10}")
    # The record replaced by another file: the old cursor names another inode.
    replacement = truth.path.with_name("new")
    replacement.write_bytes(truth.path.read_bytes())
    os.chmod(replacement, 0o600)
    os.replace(replacement, truth.path)
    with pytest.raises(InvalidRequest, match="another record"):
        lc.parse_cursor(truth, str(cur))


def test_no_record_yet_reads_nothing_from_start(truth: TruthFile) -> None:
    cur = lc.parse_cursor(truth, "start")
    assert lc.read_forward(truth, cur) == ([], cur)
