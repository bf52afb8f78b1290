"""A remote worker's `drover done` seen by its coordinator: the host's own record read by its helper (list, status,
wait_many, watch run's list), matched by identity, trusted only as drover's own -- with real demo agents spawned on
the real SSH fleet (h1, h2) running `drover done` as their tool, and the record reader alone on crafted records."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import drover
from drover import paths
from drover.ops.live_state import list_args
from drover.remote import own_record
from tests.conftest import ROOT, remote_agent, wait_for
from tests.support.sshfleet import SSHFleet, free_port

DROVER = f"{sys.executable} -m drover"


# -- the record reader, alone ---------------------------------------------------------------------------------------


def line(kind: str, identity: str, name: str, ts: float, host: str = "local", **more: Any) -> str:
    ev = {"v": 1, "event": kind, "id": f"lc_{identity}_{ts}", "ts": ts, "time": "t", "host": host}
    ev["session"] = {"identity": identity, "name": name}
    ev.update(more)
    return json.dumps(ev, separators=(",", ":"))


def write(home: Path, lines: list[str], tail: str = "") -> Path:
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = home / "truth.jsonl"
    path.write_text("".join(x + "\n" for x in lines) + tail, encoding="utf-8")
    path.chmod(0o600)
    return path


def test_the_home_is_found_as_drover_finds_it() -> None:
    for env in (
        {"DROVER_HOME": "~/dh", "XDG_STATE_HOME": "/x", "HOME": "/h"},
        {"XDG_STATE_HOME": "/x", "HOME": "/h"},
        {"HOME": "/h"},
        {"DROVER_HOME": "", "XDG_STATE_HOME": "", "HOME": "/h"},
    ):
        assert own_record.home(env) == paths.home(env), env


def test_events_are_taken_by_identity_newest_first_never_by_name(tmp_path: Path) -> None:
    home = tmp_path / "d"
    write(
        home,
        [
            line("done", "tmux:s/%1@10", "w1", 100.0, summary="old w1"),
            line("done", "tmux:s/%9@99", "w1", 150.0, summary="another w1: a reused name"),
            line("done", "tmux:s/%1@10", "w1", 160.0, host="h7", summary="about a session of another host"),
            line("failed", "tmux:s/%1@10", "w1", 200.0, summary="newest"),
        ],
        tail='{"v":1,"event":"done","id":"torn","session":{"identity":"tmux:s/%1@10"',  # a writer mid-line
    )
    got = own_record.events(["tmux:s/%1@10"], path_home=str(home))
    assert [e["summary"] for e in got["events"]] == ["newest", "old w1"]
    assert got["complete"] and got["warnings"] == [] and got["record"] == str(home / "truth.jsonl")
    assert all(e["record"] == str(home / "truth.jsonl") for e in got["events"])
    newest = own_record.events(["tmux:s/%1@10"], ("done", "failed"), path_home=str(home), newest_only=True)
    assert [e["summary"] for e in newest["events"]] == ["newest"]
    assert own_record.events(["w1"], path_home=str(home))["events"] == []  # a name is no identity


def test_the_read_is_bounded_by_bytes_and_by_a_since_time(tmp_path: Path) -> None:
    home = tmp_path / "d"
    filler = [json.dumps({"v": 1, "event": "accepted", "id": f"m{i}", "ts": 150.0, "text": "x" * 200}) for i in range(3000)]
    write(
        home, [line("done", "tmux:s/%1@10", "w1", 100.0, summary="far back"), *filler, line("done", "tmux:s/%2@20", "w2", 300.0)]
    )
    bounded = own_record.events(["tmux:s/%1@10", "tmux:s/%2@20"], max_bytes=64 * 1024, path_home=str(home))
    assert [e["session"]["name"] for e in bounded["events"]] == ["w2"]
    assert bounded["complete"] is False and bounded["read_bytes"] == 64 * 1024
    whole = own_record.events(["tmux:s/%1@10"], path_home=str(home))
    assert [e["summary"] for e in whole["events"]] == ["far back"]
    assert own_record.events(["tmux:s/%1@10"], since=200.0, path_home=str(home))["events"] == []


def test_a_record_not_to_trust_gives_no_done_and_a_warning(tmp_path: Path) -> None:
    home = tmp_path / "d"
    real = write(home, [line("done", "tmux:s/%1@10", "w1", 100.0)])
    elsewhere = tmp_path / "elsewhere.jsonl"
    real.rename(elsewhere)
    (home / "truth.jsonl").symlink_to(elsewhere)
    got = own_record.events(["tmux:s/%1@10"], path_home=str(home))
    assert got["events"] == [] and "symlink" in got["warnings"][0], got
    (home / "truth.jsonl").unlink()
    elsewhere.rename(real)
    real.chmod(0o620)
    got = own_record.events(["tmux:s/%1@10"], path_home=str(home))
    assert got["events"] == [] and "writable by group" in got["warnings"][0], got
    real.chmod(0o600)
    os.link(real, tmp_path / "another-name")
    got = own_record.events(["tmux:s/%1@10"], path_home=str(home))
    assert got["events"] == [] and "hard links" in got["warnings"][0], got
    (tmp_path / "another-name").unlink()
    if os.geteuid() != 0:  # root reads a mode-000 file all the same
        real.chmod(0)
        got = own_record.events(["tmux:s/%1@10"], path_home=str(home))
        assert got["events"] == [] and "cannot read" in got["warnings"][0], got
        real.chmod(0o600)
    assert len(own_record.events(["tmux:s/%1@10"], path_home=str(home))["events"]) == 1  # trusted again
    assert own_record.events(["x"], path_home=str(tmp_path / "none"))["warnings"] == []  # no record yet: no words


def test_the_helper_op_answers_and_refuses_bad_arguments_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from drover.remote import main
    from drover.remote import protocol as P

    monkeypatch.setenv("DROVER_HOME", str(tmp_path / "d"))
    write(tmp_path / "d", [line("done", "tmux:s/%1@10", "w1", 100.0, summary="here")])

    def ask(args: dict[str, Any]) -> dict[str, Any]:
        return main.handle({"helper": P.PROTOCOL, "op": "lifecycle", "args": args})

    ok = ask({"identities": ["tmux:s/%1@10"], "since": 50.0, "max_bytes": 4096})
    assert ok["ok"] and [e["summary"] for e in ok["data"]["events"]] == ["here"], ok
    for bad in ({"identities": "tmux:s/%1@10"}, {"identities": [], "kinds": ["accepted"]}, {"identities": [], "max_bytes": -1}):
        got = ask(bad)
        assert not got["ok"] and got["error"]["code"] == P.BAD_REQUEST and "\n" not in got["error"]["message"], got


def test_local_is_never_asked_for_its_record_again() -> None:
    assert "lifecycle" not in list_args("local", True, ["tmux:x"])
    assert list_args("h1", True, ["tmux:x"]) == {"state": True, "lifecycle": True, "lifecycle_of": ["tmux:x"]}


# -- on the SSH fleet -----------------------------------------------------------------------------------------------


def records(isolated: Path, kind: str | None = None) -> list[dict[str, Any]]:
    path = isolated / "home" / "truth.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    return [r for r in rows if kind is None or r["event"] == kind]


def spawn(name: str, host: str, brief: str = "do the thing") -> dict[str, Any]:
    doc = drover.run("sessions.spawn", {"host": host, "engine": "demo", "cwd": "~", "name": name, "brief": brief}, actor="coord")
    assert doc.ok, doc.errors
    assert doc.data["state"] == "ready"
    return dict(doc.data)


def status(target: str) -> dict[str, Any]:
    host, _, name = target.partition(":")
    doc = drover.run("sessions.status", {"host": host, "id": name})
    assert doc.ok, doc.errors
    return dict(doc.data)


def watch() -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "drover", "watch", "run", "--json"], capture_output=True, text=True, timeout=300, cwd=ROOT
    )


def kill_worker(fleet: SSHFleet, host: str, data: dict[str, Any]) -> None:
    """kill -9 its demo agent (the fleet's hosts are users of this machine), then its window."""
    pid = fleet.tmux(host, "display-message", "-p", "-t", data["pane"], "#{pane_pid}").stdout.strip()
    os.kill(int(pid), signal.SIGKILL)
    fleet.tmux(host, "kill-window", "-t", data["pane"])


@pytest.fixture
def h1_record(sshfleet: SSHFleet) -> Any:
    """h1's own drover record (its user's ~/.local/state/drover: nothing hands DROVER_HOME over SSH), emptied
    before and after: the fleet's hosts live for the whole session."""
    path = sshfleet.host_home("h1") / ".local" / "state" / "drover" / "truth.jsonl"
    for p in (path, path.with_suffix(".real")):
        if p.exists() or p.is_symlink():
            p.unlink()
    yield path
    for p in (path, path.with_suffix(".real")):
        if p.exists() or p.is_symlink():
            p.unlink()


def test_a_coordinator_sees_a_remote_workers_done_waits_for_it_and_watch_records_no_exit(
    sshfleet: SSHFleet, isolated: Path, h1_record: Path
) -> None:
    agent = f"{sys.executable} -m drover.demo_agent --tools --log {isolated}/{{name}}.jsonl --name {{name}}"
    command = f"env PYTHONPATH={ROOT} {agent}"
    fleet_file = isolated / "fleet.toml"
    good = sshfleet.fleet_toml() + f'\n[spawn.demo]\ncommand = "{command}"\nready_timeout_s = 60\n'
    fleet_file.write_text(good, encoding="utf-8")
    # w3 first: h1's tmux server is then started by h1's helper, with h1's own environment (a server started by
    # this test's tmux would hand its panes our DROVER_HOME, and h1's `drover done` would write to our record).
    w3 = spawn("w3", "h1")
    w2 = spawn("w2", "h2")
    lead = remote_agent(sshfleet, "h1", "lead", isolated)  # where w1's report goes (`local` on h1)
    work = isolated / "w1.sh"
    work.write_text(f"{DROVER} done --summary 'w1 finished' --to local:{lead.id} --json > {isolated}/w1.done.json\n")
    w1 = spawn("w1", "h1", brief=f"run: sh {work}")

    # wait --any --until done: h1's watcher finds the `done` in h1's own record (our record never has it).
    waited = drover.run("sessions.wait_many", {"targets": ["h1:w1", "h2:w2"], "mode": "any", "until": "done", "timeout_s": 180})
    assert waited.ok and waited.data["which"] == ["h1:w1"], (waited.data, waited.errors)
    [row] = [r for r in waited.data["sessions"] if r["target"] == "w1"]
    assert row["state"] == "done" and row["event"]["summary"] == "w1 finished" and row["event"]["host"] == "h1", row
    assert records(isolated, "done") == []
    said = wait_for(lambda: (isolated / "w1.done.json").read_text().strip(), timeout=120, what="w1's done finished")
    assert json.loads(said)["data"]["recorded"] is True
    wait_for(lambda: any("[drover done] w1@" in m for m in lead.messages()), what="the report on h1")

    # status: done, with the evidence (summary, when, which record); w3 and w2 are not.
    s1 = status("h1:w1")["session"]
    assert s1["state"] == "done", s1
    terminal = s1["evidence"]["terminal"]
    assert terminal["summary"] == "w1 finished" and terminal["event"] == "done" and terminal["time"], terminal
    assert terminal["record"] == {"host": "h1", "path": str(h1_record)}, terminal
    assert "lifecycle" not in s1
    assert status("h1:w3")["session"]["state"] != "done"
    assert status("h2:w2")["session"]["state"] != "done"
    listed = drover.run("sessions.list", {"hosts": ["h1", "h2"]})
    states = {(s["host"], s.get("name")): s["state"] for s in listed.data["sessions"]}
    assert states[("h1", "w1")] == "done" and states[("h1", "w3")] != "done" and states[("h2", "w2")] != "done", states
    spawns = {r["name"]: r for r in drover.run("sessions.spawns", {}).data["spawns"]}
    assert spawns["w1"]["state"] == "done" and spawns["w3"]["state"] != "done", spawns

    # Hostile: a `done` in h1's record about a session named w3 but of another identity (a name reused) is not w3's.
    with h1_record.open("a", encoding="utf-8") as f:
        f.write(line("done", "tmux:/elsewhere/default/%77@1", "w3", 9e9, summary="forged") + "\n")
    assert status("h1:w3")["session"]["state"] != "done"

    # Hostile: h2 never answers (its port points where nothing listens): h1's done still ends the wait.
    fleet_file.write_text(good.replace('[hosts.h2]\nssh = "h2"\n', f'[hosts.h2]\nssh = "h2"\nport = {free_port()}\n'))
    dead = drover.run("sessions.wait_many", {"targets": ["h1:w1", "h2:w2"], "mode": "any", "until": "done", "timeout_s": 60})
    assert dead.data["which"] == ["h1:w1"], (dead.data, dead.errors)
    assert next(r for r in dead.data["sessions"] if r["host"] == "h2")["state"] == "unknown"
    fleet_file.write_text(good)

    # Hostile: h1's record a symlink (to a copy that says done): no done, a warning, no crash; then trusted again.
    h1_record.rename(h1_record.with_suffix(".real"))
    h1_record.symlink_to(h1_record.with_suffix(".real"))
    doc = status("h1:w1")
    assert doc["session"]["state"] != "done" and any("symlink" in w for w in doc["warnings"]), doc
    listed = drover.run("sessions.list", {"hosts": ["h1"]})
    assert listed.ok and all(s["state"] != "done" for s in listed.data["sessions"]), listed.data
    assert any("symlink" in w["message"] for w in listed.data["warnings"]), listed.data["warnings"]
    spawned = drover.run("sessions.spawns", {})
    assert spawned.ok and {r["name"]: r["state"] for r in spawned.data["spawns"]}["w1"] != "done"
    assert any("symlink" in w["message"] for w in spawned.data["warnings"]), spawned.data["warnings"]
    h1_record.unlink()
    h1_record.with_suffix(".real").rename(h1_record)
    assert status("h1:w1")["session"]["state"] == "done"

    # watch run: the done pulled into our record once; w1 ending later is never recorded exited.
    first = watch()
    assert first.returncode == 0, first.stderr
    [copy] = records(isolated, "done")
    assert copy["host"] == "h1" and copy["spawn"] == w1["spawn_id"] and copy["summary"] == "w1 finished", copy
    assert copy["pulled"]["host"] == "h1" and copy["pulled"]["id"] == terminal["id"], copy
    kill_worker(sshfleet, "h1", w1)
    for _ in range(2):
        again = watch()
        assert again.returncode == 0, again.stderr
    assert [e for e in records(isolated, "exited") if e.get("spawn") == w1["spawn_id"]] == []
    assert len(records(isolated, "done")) == 1  # pulled once, and counted once beside h1's own
    spawns = {r["name"]: r for r in drover.run("sessions.spawns", {}).data["spawns"]}
    assert spawns["w1"]["state"] == "exited" and spawns["w1"]["evidence"]["terminal"]["summary"] == "w1 finished"
    gone = status("h1:w1")["session"]
    assert gone["state"] == "exited" and gone["evidence"]["terminal"]["summary"] == "w1 finished", gone
    events = drover.run("events.read", {"since": "start", "kinds": ["done"]})
    assert [e["event"]["id"] for e in events.data["events"]] == [copy["id"]], events.data

    # Hostile: a new worker named w1 on h1 is not the one that said done.
    w1b = spawn("w1", "h1")
    assert w1b["identity"] != w1["identity"]
    assert status("h1:w1")["session"]["state"] != "done"
    kill_worker(sshfleet, "h2", w2)
    kill_worker(sshfleet, "h1", w3)


def test_a_failed_on_its_host_is_done_with_failed_and_two_watch_runs_at_once_copy_it_once(
    sshfleet: SSHFleet, isolated: Path
) -> None:
    record = sshfleet.host_home("h2") / ".local" / "state" / "drover" / "truth.jsonl"
    if record.exists():
        record.unlink()
    agent = f"{sys.executable} -m drover.demo_agent --tools --log {isolated}/{{name}}.jsonl --name {{name}}"
    fleet = sshfleet.fleet_toml() + f'\n[spawn.demo]\ncommand = "env PYTHONPATH={ROOT} {agent}"\nready_timeout_s = 60\n'
    (isolated / "fleet.toml").write_text(fleet, encoding="utf-8")
    work = isolated / "f1.sh"
    work.write_text(f"{DROVER} done --failed --summary 'needs a human' --json > {isolated}/f1.done.json\n")
    try:
        f1 = spawn("f1", "h2", brief=f"run: sh {work}")
        wait_for(lambda: (isolated / "f1.done.json").exists() and (isolated / "f1.done.json").read_text().strip(), timeout=120)
        s = status("h2:f1")["session"]
        assert s["state"] == "done" and s["evidence"]["failed"] is True, s
        assert s["evidence"]["terminal"]["event"] == "failed" and s["evidence"]["terminal"]["record"]["host"] == "h2", s
        argv = [sys.executable, "-m", "drover", "watch", "run"]
        runs = [subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
        codes = [p.wait(timeout=300) for p in runs]
        assert codes == [0, 0], [p.stderr.read() for p in runs if p.stderr]  # the second waited for the first's lock
        [copy] = records(isolated, "failed")
        assert copy["pulled"]["host"] == "h2" and copy["summary"] == "needs a human", copy
        kill_worker(sshfleet, "h2", f1)
        assert watch().returncode == 0
        assert records(isolated, "exited") == [] and len(records(isolated, "failed")) == 1
    finally:
        if record.exists():
            record.unlink()
