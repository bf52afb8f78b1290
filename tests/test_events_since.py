"""drover events --since: every wanted event to the end of the record (paged, the kind filter before any limit),
`-n` as at most N with a resume cursor; a fresh home (no record yet) is followed from its first event; a kind that
names nothing is a usage error, not a wait forever."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from drover import lifecycle
from drover.ops import run
from drover.truth import TruthFile
from tests.conftest import ROOT, wait_for

HARD_S = 120


def write_mix(truth: TruthFile, n: int, handoff_at: int) -> list[str]:
    """n events, all `done` except one `handoff` at position `handoff_at`; their ids in order."""
    ids = []
    for i in range(n):
        if i == handoff_at:
            ts = time.time()
            ev: dict[str, Any] = {"v": 1, "event": "handoff", "id": f"ho_{i}", "ts": ts, "time": "2026-01-01T00:00:00Z"}
            truth.append(ev)
        else:
            ev = lifecycle.record(truth, lifecycle.event("done", host="local", session={"identity": f"tmux:default/%{i}@1"}))
        ids.append(ev["id"])
    return ids


def ids_of(out: str) -> list[str]:
    return [json.loads(line)["event"]["id"] for line in out.splitlines()]


def test_since_prints_every_event_to_the_end_and_the_kind_filter_comes_first(
    isolated: Path, cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lifecycle, "READ_LIMIT", 7)  # the op pages through the record in many small reads
    truth = TruthFile()
    ids = write_mix(truth, 114, handoff_at=46)
    res = cli("events", "--since", "start", "--json")
    assert res.code == 0, res.err
    assert ids_of(res.out) == ids  # not the first 20
    assert res.err == ""
    # The handoff is the 47th event: a window taken before the filter never reached it.
    only = cli("events", "--since", "start", "--kind", "handoff", "--json")
    assert only.code == 0 and ids_of(only.out) == ["ho_46"]
    human = cli("events", "--since", "start", "--kind", "handoff")
    assert "handoff" in human.out and len(human.out.splitlines()) == 1
    # The op: `limit` counts wanted events, and says whether more remain.
    doc = run("events.read", {"since": "start", "kinds": ["done"], "limit": 50})
    assert [e["event"]["id"] for e in doc.data["events"]] == [i for i in ids if i != "ho_46"][:50]
    assert doc.data["more"] is True and doc.data["cursor"] == doc.data["events"][-1]["cursor"]
    rest = run("events.read", {"since": doc.data["cursor"], "kinds": ["done"], "limit": 1000})
    assert len(rest.data["events"]) == 113 - 50 and rest.data["more"] is False
    last = run("events.read", {"since": "start", "kinds": ["handoff"], "limit": 1})
    assert [e["event"]["id"] for e in last.data["events"]] == ["ho_46"] and last.data["more"] is False
    assert last.data["cursor"] == str(lifecycle.parse_cursor(truth, "end"))  # past the lines it filtered out


def test_since_with_n_is_at_most_n_and_says_where_to_read_on(isolated: Path, cli: Any) -> None:
    truth = TruthFile()
    ids = write_mix(truth, 30, handoff_at=3)
    seen: list[str] = []
    cursor = "start"
    for _round in range(10):
        res = cli("events", "--since", cursor, "-n", "8", "--kind", "done", "--json")
        assert res.code == 0, res.err
        got = res.out.splitlines()
        assert len(got) <= 8
        seen += ids_of(res.out)
        if "more events after" not in res.err:
            break
        cursor = json.loads(got[-1])["cursor"]
        assert cursor in res.err  # the notice names the cursor of the last line printed
    assert seen == [i for i in ids if i != "ho_3"]
    # Exactly N left: no notice that there are more.
    exact = cli("events", "--since", json.loads(cli("events", "-n", "3", "--json").out.splitlines()[0])["cursor"], "-n", "2")
    assert exact.code == 0 and len(exact.out.splitlines()) == 2 and exact.err == ""


def test_a_fresh_home_is_followed_from_its_first_event(isolated: Path) -> None:
    truth = TruthFile()
    assert not truth.path.exists()
    for since in ("end", "start", "0:0"):
        doc = run("events.read", {"since": since, "wait_s": 0.3})
        assert doc.ok, (since, doc.errors)
        assert doc.data["events"] == [] and doc.data["cursor"] == "0:0"
    proc = subprocess.Popen(
        [sys.executable, "-m", "drover", "events", "--follow", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=str(ROOT),
        env=dict(os.environ),
    )
    try:
        # The follower is asking (not failed) before the record exists: a second or two of its requests go by.
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate(timeout=HARD_S)[1]
            time.sleep(0.2)
        ids = write_mix(truth, 3, handoff_at=1)
        got: list[str] = []
        out = proc.stdout
        assert out is not None

        def three() -> bool:
            got.append(json.loads(out.readline())["event"]["id"])
            return len(got) >= 3

        wait_for(three, what="3 events")
        assert got == ids
    finally:
        proc.kill()
        proc.wait(timeout=HARD_S)
    # The "no record yet" cursor, given once the record exists, is its start.
    doc = run("events.read", {"since": "0:0"})
    assert [e["event"]["id"] for e in doc.data["events"]] == ids


def test_a_kind_that_names_nothing_is_a_usage_error(isolated: Path, cli: Any) -> None:
    truth = TruthFile()
    write_mix(truth, 3, handoff_at=1)
    for args in (["--kind", "exitted"], ["--follow", "--kind", "exitted"], ["--since", "start", "--kind", "don"]):
        res = cli("events", *args)
        assert res.code == 2, (args, res.out, res.err)
        assert "exited" in res.err and "spawn_requested" in res.err  # the kinds listed
        assert res.out == ""
    doc = run("events.read", {"kinds": ["bogus"]})
    assert not doc.ok and doc.errors[0]["code"] == "invalid_request"
    ok = cli("events", "--kind", "spawn*", "--kind", "handoff", "--json")
    assert ok.code == 0 and ids_of(ok.out) == ["ho_1"]


def test_paging_while_writers_append_misses_and_repeats_nothing(
    isolated: Path, cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    monkeypatch.setattr(lifecycle, "READ_LIMIT", 5)  # many pages, each a separate read racing the writers
    truth = TruthFile()
    first = write_mix(truth, 30, handoff_at=7)  # more than the old window of 20
    written: list[str] = list(first)
    lock = threading.Lock()
    stop = threading.Event()

    def writer(tag: str) -> None:
        for i in range(150):
            if stop.is_set():
                return
            ev = lifecycle.event("exited", host="local", session={"identity": f"tmux:default/%{tag}{i}@1"})
            with lock:  # the record's order is the order written: keep the list in that order too
                lifecycle.record(truth, ev)
                written.append(ev["id"])

    threads = [threading.Thread(target=writer, args=(t,)) for t in "ab"]
    for t in threads:
        t.start()
    try:
        res = cli("events", "--since", "start", "--json")
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert res.code == 0, res.err
    got = ids_of(res.out)
    assert got == written[: len(got)] and len(got) >= 30  # in order, none twice, none skipped
    last = json.loads(res.out.splitlines()[-1])["cursor"]
    rest = cli("events", "--since", last, "--json")
    assert got + ids_of(rest.out) == written
    # A message whose text looks like another kind of event is what it is: an `accepted` line, not a handoff.
    fake = '{"v":1,"event":"handoff","id":"ho_fake","ts":1}'
    truth.append({"v": 1, "event": "accepted", "id": "msg_fake", "ts": time.time(), "text": fake, "target": "w1"})
    only = cli("events", "--since", "start", "--kind", "handoff", "--json")
    assert ids_of(only.out) == ["ho_7"]
