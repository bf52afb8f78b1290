"""drover wait A B --any|--all names sessions as `status` does: a spawned worker killed before the wait began is
`exited` (not "no session"), and `stalled` is judged with the fleet's stall_after on status's evidence.

Real parts: the demo agent spawned by drover (and in plain tmux panes), killed with kill -9; drover in-process.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import drover
from tests.conftest import Tmux, wait_for
from tests.test_spawn import demo_template, fleet_with
from tests.test_state import demo_pid, spawn_demo, use_fleet


def rows(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{r['host']}:{r['target']}": r for r in doc["data"]["sessions"]}


def status(cli: Any, fleet: Path, target: str) -> Any:
    return cli("--fleet", str(fleet), "status", target, "--json").json()["data"]["session"]


def test_a_spawned_worker_killed_before_the_wait_is_exited_not_a_typo(tmux: Tmux, isolated: Path, cli: Any) -> None:
    fleet = isolated / "fleet.toml"
    fleet_with(fleet, {"demo": f'command = "{demo_template(isolated)}"\nready_timeout_s = 60'})
    w4 = spawn_demo(cli, fleet, isolated, "w4")
    spawn_demo(cli, fleet, isolated, "w2")
    wait_for(lambda: status(cli, fleet, "local:w2")["state"] == "idle", what="w2 idle")
    os.kill(demo_pid(isolated / "w4.jsonl"), signal.SIGKILL)
    wait_for(lambda: status(cli, fleet, "local:w4")["state"] == "exited", what="status: w4 exited")
    wait_for(lambda: [s["name"] for s in cli("ls", "--json").json()["data"]["sessions"]] == ["w2"], what="w4's pane gone")

    res = cli("--fleet", str(fleet), "wait", "local:w4", "local:w2", "--any", "--until", "exited", "--json")
    assert res.code == 0, res.out + res.err
    doc = res.json()
    got = rows(doc)
    assert doc["data"]["which"] == ["local:w4"]
    assert got["local:w4"]["state"] == "exited" and got["local:w4"]["reached"]
    assert got["local:w4"]["identity"] == w4["identity"] and got["local:w4"]["evidence"]["spawn"] == w4["spawn_id"]
    assert "no longer live" in got["local:w4"]["how"]
    # By its identity too: the same spawned session.
    by_id = cli("--fleet", str(fleet), "wait", "local:" + w4["identity"], "local:w2", "--any", "--until", "exited", "--json")
    assert by_id.code == 0, by_id.out + by_id.err
    [reached] = [r for r in by_id.json()["data"]["sessions"] if r["reached"]]
    assert reached["identity"] == w4["identity"] and reached["state"] == "exited"

    # Waiting for every one idle: w4 never will be -- exit 6, saying why, at once.
    res = cli("--fleet", str(fleet), "wait", "local:w4", "local:w2", "--all", "--until", "idle", "--json")
    assert res.code == 6, res.out + res.err
    message = res.json()["errors"][0]["message"]
    assert "local:w4" in message and "before the wait began" in message and "no longer live" in message
    human = cli("--fleet", str(fleet), "wait", "local:w4", "local:w2", "--all", "--until", "idle")
    assert human.code == 6 and "can no longer be idle" in human.out + human.err

    # One session alone (`drover wait`'s own path): the same answer.
    one = cli("--fleet", str(fleet), "wait", "local:w4", "--until", "exited", "--json")
    assert one.code == 0 and one.json()["data"]["state"] == "exited", one.out
    one = cli("--fleet", str(fleet), "wait", "local:w4")
    assert one.code == 6 and "it will not be idle" in one.err and "no longer live" in one.err, one.out + one.err
    typo = cli("--fleet", str(fleet), "wait", "local:w44", "--until", "exited")
    assert typo.code == 6 and "no session 'w44'" in typo.err, typo.out + typo.err

    # A typo is still a typo, alone or beside the gone one, before anything is waited on.
    for targets in (["local:w44", "local:w2"], ["local:w4", "local:w44"], ["local:w44", "local:w4"]):
        res = cli("--fleet", str(fleet), "wait", *targets, "--any", "--until", "exited", "--json")
        assert res.code == 6, (targets, res.out)
        assert "no session 'w44'" in res.json()["errors"][0]["message"], targets


def test_stalled_by_the_fleets_stall_after_and_named_as_status_names_it(tmux: Tmux, isolated: Path, monkeypatch: Any) -> None:
    # The host's own value over [defaults]: the one `status` uses for this host and engine.
    use_fleet(isolated, monkeypatch, '[defaults]\nstall_after = "1h"\n[hosts.local]\nstall_after = "2s"\n')
    quiet, other = tmux.agent("w9"), tmux.agent("w2")
    os.kill(quiet.pid, signal.SIGUSR2)  # busy, and its log gains nothing: no progress
    wait_for(lambda: "esc to interrupt" in quiet.screen(), what="w9 busy")
    wait_for(lambda: drover.run("sessions.status", {"id": "w9"}).data["session"]["state"] == "stalled", what="status")

    # No --stall-after: the fleet's 2s, not wait's own 10 minutes.
    doc = drover.run("sessions.wait_many", {"targets": ["w9", "w2"], "mode": "any", "until": "stalled", "timeout_s": 60})
    assert doc.exit_code == 0, doc.errors
    assert doc.data["which"] == ["local:w9"] and rows(doc.to_dict())["local:w9"]["state"] == "stalled"

    # Waiting for another state: the row of the one status calls stalled says stalled, not working.
    doc = drover.run("sessions.wait_many", {"targets": ["w2", "w9"], "mode": "any", "until": "idle", "timeout_s": 60})
    assert doc.exit_code == 0, doc.errors
    got = rows(doc.to_dict())
    assert doc.data["which"] == ["local:w2"]
    assert got["local:w9"]["state"] == "stalled", got["local:w9"]
    assert drover.run("sessions.status", {"id": "w9"}).data["session"]["state"] == "stalled"
    os.kill(quiet.pid, signal.SIGUSR2)
    other.wait_idle()


def test_a_gone_workers_name_taken_by_a_newcomer_is_the_newcomer(tmux: Tmux, isolated: Path, cli: Any) -> None:
    fleet = isolated / "fleet.toml"
    fleet_with(fleet, {"demo": f'command = "{demo_template(isolated)}"\nready_timeout_s = 60'})
    old = spawn_demo(cli, fleet, isolated, "w4")
    os.kill(demo_pid(isolated / "w4.jsonl"), signal.SIGKILL)
    wait_for(lambda: cli("ls", "--json").json()["data"]["sessions"] == [], what="w4's pane gone")
    other = tmux.agent("w2")
    newcomer = tmux.agent("w4")  # not spawned by drover, under the gone worker's name
    # Both live and idle: the name means the newcomer now, never the old spawn's `exited`.
    res = cli("--fleet", str(fleet), "wait", "local:w4", "local:w2", "--all", "--until", "idle", "--json")
    assert res.code == 0, res.out + res.err
    got = rows(res.json())
    assert got["local:w4"]["state"] == "idle" and got["local:w4"]["identity"] != old["identity"]
    assert got["local:w4"]["id"] == newcomer.id and got["local:w2"]["id"] == other.id
    # The newcomer killed too: now there is no spawn by that name live nor gone that is it -- the old spawn is.
    newcomer.tmux("kill-session", "-t", "w4")
    res = cli("--fleet", str(fleet), "wait", "local:w4", "local:w2", "--any", "--until", "exited", "--json")
    assert res.code == 0, res.out + res.err
    assert rows(res.json())["local:w4"]["identity"] == old["identity"]
