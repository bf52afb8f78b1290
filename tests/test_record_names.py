"""Records follow the worker: `drover log --target X` and `drover spawns --target X` find a session's messages by
any spelling of it (name, session id or an 8+ hex prefix of it, pid, tmux pane, identity), whether the message
was a plain send, a nudge, a broadcast or a spawn's brief, redirected or not, from the scan and from the index
alike -- and a reused name, pid or pane, a target typed to look like an id or an envelope, finds nothing it
should not."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from drover import truth_index
from drover.record import Query, ReadStats, names_match, session_of, spellings
from drover.truth import TruthFile
from tests.conftest import Tmux, remote_agent, wait_for
from tests.support.sshfleet import SSHFleet

A = "aaaabbbb-1111-4222-8333-444455556666"  # a Claude session id
B = "ccccdddd-1111-4222-8333-444455556666"  # another, later, that took A's name
NO_FILTERS = {"host": None, "target": None, "actor": None, "outcome": None, "pending": False}


def claude(sid: str, name: str, pid: int, pane: str = "%3", server: str = "default") -> dict[str, Any]:
    """A resolve answer for a Claude session in a pane, as the host gives it."""
    session = {"id": sid, "name": name, "pid": pid, "pane": pane, "server": server, "engine": "claude", "target": f"{name}:0.0"}
    return {"session": session, "identity": f"claude:{sid}", "pin": sid, "matched": "name"}


def pane(pane_id: str, name: str, pid: int, server: str = "default") -> dict[str, Any]:
    """A resolve answer for a tmux pane session (a demo agent, a Codex TUI)."""
    session = {"id": pane_id, "name": name, "pid": pid, "server": server, "engine": "demo", "target": f"{name}:0.0"}
    return {"session": session, "identity": f"tmux:{server}/{pane_id}@{pid}", "pin": f"{server}/{pane_id}"}


def sent(truth: TruthFile, target: str, resolved: dict[str, Any] | None, host: str = "local", **extra: Any) -> str:
    """A message as sessions_message records it: options.session from the resolution, an outcome naming it."""
    options: dict[str, Any] = dict(extra)
    if resolved is not None:
        options.update(identity=resolved["identity"], pin=resolved["pin"], session=session_of(resolved))
    msg_id, _ = truth.accept(actor="coord", host=host, target=target, text=f"to {target}", options=options)
    brief = None if resolved is None else {k: resolved["session"][k] for k in ("id", "server", "name", "engine", "pid")}
    truth.outcome(msg_id, {"outcome": "delivered" if resolved else "failed", "lane": "tmux", "session": brief})
    return msg_id


def found(truth: TruthFile, target: str, host: str | None = None) -> list[str]:
    """The ids `log --target` gives, from the scan and from the index: they must agree."""
    filters = {**NO_FILTERS, "target": target, "host": host}
    scanned = truth._scan(1000, None, filters, None, None)
    indexed = truth_index.query(truth, ReadStats(str(truth.path)), 1000, None, None, filters, None)
    assert isinstance(indexed, Query), "the index was not used"
    ids = [m.id for m in scanned.messages]
    assert [m.id for m in indexed.messages] == ids, target
    assert [m.to_dict() for m in indexed.messages] == [m.to_dict() for m in scanned.messages]
    return ids


@pytest.fixture
def truth(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> TruthFile:
    """The record; its index must be right on its own, never caught lying by the file and dropped (the answer
    would still be right, from the rebuilt index, and hide the lie)."""

    def lied(_truth: Any) -> None:
        raise AssertionError("the index named a message the file does not match")

    monkeypatch.setattr(truth_index, "_drop", lied)
    return TruthFile(isolated / "home")


# -- the spellings, pure --------------------------------------------------------------------------------------------


def test_every_spelling_of_a_resolved_session_names_it_and_nothing_else_does() -> None:
    acc = {"target": "worker-3", "options": {"session": session_of(claude(A, "worker-3", 4242, "%7", "main"))}}
    names, ids = spellings(acc)
    for typed in ("worker-3", A, A[:8], A[:13], "4242", "%7", "main/%7", f"claude:{A}", "worker-3:0.0"):
        assert names_match(typed, names, ids), typed
    for typed in (A[:7], "worker", "worker-", "424", "%70", "other/%7", f"claude:{A[:8]}", A.upper()[:8], ""):
        assert not names_match(typed, names, ids), typed


def test_a_codex_panes_thread_names_it_by_its_id_and_a_prefix() -> None:
    resolved = pane("%2", "api", 77)
    resolved["session"].update(engine="codex", thread="019a5c2e-7b1d-7e3a-9c4f-0a1b2c3d4e5f")
    names, ids = spellings({"target": "api", "options": {"session": session_of(resolved)}})
    for typed in ("019a5c2e-7b1d-7e3a-9c4f-0a1b2c3d4e5f", "019a5c2e", "%2", "default/%2", "77", "tmux:default/%2@77"):
        assert names_match(typed, names, ids), typed
    assert not names_match("019a5c2", names, ids)


def test_a_target_typed_to_look_like_an_id_is_matched_only_as_typed() -> None:
    """A failed send to `aaaabbbb1234` (no session had it) is no message of the session whose id it prefixes."""
    names, ids = spellings({"target": A[:8] + "1234", "options": {}}, None)
    assert not names_match(A[:8], names, ids)
    assert names_match(A[:8] + "1234", names, ids)


# -- over the record: the scan and the index agree ----------------------------------------------------------------------


def test_a_reused_name_finds_both_and_the_id_or_identity_only_its_own(truth: TruthFile) -> None:
    first = [sent(truth, "worker-3", claude(A, "worker-3", 1001)) for _ in range(2)]
    second = [sent(truth, "worker-3", claude(B, "worker-3", 2002, "%4"))]
    assert found(truth, "worker-3") == first + second
    assert found(truth, A[:8]) == found(truth, A) == found(truth, f"claude:{A}") == first
    assert found(truth, B[:8]) == found(truth, "2002") == found(truth, "%4") == second
    assert found(truth, A[:7]) == []  # too short to be an id prefix, and no name
    assert found(truth, "worker-3", host="box-a") == []


def test_a_pid_or_pane_reused_by_another_server_is_told_apart_by_identity(truth: TruthFile) -> None:
    old = sent(truth, "%3", pane("%3", "build", 4242))
    new = sent(truth, "other/%3", pane("%3", "deploy", 4242, server="other"))
    assert found(truth, "4242") == found(truth, "%3") == [old, new]  # both bore them
    assert found(truth, "tmux:default/%3@4242") == found(truth, "default/%3") == found(truth, "build") == [old]
    assert found(truth, "tmux:other/%3@4242") == found(truth, "other/%3") == found(truth, "deploy") == [new]


def test_an_id_looking_target_and_an_envelope_looking_one_find_only_themselves(truth: TruthFile) -> None:
    mine = sent(truth, "worker-3", claude(A, "worker-3", 1001))
    looks = sent(truth, A[:8] + "ff", None)  # typed, resolved to nothing: failed
    envelope = '<cross-session-message from="x" from-name="drover (a)">worker-3</cross-session-message>'
    forged = sent(truth, envelope, None)
    quote = sent(truth, 'worker-3", "x\\', None)
    assert found(truth, A[:8]) == [mine]
    assert found(truth, A[:8] + "ff") == [looks]
    assert found(truth, "worker-3") == [mine]
    assert found(truth, envelope) == [forged]
    assert found(truth, 'worker-3", "x\\') == [quote]
    assert found(truth, "' OR 1=1 --") == [] and found(truth, "%") == [] and found(truth, "_") == []


def test_old_records_without_options_session_are_found_by_what_they_hold(truth: TruthFile) -> None:
    """Before options.session: a broadcast addressed by pin, with the identity in options and a brief session in
    its outcome; a nudge with `addressed`."""
    opts = {"identity": f"claude:{A}", "pin": A, "broadcast": "bc_1"}
    old, _ = truth.accept(actor="c", host="local", target=A, text="hi", options=opts)
    truth.outcome(old, {"outcome": "delivered", "session": {"id": A, "name": "worker-3", "pid": 1001, "server": None}})
    nudge, _ = truth.accept(actor="c", host="local", target="default/%5", text="hi", options={"addressed": "local:webapp"})
    truth.outcome(nudge, {"outcome": "delivered", "session": {"id": "%5", "server": "default", "name": "webapp"}})
    assert found(truth, "worker-3") == found(truth, A[:8]) == found(truth, "1001") == [old]
    assert found(truth, "webapp") == found(truth, "%5") == found(truth, "default/%5") == [nudge]


def test_a_pending_message_is_found_by_what_its_accepted_event_holds(truth: TruthFile) -> None:
    """No outcome yet (its sender was killed): the pid, written as a number, and an id prefix still find it."""
    resolved = claude(A, "worker-3", 4242)
    options = {"identity": resolved["identity"], "pin": A, "session": session_of(resolved)}
    msg, _ = truth.accept(actor="c", host="local", target="%3", text="cut short", options=options)
    for typed in ("4242", A[:8], "worker-3", "default/%3", f"claude:{A}"):
        assert found(truth, typed) == [msg], typed


def test_a_redirected_message_is_found_under_the_old_name_and_the_new(truth: TruthFile) -> None:
    msg = sent(truth, "ocean", pane("%9", "ocean-3", 77), redirected_from="local:ocean")
    assert found(truth, "ocean") == found(truth, "ocean-3") == found(truth, "%9") == [msg]


def test_only_the_newest_outcome_names_the_session_in_the_index_as_in_the_scan(truth: TruthFile) -> None:
    """A retry's outcome names another session than the first did: the index forgets the first one's names (it is
    right, not caught lying by the file and rebuilt: the fixture fails a test whose index is dropped)."""
    msg, _ = truth.accept(actor="c", host="local", target="t", text="x", options={})
    truth.outcome(msg, {"outcome": "failed", "indeterminate": True, "session": {"id": "%1", "name": "first"}})
    assert found(truth, "first") == [msg]  # the index is built here, with the first outcome
    truth.outcome(msg, {"outcome": "delivered", "attempt": "retry", "session": {"id": "%2", "name": "second"}})
    assert found(truth, "first") == [] and found(truth, "second") == [msg]


def test_an_index_of_the_old_format_is_rebuilt_not_trusted(truth: TruthFile) -> None:
    msg = sent(truth, "%3", pane("%3", "worker-3", 4242))
    assert found(truth, "worker-3") == [msg]
    index = truth.home / truth_index.INDEX
    with sqlite3.connect(index) as conn:  # as format 1 (before `names`) left it: covering the file, no names table
        conn.execute("UPDATE meta SET v = 1 WHERE k = 'format'")
        conn.execute("DROP TABLE names")
    assert found(truth, "worker-3") == [msg]
    with sqlite3.connect(index) as conn:
        assert conn.execute("SELECT v FROM meta WHERE k = 'format'").fetchone() == (truth_index.FORMAT,)
        assert conn.execute("SELECT COUNT(*) FROM names").fetchone()[0] > 0


def test_spawns_by_any_spelling(truth: TruthFile, cli: Any) -> None:
    def spawn(sid: str, name: str, pane_id: str, pid: int) -> None:
        base = {"v": 1, "id": sid, "ts": 1.0, "host": "local"}
        truth.append({**base, "event": "spawn_requested", "name": name, "engine": "claude", "cwd": "/w"})
        spawned = {"session": A if pid == 1001 else B, "name": name, "pane": pane_id, "server": "default", "pid": pid}
        truth.append({**base, "event": "spawned", "identity": f"claude:{spawned['session']}", **spawned})

    spawn("spawn_1", "worker-3", "%3", 1001)
    spawn("spawn_2", "worker-3", "%4", 2002)

    def ids(target: str, *more: str) -> list[str]:
        res = cli("spawns", "--target", target, *more, "--json")
        assert res.code == 0, res.err
        return [r["spawn_id"] for r in res.json()["data"]["spawns"]]

    assert ids("worker-3") == ids("local:worker-3") == ["spawn_1", "spawn_2"]
    assert ids("local:%3", "--host", "local") == ["spawn_1"] and ids("local:%3", "--host", "elsewhere") == []
    assert ids(A[:8]) == ids(f"claude:{A}") == ids("%3") == ids("1001") == ids("default/%3") == ["spawn_1"]
    assert ids(B) == ids("local:%4") == ["spawn_2"]
    assert ids("worker") == ids(A[:7]) == []


# -- bounded -------------------------------------------------------------------------------------------------------


@pytest.mark.slow  # 40,000 events read under tracemalloc, twice
@pytest.mark.parametrize("how", ["index", "scan"])
def test_log_target_over_a_big_record_holds_bounded_memory(isolated: Path, how: str) -> None:
    from tests.test_truth_index import peak_mb

    home = isolated / "home"
    home.mkdir(mode=0o700)
    with open(home / "truth.jsonl", "w", encoding="utf-8") as f:
        for n in range(20_000):
            sid = f"{n % 40:08x}-1111-4222-8333-444455556666"
            resolved = claude(sid, f"agent-{n % 40}", 1000 + n % 40)
            options = {"identity": resolved["identity"], "pin": sid, "session": session_of(resolved)}
            msg_id = f"msg_{n:022x}"
            acc = {"v": 1, "event": "accepted", "id": msg_id, "ts": 1e9 + n, "actor": "a", "host": "local"}
            acc.update(target=sid, text="rebase on main " * 5, text_chars=75, options=options)
            out = {"v": 1, "event": "outcome", "id": msg_id, "ts": 1e9 + n, "outcome": "delivered"}
            out["session"] = {k: resolved["session"][k] for k in ("id", "name", "pid")}
            f.write(json.dumps(acc, separators=(",", ":")) + "\n" + json.dumps(out, separators=(",", ":")) + "\n")
    (home / "truth.jsonl").chmod(0o600)
    if how == "scan":
        (home / truth_index.INDEX).mkdir()  # no index can be made: the scan reads the whole file
    truth = TruthFile(home)
    peak, got = peak_mb(lambda: truth.query(50, target="nobody-at-all"))
    assert got.messages == [] and got.complete
    assert peak < 12, f"{peak:.1f} MB"
    peak, got = peak_mb(lambda: truth.query(100000, target="00000007"))  # an id prefix: 500 messages, all of them
    assert len(got.messages) == 500 and got.complete and all(m.options["session"]["name"] == "agent-7" for m in got.messages)
    assert peak < 12, f"{peak:.1f} MB"
    assert (home / truth_index.INDEX).is_file() == (how == "index")


# -- real sessions: send, nudge, broadcast, spawn ---------------------------------------------------------------------


def log_ids(cli: Any, target: str) -> list[str]:
    res = cli("log", "--target", target, "--json")
    assert res.code == 0, res.err
    return [m["id"] for m in res.json()["data"]["messages"]]


def accepted(isolated: Path, msg_id: str) -> dict[str, Any]:
    lines = (isolated / "home" / "truth.jsonl").read_text().splitlines()
    return next(e for e in map(json.loads, lines) if e.get("event") == "accepted" and e["id"] == msg_id)


def test_local_by_pane_found_by_name_and_back_through_every_path(tmux: Tmux, cli: Any, isolated: Path) -> None:
    worker = tmux.agent("worker-3")
    stranger = tmux.agent("worker-4")
    by_pane = cli("send", f"local:{worker.id}", "by the pane", "--json").json()["data"]["id"]
    by_name = cli("send", "local:worker-3", "by the name", "--json").json()["data"]["id"]
    wait_for(lambda: len(worker.messages()) == 2, what="both delivered")
    # Both panes share a directory: the nudge is refused, and recorded with the session it resolved to.
    nudge = cli("nudge", "local:worker-3", "a nudge", "--json").json()["data"]
    assert nudge["code"] == "shared_cwd", nudge
    assert "pin" not in accepted(isolated, nudge["id"])["options"]  # named, never a send `drover retry` would finish
    nudged = nudge["id"]
    worker.wait_idle()
    stranger.wait_idle()
    drafting = tmux.agent("worker-5")
    drafting.tmux("send-keys", "-t", drafting.id, "-l", "half a thought of my own")
    wait_for(lambda: "half a thought" in drafting.screen(), what="the draft on screen")
    cast = cli("broadcast", "--host", "local", "--name", "worker-*", "to all", "--json")
    casts = {r["session"]["name"]: r["id"] for r in cast.json()["data"]["messages"]}
    assert {r["session"]["name"]: r["outcome"] for r in cast.json()["data"]["messages"]}["worker-5"] == "skipped"
    # Skipped (a person's draft): recorded as refused, with the session it was for, by any spelling.
    assert log_ids(cli, "worker-5") == log_ids(cli, drafting.id) == log_ids(cli, str(drafting.pid)) == [casts["worker-5"]]
    mine = [by_pane, by_name, nudged, casts["worker-3"]]
    session = accepted(isolated, casts["worker-3"])["options"]["session"]
    assert session["identity"] == f"tmux:default/{worker.id}@{worker.pid}" and session["pane"] == worker.id
    for msg_id in mine:
        assert accepted(isolated, msg_id)["options"]["session"]["identity"] == session["identity"], msg_id
    for typed in ("worker-3", worker.id, f"local:{worker.id}", f"default/{worker.id}", str(worker.pid), session["identity"]):
        assert log_ids(cli, typed) == mine, typed
    assert log_ids(cli, "worker-4") == [casts["worker-4"]]
    assert log_ids(cli, "worker") == []


def test_a_spawned_sessions_brief_is_found_by_its_name_pane_and_pid(tmux: Tmux, cli: Any, isolated: Path) -> None:
    from tests.test_spawn import demo_template, fleet_with

    fleet = isolated / "fleet.toml"
    fleet_with(fleet, {"demo": f'command = "{demo_template(isolated)}"'})
    res = cli(
        "--fleet",
        str(fleet),
        "spawn",
        "local",
        "--engine",
        "demo",
        "--cwd",
        str(isolated),
        "--name",
        "scout",
        "--brief",
        "look around",
        "--json",
    )
    assert res.code == 0, res.err
    data = res.json()["data"]
    brief = data["brief"]["id"]
    assert accepted(isolated, brief)["options"]["session"]["name"] == "scout"
    for typed in ("scout", data["pane"], str(data["pid"]), data["identity"]):
        assert log_ids(cli, typed) == [brief], typed
        spawns = cli("--fleet", str(fleet), "spawns", "--target", typed, "--json").json()["data"]["spawns"]
        assert [r["spawn_id"] for r in spawns] == [data["spawn_id"]], typed


def test_a_handoff_redirected_message_is_listed_under_both_names(tmux: Tmux, cli: Any) -> None:
    old, new = tmux.agent("ocean"), tmux.agent("ocean-2")
    assert cli("handoff", "local:ocean", "local:ocean-2").code == 0
    old.tmux("kill-session", "-t", old.id)
    doc = cli("send", "local:ocean", "after the first left", "--json").json()["data"]
    assert doc["redirected_from"] == "local:ocean"
    wait_for(lambda: new.messages(), what="the successor got it")
    assert log_ids(cli, "local:ocean") == log_ids(cli, "ocean-2") == log_ids(cli, new.id) == [doc["id"]]


def test_over_ssh_by_pane_found_by_name_on_that_host_only(sshfleet: SSHFleet, isolated: Path, cli: Any) -> None:
    worker = remote_agent(sshfleet, "h1", "worker-3", isolated)
    namesake = remote_agent(sshfleet, "h2", "worker-3", isolated)
    by_pane = cli("send", f"h1:{worker.id}", "by the pane", "--json")
    assert by_pane.code == 0, by_pane.err
    by_name = cli("send", "h1:worker-3", "by the name", "--json")
    assert by_name.code == 0, by_name.err
    there = cli("send", "h2:worker-3", "to the namesake", "--json").json()["data"]["id"]
    mine = [by_pane.json()["data"]["id"], by_name.json()["data"]["id"]]
    wait_for(lambda: len(worker.messages()) == 2 and namesake.messages(), what="all delivered")
    assert log_ids(cli, "h1:worker-3") == log_ids(cli, f"h1:{worker.id}") == mine
    assert log_ids(cli, "h2:worker-3") == [there]
    assert log_ids(cli, "worker-3") == [*mine, there]
    identity = accepted(isolated, mine[0])["options"]["session"]["identity"]
    assert log_ids(cli, f"h1:{identity}") == mine and log_ids(cli, f"h2:{identity}") == []


def test_a_send_killed_after_its_accepted_event_is_pending_under_every_spelling(tmux: Tmux, cli: Any) -> None:
    """kill -9 between the accepted event and the delivery: what the record holds of the session was written
    ahead, so `log --pending --target` finds it by the pane, the pid or the name it was not addressed by."""
    from tests.conftest import drover_process

    worker = tmux.agent("worker-3")
    killed = drover_process("send", f"local:{worker.id}", "cut short", env={"DROVER_FAULT": "after_accept"})
    assert killed.code == -9, killed
    for typed in ("worker-3", str(worker.pid), f"default/{worker.id}"):
        res = cli("log", "--pending", "--target", typed, "--json")
        assert res.code == 0, res.err
        assert [m["text"] for m in res.json()["data"]["messages"]] == ["cut short"], typed
    assert worker.messages() == []


def test_real_claude_a_reused_name_is_told_apart_by_id_prefix_and_identity(claude_lab: Any, cli: Any) -> None:
    import subprocess

    first = claude_lab.start("worker-3")
    mine = []
    for target in (f"local:{first.pane}", "local:worker-3", f"local:{first.session_id[:8]}"):
        res = cli("send", target, f"to {target}", "--json")
        assert res.code == 0 and res.json()["data"]["lane"] == "inbox", res.err
        mine.append(res.json()["data"]["id"])
    subprocess.run([*claude_lab.prefix, "kill-session", "-t", "worker-3"], capture_output=True, timeout=10)

    def claudes() -> list[dict[str, Any]]:
        return [s for s in cli("ls", "--json").json()["data"]["sessions"] if s["engine"] == "claude"]

    wait_for(lambda: not claudes(), what="the first worker-3 gone")
    second = claude_lab.start("worker-3")
    assert second.session_id != first.session_id
    res = cli("send", "local:worker-3", "to the newcomer", "--json")
    assert res.code == 0, res.err
    theirs = [res.json()["data"]["id"]]
    assert log_ids(cli, "worker-3") == log_ids(cli, "local:worker-3") == mine + theirs
    for typed in (first.session_id, first.session_id[:8], f"claude:{first.session_id}", str(first.pid)):
        assert log_ids(cli, typed) == mine, typed
    for typed in (second.session_id[:8], f"claude:{second.session_id}"):
        assert log_ids(cli, typed) == theirs, typed
    # The tmux server went with the first one's last session: the new one's pane is %0 again, and both bore it.
    assert log_ids(cli, second.pane) == (mine + theirs if second.pane == first.pane else theirs)


def test_writers_and_readers_at_once_leave_true_names_in_the_index(isolated: Path) -> None:
    """Two senders append messages to two sessions while two readers ask by name through the index (each catching
    it up): afterwards every spelling finds, from the index, exactly what the scan finds."""
    import os
    import subprocess
    import sys
    import textwrap

    from tests.conftest import ROOT

    home = isolated / "home"
    truth = TruthFile(home)
    truth.append({"event": "start", "ts": 1.0})
    writer = textwrap.dedent(
        """
        import sys
        from pathlib import Path
        from drover.record import session_of
        from drover.truth import TruthFile
        t = TruthFile(Path(sys.argv[1]))
        me = sys.argv[2]
        sid = me * 8 + "-1111-4222-8333-444455556666"
        resolved = {"session": {"id": sid, "name": "w-" + me, "pid": 4000 + ord(me), "pane": "%" + me},
                    "identity": "claude:" + sid, "pin": sid}
        for n in range(120):
            options = {"identity": resolved["identity"], "pin": sid, "session": session_of(resolved)}
            mid, _ = t.accept(actor=me, host="local", target=("%" + me) if n % 2 else "w-" + me, text="x" * n, options=options)
            if n % 5:
                t.outcome(mid, {"outcome": "delivered", "session": {"id": sid, "name": "w-" + me}})
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
        for n in range(30):
            for typed, whose in (("w-a", "a"), ("bbbbbbbb", "b"), ("%a", "a"), ("4098", "b")):  # 4000 + ord("b")
                found = t.query(100000, target=typed)
                assert all(m.actor == whose for m in found.messages), typed
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", writer, str(home), me], env=env) for me in ("a", "b")]
    procs += [subprocess.Popen([sys.executable, "-c", reader, str(home)], env=env) for _ in range(2)]
    for p in procs:
        p.wait(timeout=240)
    assert [p.returncode for p in procs] == [0, 0, 0, 0]
    for me in ("a", "b"):
        sid = me * 8 + "-1111-4222-8333-444455556666"
        want = found(truth, f"w-{me}")
        assert len(want) == 120
        for typed in (f"%{me}", sid[:8], sid, f"claude:{sid}", str(4000 + ord(me))):
            assert found(truth, typed) == want, typed
