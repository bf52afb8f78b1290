"""A login banner (issue 16): accepted per host with banner_ok, else a warning that names its host -- in `ls`,
in `send` and in cron's `drover nudge run` alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from drover.transport import banner
from tests.conftest import remote_agent
from tests.support.sshfleet import SSHFleet

BANNER = "*** Welcome to the HPC login node ***\nUsage policy: https://hpc.example/policy\n"


def test_banner_ok_accepts_exactly_what_it_matches() -> None:
    pattern = r"\*\*\* Welcome to the HPC login node \*\*\*\nUsage policy: .*"
    assert banner.accepted(BANNER.encode(), [pattern])
    assert banner.accepted(BANNER.replace("\n", "\r\n").encode(), [pattern])
    assert not banner.accepted((BANNER + "bash: module: command not found\n").encode(), [r"\*\*\* Welcome.*policy$"])
    assert not banner.accepted(b"something else\n", [pattern])
    assert not banner.accepted(BANNER.encode(), [])
    assert not banner.accepted(b"x" * (banner.MAX_BANNER_BYTES + 1), [".*"])  # no banner is that long


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
