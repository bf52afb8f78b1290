"""The truth file scales: readers go backwards from the end and stop at their answer, and give the same answers as
a full forward scan (a brute-force reference written here) on a file of thousands of mixed events."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import drover
from drover import truth as truth_module
from drover import truth_query
from drover.truth import ORDER_SLACK_S, TruthFile, parse
from tests.conftest import ROOT

# Thousands of events per test, read backwards and by brute force: seconds of work, so the slow tier.
pytestmark = pytest.mark.slow

OUTCOMES = ["delivered", "queuedBehindTurn", "held", "refused", "dropped", "failed"]
ACTORS = ["alice", "bob", "carol", "dave", "zoë"]
HOSTS = ["local", "box-a", "box-b"]
TARGETS = ["alpha", "beta", "gamma", "%3", "work:1.0", "default/%4"]
JUNK = ["[1,2,3]", '{"v":1,"event":"accepted","id":"msg_junk","ts":null}', "not json", '{"event":"outcome","ts":"x"}']


def make_file(home: Path, messages: int, seed: int) -> None:
    """Accepted events in time order with outcomes arriving a few events later (as concurrent senders write
    them), some never (pending), some twice (a retry); times that run a little out of file order (lock waits);
    junk lines, torn fragments, orphan outcomes and events of other kinds in between."""
    rnd = random.Random(seed)

    def dumps(ev: dict[str, Any]) -> str:
        """Mostly as drover writes (compact, UTF-8), sometimes as another JSON writer would."""
        if rnd.random() < 0.8:
            return json.dumps(ev, ensure_ascii=False, separators=(",", ":"))
        return json.dumps(ev)

    now = time.time()
    start = now - 3 * 86400
    step = (now - 60 - start) / messages
    lines: list[str] = []
    waiting: list[tuple[int, dict[str, Any]]] = []  # outcomes to write after `n` more events
    for n in range(messages):
        ts = start + n * step + rnd.uniform(-ORDER_SLACK_S / 3, ORDER_SLACK_S / 3)
        msg_id = f"msg_{int(ts * 1000):012x}{rnd.getrandbits(40):010x}"
        acc = {
            "v": 1,
            "event": "accepted",
            "id": msg_id,
            "time": truth_module.now_iso(ts),
            "ts": ts,
            "actor": rnd.choice(ACTORS),
            "host": rnd.choice(HOSTS),
            "target": rnd.choice(TARGETS),
            "text_chars": 5,
            "text": f"text {n}",
            "options": {},
        }
        lines.append(dumps(acc))
        roll = rnd.random()
        if roll > 0.05:  # 5% stay pending
            out = {"v": 1, "event": "outcome", "id": msg_id, "ts": ts + 0.5, "outcome": rnd.choice(OUTCOMES), "lane": "tmux"}
            waiting.append((rnd.randint(0, 4), out))
            if roll > 0.97:  # a retry: a second, later outcome
                waiting.append((rnd.randint(5, 9), {**out, "outcome": "delivered", "detail": "retried"}))
        still = []
        for delay, out in waiting:
            if delay <= 0:
                lines.append(dumps({**out, "ts": ts + rnd.uniform(0, 2)}))  # stamped when written
            else:
                still.append((delay - 1, out))
        waiting = still
        junk = rnd.random()
        if junk < 0.01:
            lines.append(rnd.choice(JUNK))
        elif junk < 0.015:
            lines.append(json.dumps(acc)[: rnd.randint(5, 60)] + "\n" + '{"v":1,"event":"outcome","id":"msg_x')
        elif junk < 0.02:
            lines.append(json.dumps({"v": 1, "event": "outcome", "id": "msg_orphan", "ts": ts, "outcome": "held"}))
        elif junk < 0.025:
            lines.append(json.dumps({"v": 1, "event": "handoff", "ts": ts, "from": "a", "to": "b"}))
    lines += [dumps(out) for _d, out in waiting]
    home.mkdir(mode=0o700, exist_ok=True)
    path = home / "truth.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.chmod(path, 0o600)


def reference(home: Path) -> tuple[list[dict[str, Any]], int]:
    """Brute force: every line read forwards, folded by id in file order, the last outcome winning."""
    by_id: dict[str, dict[str, Any]] = {}
    skipped = 0
    for raw in (home / "truth.jsonl").read_bytes().split(b"\n"):
        if not raw.strip():
            continue
        ev = parse(raw)
        if ev is None:
            skipped += 1
            continue
        if ev["event"] == "accepted":
            by_id[ev["id"]] = {
                "id": ev["id"],
                "ts": ev["ts"],
                "actor": ev["actor"],
                "host": ev["host"],
                "target": ev["target"],
                "text": ev["text"],
                "outcome": None,
                "lane": None,
            }
        elif ev["event"] == "outcome" and ev["id"] in by_id:
            by_id[ev["id"]].update(outcome=ev["outcome"], lane=ev.get("lane"))
    return list(by_id.values()), skipped


def brief(m: dict[str, Any]) -> tuple[Any, ...]:
    return (m["id"], m["actor"], m["host"], m["target"], m["text"], m["outcome"], m["lane"])


@pytest.fixture
def mixed(isolated: Path) -> tuple[Path, list[dict[str, Any]], int]:
    home = isolated / "home"
    make_file(home, 3000, seed=9)
    msgs, skipped = reference(home)
    assert 2900 < len(msgs) <= 3000 and skipped > 20
    return home, msgs, skipped


QUERIES: list[dict[str, Any]] = [
    {},
    {"limit": 1},
    {"limit": 20},
    {"limit": 100000},
    {"actor": "bob"},
    {"actor": "bob", "limit": 7},
    {"host": "box-a", "limit": 500},
    {"target": "beta"},
    {"target": "box-b:%3", "limit": 3},
    {"outcome": "held", "limit": 100000},
    {"outcome": "delivered", "actor": "carol", "limit": 13},
    {"pending": True, "limit": 100000},
    {"pending": True, "limit": 4},
    {"pending": True, "actor": "dave", "host": "local", "limit": 100000},
    {"since": 2, "limit": 100000},
    {"since": 24, "limit": 30},
    {"since": 24, "outcome": "failed", "limit": 100000},
    {"since": 720, "pending": True, "limit": 100000},
    {"actor": "nobody"},
    {"actor": "zoë", "outcome": "refused", "limit": 100000},
    {"target": "default/%4", "pending": True, "limit": 100000},
    {"host": "box-b", "target": "work:1.0", "actor": "alice", "limit": 100000},
]


@pytest.mark.parametrize("path", ["scan", "index"])
@pytest.mark.parametrize("query", QUERIES, ids=[json.dumps(q) for q in QUERIES])
def test_log_from_the_end_answers_as_a_full_scan(
    mixed: tuple[Path, list[dict[str, Any]], int], query: dict[str, Any], path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both ways a filtered query is answered: the backward scan, and the index beside the file (drover/truth_index.py)
    that a filter turns to when its matches are not near the end (here at once: no scan budget)."""
    home, msgs, skipped = mixed
    if path == "index":
        monkeypatch.setattr(truth_query, "SCAN_BUDGET", 0)
    monkeypatch.setenv("DROVER_FLEET", str(home.parent / "fleet.toml"))
    (home.parent / "fleet.toml").write_text('[hosts.box-a]\nssh = "a"\n[hosts.box-b]\nssh = "b"\n', encoding="utf-8")
    cutoff = None
    request = dict(query)
    if "since" in query:  # hours ago, given as an ISO time so that the reference uses the very same cutoff
        cutoff = time.time() - query["since"] * 3600
        request["since"] = datetime.fromtimestamp(cutoff, UTC).isoformat()
    doc = drover.run("messages.list", request)
    assert doc.ok, doc.errors
    data = doc.data
    filtered = bool(set(query) - {"limit", "since"})
    assert (home / "truth.index").exists() == (path == "index" and filtered)

    host, target = query.get("host"), query.get("target")
    if target and ":" in target and host is None and target.split(":")[0] in HOSTS:  # HOST:ID, for fleet hosts
        host, target = target.split(":", 1)
    want = [
        m
        for m in msgs
        if (host is None or m["host"] == host)
        and (target is None or m["target"] == target)
        and (query.get("actor") is None or m["actor"] == query["actor"])
        and (query.get("outcome") is None or m["outcome"] == query["outcome"])
        and (not query.get("pending") or m["outcome"] is None)
        and (cutoff is None or m["ts"] >= cutoff)
    ]
    limit = query.get("limit", 50)
    assert [brief(m) for m in data["messages"]] == [brief(m) for m in want[-limit:]]
    if len(want) <= limit:
        assert data["complete"] is True and data["total"] == len(want)
    else:
        assert data["complete"] is False and data["total"] == limit + 1
    counts = [w["count"] for w in data["warnings"]]
    if data["complete"] and set(query) <= {"limit"}:  # the whole file was parsed: every bad line counted, once
        assert counts == [skipped]
    else:  # lines ruled out unparsed (by their bytes, or beyond the window) are not counted
        assert len(counts) <= 1 and sum(counts) <= skipped


def test_log_show_finds_like_a_full_scan(mixed: tuple[Path, list[dict[str, Any]], int]) -> None:
    _home, msgs, _skipped = mixed
    rnd = random.Random(4)
    ids = [m["id"] for m in msgs]
    for m in [*rnd.sample(msgs, 25), msgs[0], msgs[-1]]:
        doc = drover.run("messages.get", {"id": m["id"]})
        assert doc.ok, doc.errors
        assert brief(doc.data["message"]) == brief(m)
    for length in (5, 8, 11, 14, 18, 26):
        for m in rnd.sample(msgs, 6):
            prefix = m["id"][:length]
            hits = [i for i in ids if i.startswith(prefix)]
            doc = drover.run("messages.get", {"id": prefix})
            if len(hits) == 1:
                assert doc.ok and doc.data["message"]["id"] == hits[0]
            else:
                assert doc.errors[0]["code"] == "ambiguous_message"
                assert f"is a prefix of {len(hits)} messages" in doc.errors[0]["message"]
    for missing in ("msg_ffffffffffff", "msg_000000000001", "nothing-like-an-id", 'msg_"', "msg_junk"):
        doc = drover.run("messages.get", {"id": missing})
        assert doc.errors[0]["code"] == "message_not_found", missing


def test_recent_reads_the_window_like_a_full_scan(mixed: tuple[Path, list[dict[str, Any]], int]) -> None:
    home, _msgs, _skipped = mixed
    truth = TruthFile(home)
    every = list(truth.events())
    for hours in (0.5, 3, 30):
        since = time.time() - hours * 3600
        assert truth.recent(since) == [e for e in every if e["ts"] >= since]


def test_newest_messages_read_only_the_tail(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`log -n 20` and a `--since` window over 60,000 events read a few chunks from the end, not the file."""
    home = isolated / "home"
    make_file(home, 30000, seed=3)
    size = (home / "truth.jsonl").stat().st_size
    read = {"bytes": 0}
    real_pread = os.pread

    def counting(fd: int, n: int, offset: int) -> bytes:
        data = real_pread(fd, n, offset)
        read["bytes"] += len(data)
        return data

    monkeypatch.setattr(truth_module.os, "pread", counting)
    doc = drover.run("messages.list", {"limit": 20})
    assert len(doc.data["messages"]) == 20 and doc.data["complete"] is False
    assert read["bytes"] < 200_000 < size

    read["bytes"] = 0
    doc = drover.run("messages.list", {"since": "1h", "limit": 100000})
    assert doc.data["complete"] is True
    assert read["bytes"] < size / 10

    read["bytes"] = 0
    newest = doc.data["messages"][-1]["id"]
    assert drover.run("messages.get", {"id": newest}).ok
    assert read["bytes"] < 200_000


def test_readers_never_see_a_line_being_written(isolated: Path) -> None:
    """Writers append big lines while a reader queries over and over: the reader takes a shared lock to find the
    end, so it never counts another process's half-written line as malformed."""
    home = isolated / "home"
    TruthFile(home).append({"event": "start", "ts": time.time()})
    writer = textwrap.dedent(
        """
        import sys, time
        from pathlib import Path
        from drover.truth import TruthFile
        t = TruthFile(Path(sys.argv[1]))
        for n in range(100):
            mid, _ = t.accept(actor="w", host="local", target="t", text="x" * 200_000, options={})
            t.outcome(mid, {"outcome": "delivered"})
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", writer, str(home)], env=env) for _ in range(2)]
    truth = TruthFile(home)
    reads = 0
    try:
        while any(p.poll() is None for p in procs):
            found = truth.query(5)
            assert found.stats.skipped == 0
            reads += 1
    finally:
        for p in procs:
            p.wait(timeout=120)
    assert all(p.returncode == 0 for p in procs)
    final = truth.query(1000)
    assert final.total == 200 and final.stats.skipped == 0 and reads > 0
