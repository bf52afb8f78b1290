"""pssh/clush habits (issue 16): host ranges and exclusion, --timeout per command, log --host, completion of
session names, tags and ops.  (Login banners: tests/test_login_banner.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from drover.errors import UnknownHost, UsageError
from drover.hostsets import MAX_NAMED, expand, matcher
from drover.truth import TruthFile
from tests.conftest import ROOT, drover_process, remote_agent, stays
from tests.support.sshfleet import SSHFleet
from tests.test_daemon import persistent, running  # noqa: F401 - persistent is a fixture
from tests.test_ssh import Blackhole

KNOWN = ["local", "h1", "h2", "h3", "node01", "node02", "node03"]


# -- host expressions ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("values", "chosen"),
    [
        (["h[1-3],!h2"], ["h1", "h3"]),
        (["!h2,h[1-3]"], ["h1", "h3"]),  # an exclusion applies wherever it stands, as clush's -x
        (["h[1-3]!h2"], ["h1", "h3"]),  # NodeSet's own difference
        (["node[01-03]"], ["node01", "node02", "node03"]),
        (["h3", "h1,h2"], ["h3", "h1", "h2"]),  # repeatable, comma lists, in the order first named
        (["h[1-3]", "!h[1-2]"], ["h3"]),
        (["!h[1-3],!node[01-03]"], ["local"]),  # exclusions alone: every host but those
        (["h1", "h1,h[1-1]"], ["h1"]),
        (["h1", "h3"], ["h1", "h3"]),  # plain names: untouched
    ],
)
def test_host_expressions_select_as_clush_would(values: list[str], chosen: list[str]) -> None:
    assert expand(values, KNOWN) == chosen


def test_a_range_naming_an_unknown_host_is_an_error_naming_it() -> None:
    with pytest.raises(UnknownHost) as exc:
        expand(["h[1-4]"], KNOWN)
    assert "'h4'" in exc.value.message and "h[1-4]" in exc.value.message
    assert exc.value.exit_code == 6
    with pytest.raises(UnknownHost) as exc:  # excluding a host the fleet does not know is a typo too
        expand(["h[1-3],!h9"], KNOWN)
    assert "'h9'" in exc.value.message and "'h1'" not in exc.value.message


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("h[1-999999999]", f"more than {MAX_NAMED}"),  # refused from its text: never built in memory
        ("h[1-3]-[1-1000]-[1-1000]", f"more than {MAX_NAMED}"),
        ("h1,!h1", "selects no host"),
        ("h[", "not a host expression"),
        ("h[3-1]", "not a host expression"),
        ("h1,,h2", "empty item"),
        ("!", "empty item"),
        ("@all", "@groups"),  # ClusterShell's groups would read /etc/clustershell (whose sources run commands)
    ],
)
def test_bad_host_expressions_are_usage_errors(value: str, said: str) -> None:
    with pytest.raises(UsageError) as exc:
        expand([value], KNOWN)
    assert said in exc.value.message and exc.value.exit_code == 2


def test_the_record_matcher_needs_no_fleet() -> None:
    pick = matcher(["h[1-3],!h2"])
    assert [h for h in ("h1", "h2", "h3", "gone") if pick(h)] == ["h1", "h3"]
    everyone_but = matcher(["!h2"])
    assert [h for h in ("h1", "h2", "gone") if everyone_but(h)] == ["h1", "gone"]


def test_ls_over_a_range_with_an_exclusion_asks_exactly_those_hosts(sshfleet: SSHFleet, isolated: Path, cli: Any) -> None:
    for host in sshfleet.names:
        remote_agent(sshfleet, host, f"agent-{host}", isolated)
    res = cli("ls", "--host", "h[1-3],!h2", "--json")
    assert res.code == 0, res.err
    doc = res.json()
    assert [h["host"] for h in doc["data"]["hosts"]] == ["h1", "h3"]
    assert sorted((s["host"], s["name"]) for s in doc["data"]["sessions"]) == [("h1", "agent-h1"), ("h3", "agent-h3")]
    # the same, as the fleet-wide commands read it
    res = cli("board", "--host", "h[1-3],!h2", "--json")
    assert [h["host"] for h in res.json()["data"]["hosts"]] == ["h1", "h3"]
    res = cli("fleet", "check", "-H", "!h2,h[1-3]", "--json")
    assert sorted(r["host"] for r in res.json()["data"]["hosts"]) == ["h1", "h3"]


def test_an_unknown_host_in_a_range_asks_nobody(sshfleet: SSHFleet, isolated: Path, cli: Any) -> None:
    res = cli("ls", "--host", "h[1-4]")
    assert res.code == 6 and "unknown host 'h4'" in res.err and "h[1-4]" in res.err
    assert not (isolated / "home" / "completion.json").exists()  # no host answered anything


# -- --timeout ----------------------------------------------------------------------------------------------------
HARD_BOUND_S = 60  # far below the fleet's own 600 s: only --timeout can end the command in time


def _drover(fleet: SSHFleet, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(fleet.client_home), "DROVER_FLEET": str(fleet.fleet_file)}  # type: ignore[attr-defined]
    return subprocess.run(
        [sys.executable, "-m", "drover", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=HARD_BOUND_S,
        env=env,
        cwd=str(ROOT),
    )


@pytest.fixture
def slow_fleet(sshfleet: SSHFleet) -> Iterator[Blackhole]:
    """A host that accepts and never speaks, and timeouts of 600 s in fleet.toml."""
    hole = Blackhole()
    toml = sshfleet.fleet_toml(f'[hosts.silent]\nssh = "127.0.0.1"\nport = {hole.port}\n')
    toml = toml.replace("connect_timeout = 5.0\nrequest_timeout = 20.0", "connect_timeout = 600.0\nrequest_timeout = 600.0")
    sshfleet.fleet_file.write_text(toml, encoding="utf-8")  # type: ignore[attr-defined]
    yield hole
    hole.close()


def test_timeout_bounds_a_host_that_never_speaks(sshfleet: SSHFleet, slow_fleet: Blackhole) -> None:
    proc = _drover(sshfleet, "ls", "--host", "silent,h1", "--timeout", "2")
    assert proc.returncode == 8, proc.stderr  # h1 answered, silent did not
    doc = json.loads(proc.stdout)
    [error] = doc["errors"]
    assert error["host"] == "silent" and error["code"] == "connect_timeout" and "within 2s" in error["message"]
    assert [h["host"] for h in doc["data"]["hosts"] if h["ok"]] == ["h1"]
    proc = _drover(sshfleet, "status", "silent:%1", "--timeout", "1")
    assert json.loads(proc.stdout)["errors"][0]["code"] == "connect_timeout"


def test_timeout_bounds_a_request_the_host_never_answers(sshfleet: SSHFleet, slow_fleet: Blackhole) -> None:
    rc = sshfleet.host_home("h2") / ".bashrc"  # the login shell on h2 (only) stops before the helper starts
    rc.write_text("sleep 600\n")
    try:
        proc = _drover(sshfleet, "ls", "-H", "h2", "--timeout", "2")
    finally:
        rc.unlink()
    doc = json.loads(proc.stdout)
    assert proc.returncode == 5 and doc["errors"][0]["code"] == "timeout", proc.stderr
    assert "within 2s" in doc["errors"][0]["message"]


@pytest.mark.usefixtures("persistent")
def test_timeout_bounds_a_host_that_never_speaks_through_the_daemon(sshfleet: SSHFleet, slow_fleet: Blackhole) -> None:
    first = _drover(sshfleet, "ls", "--host", "h1")  # runs directly, and starts the daemon for the next ones
    assert first.returncode == 0, first.stderr
    served = running()["served"]
    proc = _drover(sshfleet, "ls", "--host", "silent,h1", "--timeout", "2")
    assert proc.returncode == 8, proc.stderr
    [error] = json.loads(proc.stdout)["errors"]
    assert error["host"] == "silent" and "within 2s" in error["message"]
    assert running()["served"] == served + 1  # the daemon ran it (its pooled link bounded by the same --timeout)


def test_timeout_is_checked_and_explained(cli: Any) -> None:
    for bad in ("0", "-1", "nan"):
        res = cli("ls", "--timeout", bad)
        assert res.code == 2 and "--timeout" in res.err
    helped = cli("broadcast", "--help").out
    assert "--timeout" in helped and "connect_timeout" in helped


# -- log --host ---------------------------------------------------------------------------------------------------
def test_log_filters_by_host_expression(sshfleet: SSHFleet, cli: Any) -> None:
    truth = TruthFile()
    for host in ("h1", "h2", "h3", "retired"):
        truth.accept(actor="a@b", host=host, target="%1", text=f"to {host}", options={})
    res = cli("log", "--host", "h[1-3],!h2", "--json")
    assert res.code == 0, res.err
    assert [m["host"] for m in res.json()["data"]["messages"]] == ["h1", "h3"]
    # the record outlives hosts: one the fleet no longer has is still a filter, not an error
    assert [m["host"] for m in cli("log", "--host", "retired", "--json").json()["data"]["messages"]] == ["retired"]
    assert [m["host"] for m in cli("log", "-H", "!h[1-3]", "--json").json()["data"]["messages"]] == ["retired"]
    assert cli("log", "--host", "h[", "--json").code == 2
    empty = cli("op", "messages.list", '{"hosts": []}')
    assert empty.code == 2 and "hosts is empty" in empty.err
    # the op takes the same expressions as the command
    doc = cli("op", "messages.list", json.dumps({"hosts": ["h[1-3]", "!h2"]})).json()
    assert [m["host"] for m in doc["data"]["messages"]] == ["h1", "h3"]


def test_spawns_filter_by_host_expression(isolated: Path, cli: Any) -> None:
    truth = TruthFile()
    for n, host in enumerate(("h1", "h2", "h3")):
        truth.append({"v": 1, "event": "spawn_requested", "id": f"sp_{n}", "ts": time.time(), "host": host, "engine": "claude"})
    rows = cli("spawns", "--host", "h[1-3],!h2", "--json").json()["data"]["spawns"]
    assert [r["host"] for r in rows] == ["h1", "h3"]
    assert [r["host"] for r in cli("spawns", "-H", "h2", "--json").json()["data"]["spawns"]] == ["h2"]


# -- completion ---------------------------------------------------------------------------------------------------
def _complete(words: str, env: dict[str, str] | None = None) -> list[str]:
    cword = str(len(words.split()) - 1)
    res = drover_process(env={"_DROVER_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": cword, **(env or {})})
    return res.out.split()


def test_session_names_complete_from_the_last_ls_without_asking_a_host(sshfleet: SSHFleet, isolated: Path, cli: Any) -> None:
    remote_agent(sshfleet, "h1", "webapp-f8", isolated)
    remote_agent(sshfleet, "h3", "webapi", isolated)
    assert _complete("drover send h1:w") == []  # no ls yet: nothing to offer, and no host is asked
    assert cli("ls", "--host", "h1,h3").code == 0
    assert _complete("drover send h1:w") == ["h1:webapp-f8"]
    assert _complete("drover status h") == ["h1:", "h2:", "h3:", "h1:webapp-f8", "h3:webapi"]
    cache = isolated / "home" / "completion.json"
    assert cache.stat().st_mode & 0o777 == 0o600
    # completing never connects: with h1 behind a listener that would see it, nothing arrives there
    hole = Blackhole()
    try:
        fleet = sshfleet.fleet_file  # type: ignore[attr-defined]
        fleet.write_text(fleet.read_text().replace('ssh = "h1"', f'ssh = "127.0.0.1"\nport = {hole.port}'))
        assert _complete("drover read h1:") == ["h1:", "h1:webapp-f8"]
        stays(lambda: not hole.conns, what="no connection to h1")
    finally:
        hole.close()
    # an ls of h3 alone keeps what h1 answered before; a stale entry is not offered
    data = json.loads(cache.read_text())
    data["hosts"]["h1"]["ts"] -= 3600
    cache.write_text(json.dumps(data))
    assert _complete("drover send h") == ["h1:", "h2:", "h3:", "h3:webapi"]


def test_completion_reads_no_one_elses_file(isolated: Path) -> None:
    home = isolated / "home"
    home.mkdir()
    target = isolated / "elsewhere.json"
    target.write_text(json.dumps({"hosts": {"local": {"ts": time.time(), "targets": ["planted"]}}}))
    (home / "completion.json").symlink_to(target)
    assert _complete("drover send local:p") == []
    (home / "completion.json").unlink()
    (home / "completion.json").write_text("{not json")
    assert _complete("drover send local:") == ["local:"]


def test_tags_ops_and_host_lists_complete(isolated: Path) -> None:
    fleet = isolated / "fleet.toml"
    fleet.write_text('[hosts.gpu1]\nssh = "a"\ntags = ["gpu", "lab"]\n[hosts.gpu2]\nssh = "b"\ntags = ["gpu"]\n')
    env = {"DROVER_FLEET": str(fleet)}
    assert _complete("drover ls --tag g", env) == ["gpu"]
    assert _complete("drover board -t l", env) == ["lab"]
    assert _complete("drover ls --host gpu1,!g", env) == ["gpu1,!gpu1", "gpu1,!gpu2"]
    assert _complete("drover op sessions.l", env) == ["sessions.list"]
    assert _complete("drover log --host gp", env) == ["gpu1", "gpu2"]
    # the fleet the command line names, before or after the command, is the one completed from
    other = isolated / "other.toml"
    other.write_text('[hosts.zz1]\nssh = "a"\ntags = ["t9"]\n')
    assert _complete(f"drover --fleet {other} send z", env) == ["zz1:"]
    assert _complete(f"drover ls --fleet {other} --tag t", env) == ["t9"]


def test_nudge_targets_wait_file_and_fleet_remove_hosts_and_engines_complete(isolated: Path) -> None:
    """The categories the docs promise, where they were missing: nudge's HOST:ID (and `run`), a host for
    wait-file and fleet remove, and --engine's values (built in, and the fleet's own)."""
    fleet = isolated / "fleet.toml"
    fleet.write_text('[hosts.gpu1]\nssh = "a"\n[hosts.gpu2]\nssh = "b"\n[engines.mybot]\ncommands = ["mybot"]\n')
    env = {"DROVER_FLEET": str(fleet)}
    assert _complete("drover nudge gpu", env) == ["gpu1:", "gpu2:"]
    assert _complete("drover nudge r", env) == ["run"]
    assert _complete("drover nudge local:", env) == ["local:"]
    assert _complete("drover wait-file gp", env) == ["gpu1", "gpu2"]
    assert _complete("drover fleet remove gpu2", env) == ["gpu2"]
    assert _complete("drover ls --engine c", env) == ["claude", "codex"]
    assert _complete("drover broadcast --engine m", env) == ["mybot"]
    assert _complete("drover spawn gpu1 --engine g", env) == ["gemini"]
    assert _complete("drover nudge gpu1:x t --create-if-missing --engine d", env) == ["demo"]
