"""A login banner (issue 16): accepted per host with banner_ok, else a warning that names its host -- in `ls`,
in `send` and in cron's `drover nudge run` alike."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from drover.transport import banner
from tests.conftest import drover_process, remote_agent
from tests.support.sshfleet import SSHFleet

BANNER = "*** Welcome to the HPC login node ***\nUsage policy: https://hpc.example/policy\n"


def accepted(noise: bytes, patterns: list[str]) -> bool | None:
    return asyncio.run(banner.judge(noise, patterns))


@pytest.mark.slow  # each banner is matched in a child python (drover's bound on a pattern's time)
def test_banner_ok_accepts_exactly_what_it_matches() -> None:
    pattern = r"\*\*\* Welcome to the HPC login node \*\*\*\nUsage policy: .*"
    assert accepted(BANNER.encode(), [pattern]) is True
    assert accepted(BANNER.replace("\n", "\r\n").encode(), [pattern]) is True
    assert accepted((BANNER + "bash: module: command not found\n").encode(), [r"\*\*\* Welcome.*policy$"]) is False
    assert accepted(b"something else\n", [pattern]) is False
    assert accepted(BANNER.encode(), []) is False
    assert accepted(b"x" * (banner.MAX_BANNER_BYTES + 1), [".*"]) is False  # no banner is that long
    # A pattern that backtracks without end on the host's text is given a second, then it is no banner.
    assert accepted(b"a" * 60 + b"b", ["(a|aa)+"]) is None


def test_banner_ok_must_be_valid_regexes(isolated: Path, cli: Any) -> None:
    fleet = isolated / "fleet.toml"
    fleet.write_text('[hosts.h1]\nssh = "a"\nbanner_ok = ["Welcome (to"]\n')
    res = cli("--fleet", str(fleet), "fleet", "show")
    assert res.code == 7 and "banner_ok" in res.err and "not a valid regular expression" in res.err


def test_a_login_banner_is_a_warning_naming_its_host_unless_banner_ok(sshfleet: SSHFleet, isolated: Path, cli: Any) -> None:
    pane = remote_agent(sshfleet, "h1", "agent", isolated)
    rc = sshfleet.host_home("h1") / ".bashrc"
    rc.write_text(f"printf '%s' '{BANNER}'\n")
    try:
        res = cli("send", "h1:agent", "hello")  # a send's warnings say no host by themselves: the message must
        assert res.code == 0, res.err
        assert "warning: the login shell on h1 printed" in res.err and "banner_ok" in res.err
        res = cli("ls")
        assert "warning: h1: the login shell on h1 printed" in res.err
        assert "on h2" not in res.err and "on h3" not in res.err
        # accepted on h1: that banner is silent there
        ok = r"\*\*\* Welcome to the HPC login node \*\*\*\nUsage policy: \S+"
        fleet = sshfleet.fleet_file  # type: ignore[attr-defined]
        fleet.write_text(fleet.read_text().replace('ssh = "h1"\n', f"ssh = \"h1\"\nbanner_ok = ['{ok}']\n"))
        res = cli("ls")
        assert res.code == 0 and "warning" not in res.err, res.err
        assert cli("send", "h1:agent", "again").err == ""
        # ... and only that banner: the same on h3, or something more on h1, is still a warning
        (sshfleet.host_home("h3") / ".bashrc").write_text(f"printf '%s' '{BANNER}'\n")
        rc.write_text(f"printf '%s' '{BANNER}'\necho 'module: command not found'\n")
        res = cli("ls", "--json")
        said = sorted((w["host"], "on " + w["host"] in w["message"]) for w in res.json()["data"]["warnings"])
        assert said == [("h1", True), ("h3", True)]
    finally:
        rc.unlink(missing_ok=True)
        (sshfleet.host_home("h3") / ".bashrc").unlink(missing_ok=True)
    assert pane.messages()


def test_cron_output_names_the_host_of_a_banner(sshfleet: SSHFleet, isolated: Path, cli: Any) -> None:
    remote_agent(sshfleet, "h2", "agent", isolated)
    fleet = sshfleet.fleet_file  # type: ignore[attr-defined]
    fleet.write_text(fleet.read_text() + '\n[[nudge]]\ntarget = "h2:agent"\ntext = "status?"\nevery = "1h"\n')
    rc = sshfleet.host_home("h2") / ".bashrc"
    rc.write_text("echo 'Welcome to h2'\n")
    try:
        res = cli("nudge", "run")
    finally:
        rc.unlink()
    assert "nudge h2:agent: delivered" in res.out, res.err
    assert "warning: the login shell on h2 printed" in res.err


def test_a_banner_ok_that_backtracks_on_a_hosts_text_neither_stalls_the_others_nor_the_bound(sshfleet: SSHFleet) -> None:
    """h3's rc file prints 'aaa...ab' and h3's banner_ok is '(a|aa)+': matched on the event loop, it ran for
    minutes, so healthy h1 was reported as not answering within --timeout and the command took that long.
    The match is bounded now: h1 answers, h3 answers with a warning that says why its banner is not accepted."""
    rc = sshfleet.host_home("h3") / ".bashrc"
    rc.write_text("printf '%s\\n' " + "a" * 44 + "b\n")
    fleet = sshfleet.fleet_file  # type: ignore[attr-defined]
    fleet.write_text(fleet.read_text().replace('ssh = "h3"\n', "ssh = \"h3\"\nbanner_ok = ['(a|aa)+']\n"))
    try:
        env = {"HOME": str(sshfleet.client_home), "DROVER_FLEET": str(fleet)}
        res = drover_process("ls", "--host", "h1,h3", "--timeout", "5", "--json", timeout=90, env=env)
    finally:
        rc.unlink()
    assert res.code == 0, res.err
    doc = res.json()
    assert {h["host"]: h["ok"] for h in doc["data"]["hosts"]} == {"h1": True, "h3": True}, doc
    warnings = [w for w in doc["data"]["warnings"] if w["host"] == "h3"]
    assert len(warnings) == 1 and "took more than 1s to match it" in warnings[0]["message"], doc["data"]["warnings"]
