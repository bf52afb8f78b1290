"""The index beside the truth file (drover/truth_index.py) answers the filters a backward scan answers slowly, with
the same messages, in the same order, as the same documents; it is caught up, rebuilt or ignored as the file
demands, never believed over the file; and a filtered query holds bounded memory whichever way it is answered."""

from __future__ import annotations

import json
import os
import random
import sqlite3
import subprocess
import sys
import textwrap
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from drover import truth_index, truth_query
from drover.record import Query, ReadStats, may_have_arrived, parse
from drover.truth import ORDER_SLACK_S, TruthFile, now_iso
from tests.conftest import ROOT

ACTORS = ["alice", "bob", "carol", None]
HOSTS = ["local", "box-a", "box-b"]
TARGETS = ["alpha", "beta", "%3"]
OUTCOMES = ["delivered", "queuedBehindTurn", "held", "refused", "dropped", "failed"]


def tricky_file(home: Path, messages: int, seed: int) -> None:
    """Messages whose outcomes come a few lines later (concurrent senders), or never (pending); retried ones, with
    several outcomes, an indeterminate first one, `attempt` markers; outcomes stamped earlier than their accepted
    event (clocks within ORDER_SLACK_S) and outcomes written before their accepted event in file order (which no
    reader may fold in); a pending message whose only outcome line is torn; junk, other kinds, JSON as another
    writer spells it; and a last line without its newline."""
    rnd = random.Random(seed)
    now = time.time()
    start = now - 2 * 86400
    step = (now - 120 - start) / messages
    lines: list[str] = []
    waiting: list[tuple[int, dict[str, Any]]] = []

    def dumps(ev: dict[str, Any]) -> str:
        return json.dumps(ev, ensure_ascii=False, separators=(",", ":")) if rnd.random() < 0.85 else json.dumps(ev)

    for n in range(messages):
        ts = start + n * step + rnd.uniform(-ORDER_SLACK_S / 3, ORDER_SLACK_S / 3)
        msg_id = f"msg_{int(ts * 1000):012x}{rnd.getrandbits(40):010x}"
        acc = {"v": 1, "event": "accepted", "id": msg_id, "time": now_iso(ts), "ts": ts, "actor": rnd.choice(ACTORS)}
        acc.update(host=rnd.choice(HOSTS), target=rnd.choice(TARGETS), text_chars=6, text=f"text {n}", options={})
        out = {"v": 1, "event": "outcome", "id": msg_id, "ts": ts + rnd.uniform(-5, 2), "outcome": rnd.choice(OUTCOMES)}
        roll = rnd.random()
        if roll < 0.02:  # before its accepted event in the file: an orphan to every reader
            lines.append(dumps({**out, "outcome": "delivered"}))
        lines.append(dumps(acc))
        if roll < 0.06:
            pass  # pending
        elif roll < 0.08:  # pending, with a torn outcome line that must not count
            lines.append(dumps(out)[:40])
        else:
            if roll > 0.9:
                out.update(outcome="failed", indeterminate=True, code="ssh_lost")
            waiting.append((rnd.randint(0, 4), out))
            if roll > 0.85:  # a retry, and sometimes its finish
                waiting.append((rnd.randint(5, 12), {**out, "outcome": rnd.choice(OUTCOMES), "attempt": "retry"}))
                if roll > 0.95:
                    waiting.append((rnd.randint(13, 20), {**out, "outcome": "refused", "attempt": "finish"}))
        still = []
        for delay, ev in waiting:
            if delay <= 0:
                lines.append(dumps(ev))
            else:
                still.append((delay - 1, ev))
        waiting = still
        junk = rnd.random()
        if junk < 0.01:
            lines.append(rnd.choice(["not json", "[1]", '{"v":1,"event":"accepted","id":"msg_junk","ts":null}']))
        elif junk < 0.02:
            lines.append(json.dumps({"v": 1, "event": "handoff", "ts": ts, "from": "a", "to": "b"}))
    lines += [dumps(ev) for _d, ev in waiting]
    home.mkdir(mode=0o700, exist_ok=True)
    path = home / "truth.jsonl"
    path.write_text("\n".join(lines), encoding="utf-8")  # no newline after the last line
    os.chmod(path, 0o600)


def naive(home: Path) -> list[dict[str, Any]]:
    """Brute force, forwards: every line parsed, outcomes folded into the message of their id accepted before
    them, the last one winning; uncertain when any may have arrived or the first was not the send's own."""
    by_id: dict[str, dict[str, Any]] = {}
    for raw in (home / "truth.jsonl").read_bytes().split(b"\n"):
        ev = parse(raw) if raw.strip() else None
        if ev is None:
            continue
        if ev["event"] == "accepted":
            by_id[ev["id"]] = {"ev": ev, "outs": []}
        elif ev["event"] == "outcome" and ev["id"] in by_id:
            by_id[ev["id"]]["outs"].append(ev)
    out = []
    for entry in by_id.values():
        ev, outs = entry["ev"], entry["outs"]
        last = outs[-1] if outs else {}
        out.append(
            {
                "id": ev["id"],
                "ts": ev["ts"],
                "actor": ev.get("actor") or "",
                "host": ev.get("host") or "",
                "target": ev.get("target") or "",
                "text": ev["text"],
                "outcome": last.get("outcome"),
                "detail": last.get("detail"),
                "code": last.get("code"),
                "indeterminate": last.get("indeterminate"),
                "uncertain": bool(outs) and (any(may_have_arrived(o) for o in outs) or "attempt" in outs[0]),
            }
        )
    return out


QUERIES: list[dict[str, Any]] = [
    {"pending": True},
    {"pending": True, "limit": 100000},
    {"actor": "bob", "limit": 100000},
    {"actor": "", "limit": 5},
    {"actor": "nobody"},
    {"target": "%3", "limit": 17},
    {"host": "box-b", "outcome": "refused", "limit": 100000},
    {"outcome": "failed", "limit": 100000},
    {"outcome": "held"},
    {"pending": True, "host": "local", "target": "beta", "limit": 100000},
    {"since_h": 12, "actor": "carol", "limit": 100000},
    {"since_h": 30, "pending": True, "limit": 3},
    {"since_h": 1, "outcome": "delivered", "limit": 100000},
    {"host_in": ["box-a", "local"], "limit": 100000},
    {"host_in": ["box-a"], "pending": True, "limit": 7},
]


def ask(truth: TruthFile, q: dict[str, Any], how: str) -> Any:
    """(messages as documents, total, complete) from the scan or from the index."""
    q = dict(q)
    limit = q.pop("limit", 50)
    since = time.time() - q.pop("since_h") * 3600 if "since_h" in q else None
    hosts = q.pop("host_in", None)
    host_in = None if hosts is None else hosts.__contains__
    filters = {"host": None, "target": None, "actor": None, "outcome": None, "pending": False, **q}
    found: Query | None
    if how == "scan":
        found = truth._scan(limit, since, filters, host_in, None)
    else:
        cutoff = None if since is None else since - ORDER_SLACK_S
        found = truth_index.query(truth, ReadStats(str(truth.path)), limit, since, cutoff, filters, host_in)
    assert found is not None, "the index was not used"
    return [m.to_dict() for m in found.messages], found.total, found.complete, since


def expected(msgs: list[dict[str, Any]], q: dict[str, Any], since: float | None) -> list[dict[str, Any]]:
    hosts = q.get("host_in")
    match = [
        m
        for m in msgs
        if all(not q.get(k) or m[k] == q[k] for k in ("actor", "host", "target", "outcome"))
        and (not q.get("pending") or m["outcome"] is None)
        and (hosts is None or m["host"] in hosts)
        and (since is None or m["ts"] >= since)
    ]
    return match[-q.get("limit", 50) :]


KEYS = ("id", "actor", "host", "target", "text", "outcome", "detail", "code", "indeterminate", "uncertain")


@pytest.fixture
def tricky(isolated: Path) -> TruthFile:
    home = isolated / "home"
    tricky_file(home, 2500, seed=20)
    return TruthFile(home)


@pytest.mark.slow  # generated records, indexed and scanned: seconds of work
def test_index_answers_as_a_naive_forward_fold_and_as_the_scan(tricky: TruthFile) -> None:
    msgs = naive(tricky.home)
    assert sum(m["outcome"] is None for m in msgs) > 100 and sum(m["uncertain"] for m in msgs) > 100
    for q in QUERIES:
        indexed, total, complete, since = ask(tricky, q, "index")
        scanned = ask(tricky, q, "scan")
        assert (indexed, total, complete) == scanned[:3], q  # the very same documents
        want = expected(msgs, q, since)
        assert [tuple(m[k] for k in KEYS) for m in indexed] == [tuple(m[k] for k in KEYS) for m in want], q
        assert len(indexed) > 0 or q.get("actor") == "nobody", q


def test_duplicate_ids_fold_as_the_scan_folds_them(isolated: Path) -> None:
    """Two accepted events with one id (not drover's doing): each outcome belongs to the one before it."""
    home = isolated / "home"
    truth = TruthFile(home)
    ts = time.time()
    for n, kind in enumerate(["accepted", "outcome", "accepted", "outcome", "outcome", "accepted"]):
        ev: dict[str, Any] = {"v": 1, "event": kind, "id": "msg_same", "ts": ts + n}
        if kind == "accepted":
            ev.update(actor="a", host="local", target="t", text=f"take {n}", text_chars=6, options={})
        else:
            ev.update(outcome={1: "failed", 3: "held", 4: "delivered"}[n], attempt=str(n))
        truth.append(ev)
    for q in ({"pending": True, "limit": 9}, {"actor": "a", "limit": 9}, {"outcome": "held", "limit": 9}):
        assert ask(truth, q, "index")[:3] == ask(truth, q, "scan")[:3], q
    assert [m["outcome"] for m in ask(truth, {"actor": "a", "limit": 9}, "index")[0]] == ["failed", "delivered", None]


@pytest.mark.slow  # generated records, indexed and scanned: seconds of work
def test_index_catches_up_and_is_rebuilt_when_the_file_changes(tricky: TruthFile, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(truth_query, "SCAN_BUDGET", 0)
    truth = tricky
    index = truth.home / truth_index.INDEX
    pending = truth.query(100000, pending=True)
    assert index.exists() and pending.complete
    # New messages after the index was built: caught up from where it stopped.
    mid, _ = truth.accept(actor="late", host="local", target="alpha", text="new", options={})
    done, _ = truth.accept(actor="late", host="local", target="alpha", text="done", options={})
    truth.outcome(done, {"outcome": "delivered", "lane": "tmux"})
    found = truth.query(100000, pending=True)
    assert [m.id for m in found.messages] == [m.id for m in pending.messages] + [mid]
    assert [(m.id, m.outcome) for m in truth.query(5, actor="late").messages] == [(mid, None), (done, "delivered")]
    # A reader that took the file's end before another caught the index up further keeps that index as it is.
    conn = sqlite3.connect(index, isolation_level=None)
    try:
        rows = conn.execute("SELECT COUNT(*) FROM msgs").fetchone()
        with truth._reading() as opened:
            assert opened is not None
            truth_index._catch_up(conn, opened[0], opened[1] // 2)
        assert conn.execute("SELECT COUNT(*) FROM msgs").fetchone() == rows
    finally:
        conn.close()
    # The file rewritten under the index (other content, longer): the digests differ, it is built again.
    tricky_file(truth.home, 300, seed=21)
    for q in QUERIES:
        assert ask(truth, q, "index")[:3] == ask(truth, q, "scan")[:3], q
    # Cut short (a restore from a backup): the index covers more than the file holds.
    lines = (truth.home / "truth.jsonl").read_bytes().split(b"\n")
    (truth.home / "truth.jsonl").write_bytes(b"\n".join(lines[:100]) + b"\n")
    for q in QUERIES:
        assert ask(truth, q, "index")[:3] == ask(truth, q, "scan")[:3], q


@pytest.mark.slow  # generated records, indexed and scanned: seconds of work
def test_an_index_that_lies_or_is_not_one_is_not_believed(tricky: TruthFile, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(truth_query, "SCAN_BUDGET", 0)
    truth = tricky
    index = truth.home / truth_index.INDEX
    want = ask(truth, {"pending": True, "limit": 100000}, "scan")[:3]
    assert ask(truth, {"pending": True, "limit": 100000}, "index")[:3] == want
    # Rows that say a message with an outcome is pending; then offsets that point at the wrong lines.
    for lie in (
        "UPDATE msgs SET outcome = NULL WHERE off IN (SELECT off FROM msgs ORDER BY off DESC LIMIT 30)",
        "UPDATE outs SET off = off + 1 WHERE acc IN (SELECT off FROM msgs ORDER BY off DESC LIMIT 60)",
    ):
        conn = sqlite3.connect(index, isolation_level=None)
        try:
            assert conn.execute(lie).rowcount > 0
        finally:
            conn.close()
        assert ask(truth, {"pending": True, "limit": 100000}, "index")[:3] == want
    assert (
        ask(truth, {"actor": "alice", "limit": 100000}, "index")[:3]
        == ask(truth, {"actor": "alice", "limit": 100000}, "scan")[:3]
    )
    # Not a database at all.
    index.write_bytes(b"this is not sqlite\n" * 100)
    assert ask(truth, {"pending": True, "limit": 100000}, "index")[:3] == want
    assert index.read_bytes().startswith(b"SQLite format 3")
    # A symlink where the index goes: not followed, not touched; the scan answers.
    index.unlink()
    elsewhere = truth.home.parent / "elsewhere"
    elsewhere.write_bytes(b"mine")
    index.symlink_to(elsewhere)
    assert truth_index.query(truth, ReadStats(""), 5, None, None, {"pending": True}, None) is None
    found = truth.query(100000, pending=True)
    assert ([m.to_dict() for m in found.messages], found.total, found.complete) == want
    assert elsewhere.read_bytes() == b"mine"


def test_readers_and_writers_at_once_leave_a_true_index(isolated: Path) -> None:
    """Writers append while readers query through the index (each catching it up): every line is indexed once,
    and the index's answers stay the scan's."""
    home = isolated / "home"
    truth = TruthFile(home)
    truth.append({"event": "start", "ts": time.time()})
    writer = textwrap.dedent(
        """
        import sys
        from pathlib import Path
        from drover.truth import TruthFile
        t = TruthFile(Path(sys.argv[1]))
        for n in range(150):
            mid, _ = t.accept(actor=sys.argv[2], host="local", target="t", text="x" * (n * 37 % 3000), options={})
            if n % 7:
                t.outcome(mid, {"outcome": "delivered"})
        """
    )
    reader = textwrap.dedent(
        """
        import sys
        from pathlib import Path
        from drover import truth_query
        from drover.truth import TruthFile
        truth_query.SCAN_BUDGET = 0
        t = TruthFile(Path(sys.argv[1]))
        for n in range(40):
            found = t.query(100000, pending=True)
            assert all(m.outcome is None for m in found.messages)
            assert t.query(3, actor="w1").stats.skipped == 0
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", writer, str(home), f"w{i}"], env=env) for i in range(2)]
    procs += [subprocess.Popen([sys.executable, "-c", reader, str(home)], env=env) for _ in range(2)]
    for p in procs:
        p.wait(timeout=240)
    assert [p.returncode for p in procs] == [0, 0, 0, 0]
    for q in ({"pending": True, "limit": 100000}, {"actor": "w0", "limit": 100000}, {"actor": "w1", "limit": 9}):
        indexed = ask(truth, q, "index")
        assert indexed[:3] == ask(truth, q, "scan")[:3], q
    assert len(ask(truth, {"pending": True, "limit": 100000}, "index")[0]) == 2 * 22
    with sqlite3.connect(home / truth_index.INDEX) as conn:
        assert conn.execute("SELECT COUNT(*), COUNT(DISTINCT id) FROM msgs").fetchone() == (300, 300)
        assert conn.execute("SELECT COUNT(*) FROM bad").fetchone() == (0,)


def big_file(home: Path, events: int) -> None:
    """As bench/truthlog.py writes them: accepted and outcome pairs, 1 in 997 pending, written fast."""
    home.mkdir(mode=0o700, exist_ok=True)
    start = time.time() - 86400
    with open(home / "truth.jsonl", "w", encoding="utf-8") as f:
        for n in range(events // 2):
            ts = start + n * 0.1
            msg_id = f"msg_{int(ts * 1000):012x}{n:010x}"
            acc = {"v": 1, "event": "accepted", "id": msg_id, "time": now_iso(ts), "ts": ts, "actor": f"a{n % 5}"}
            acc.update(host="local", target=f"agent-{n % 40}", text_chars=80, text="rebase on main, run the suite " * 3)
            f.write(json.dumps(acc, separators=(",", ":")) + "\n")
            if n % 997:
                out = {"v": 1, "event": "outcome", "id": msg_id, "time": now_iso(ts), "ts": ts + 0.4}
                out.update(outcome="delivered", lane="tmux", detail="pasted and submitted", session={"id": "%7"})
                f.write(json.dumps(out, separators=(",", ":")) + "\n")
    os.chmod(home / "truth.jsonl", 0o600)


def peak_mb(fn: Callable[[], Any]) -> tuple[float, Any]:
    tracemalloc.start()
    try:
        result = fn()
        return tracemalloc.get_traced_memory()[1] / 1e6, result
    finally:
        tracemalloc.stop()


# Slow by its data (tests/support/tiers.py cannot see that): 40,000 events read under tracemalloc cost ~4 s of CPU
# per case, half the fast tier.
@pytest.mark.slow
@pytest.mark.parametrize("how", ["index", "scan"])
def test_filters_that_read_the_whole_file_hold_bounded_memory(isolated: Path, how: str) -> None:
    """`log --actor nobody` and `log --pending` over 40,000 events read all of it; what they hold does not grow
    with it (it did: every outcome met stayed in memory, 29 MB here, a gigabyte over a million events).  `scan`:
    the index cannot be made (a directory holds its name), so the scan reads the whole file."""
    home = isolated / "home"
    big_file(home, 40_000)
    if how == "scan":
        (home / truth_index.INDEX).mkdir()
    truth = TruthFile(home)
    peak, found = peak_mb(lambda: truth.query(50, actor="nobody"))
    assert found.messages == [] and found.complete
    assert peak < 12, f"{peak:.1f} MB"
    peak, found = peak_mb(lambda: truth.query(100, pending=True))
    assert len(found.messages) == 21 and found.complete and all(m.outcome is None for m in found.messages)
    assert peak < 12, f"{peak:.1f} MB"
    assert (home / truth_index.INDEX).is_file() == (how == "index")


def test_a_reader_killed_mid_build_leaves_an_index_the_next_one_finishes(isolated: Path) -> None:
    """SIGKILL in the middle of a catch-up transaction (rows written, not committed): the next reader finds
    SQLite's journal, gets the index as of the last commit, and catches it up from there."""
    home = isolated / "home"
    big_file(home, 8000)
    crasher = textwrap.dedent(
        """
        import os, signal, sys
        from pathlib import Path
        from drover import truth_index, truth_query
        from drover.truth import TruthFile
        truth_query.SCAN_BUDGET = 0
        truth_index.BATCH = 1000
        real, calls = truth_index._index, []
        def dying(*args):
            upto = real(*args)
            calls.append(upto)
            if len(calls) == 4:
                os.kill(os.getpid(), signal.SIGKILL)  # inside the transaction, before its COMMIT
            return upto
        truth_index._index = dying
        TruthFile(Path(sys.argv[1])).query(50, pending=True)
        """
    )
    proc = subprocess.run([sys.executable, "-c", crasher, str(home)], env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == -9
    assert (home / (truth_index.INDEX + "-journal")).exists()  # a hot journal: the transaction was cut short
    committed = (home / "truth.jsonl").read_bytes().split(b"\n")[:3000]  # three batches of 1,000 lines
    with sqlite3.connect(home / truth_index.INDEX) as conn:  # opening it rolls the cut transaction back
        assert conn.execute("SELECT COUNT(*) FROM msgs").fetchone()[0] == sum(b'"accepted"' in raw for raw in committed)
    truth = TruthFile(home)
    for q in ({"pending": True, "limit": 100000}, {"actor": "a3", "limit": 30}, {"actor": "nobody"}):
        assert ask(truth, q, "index")[:3] == ask(truth, q, "scan")[:3], q
    with sqlite3.connect(home / truth_index.INDEX) as conn:
        assert conn.execute("SELECT COUNT(*), COUNT(DISTINCT id) FROM msgs").fetchone() == (4000, 4000)
        assert conn.execute("SELECT v FROM meta WHERE k = 'upto'").fetchone()[0] == (home / "truth.jsonl").stat().st_size
