"""`transport = "openssh"`, second round of traps: a stopped master's diagnosis inside the stated bound, ssh
options in the user's config that would take drover's pipes (StdinNull, ForkAfterAuthentication), a HOME with a
`%`, accept_new with no drover config directory, and the hints that name a master's process."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import pytest

from drover.errors import TransportError
from tests.support.sshfleet import SSHFleet
from tests.test_openssh import HARD_BOUND_S, close_master, drover, open_master, ssh_config, use_openssh
from tests.test_openssh_traps import drover_in, with_config


def test_a_stopped_masters_diagnosis_fits_inside_the_bound(sshfleet: SSHFleet, monkeypatch: Any) -> None:
    """The master is asked whether it answers while the request still runs (in the bound's last seconds), not
    after the request was killed at its bound: asked after, `--timeout 3` took 5 s and more."""
    from drover.fleet import load
    from drover.transport import openssh

    use_openssh(sshfleet, "h1")
    fleet_doc, _ = load(sshfleet.fleet_file)  # type: ignore[attr-defined]
    transport = openssh.OpenSSHTransport("h1", fleet_doc.hosts["h1"], fleet_doc.defaults)
    asked_while_running: list[bool] = []
    real = openssh.master_state

    async def watched(ssh: Any, seconds: float) -> str:
        asked_while_running.append(bool(transport._running))
        return await real(ssh, seconds)

    monkeypatch.setattr(openssh, "master_state", watched)
    pid = open_master(sshfleet, "h1")
    try:
        os.kill(pid, signal.SIGSTOP)

        async def run() -> None:
            try:
                await transport.call("hello", {}, timeout=2)
            finally:
                await transport.close()

        with pytest.raises(TransportError) as caught:
            asyncio.run(asyncio.wait_for(run(), HARD_BOUND_S))
        assert caught.value.code == "timeout" and "does not answer" in str(caught.value), caught.value
        assert asked_while_running == [True], asked_while_running
    finally:
        close_master(sshfleet, "h1", pid)


@pytest.mark.parametrize("line", ["StdinNull yes", "ForkAfterAuthentication yes"])
def test_ssh_options_that_would_take_drovers_pipes_are_overridden(sshfleet: SSHFleet, line: str) -> None:
    """`StdinNull yes` (ssh -n) fed the helper /dev/null instead of drover's request ("does a login rc file read
    stdin?"); `ForkAfterAuthentication yes` (ssh -f) made ssh -G refuse to run.  Both are overridden."""
    kept = with_config(sshfleet, before=f"Host h1\n    {line}\n")
    try:
        use_openssh(sshfleet, "h1")
        code, doc, err = drover(sshfleet, "ls", "--host", "h1")
        assert code == 0 and not doc["errors"], (doc, err)
    finally:
        ssh_config(sshfleet).write_text(kept)


def test_a_home_with_a_percent_reaches_the_host(sshfleet: SSHFleet) -> None:
    """ssh expands `%` tokens in the ControlPath and known_hosts paths drover passes: a HOME named `p%d` put the
    socket under the user's home directory and lost the known_hosts file (unknown_host_key).  drover's own paths
    are written with `%%`."""
    import shutil

    home = sshfleet.root / "p%d"
    shutil.rmtree(home, ignore_errors=True)
    shutil.copytree(sshfleet.client_home / ".ssh", home / ".ssh")
    use_openssh(sshfleet, "h1")
    code, doc, err = drover_in(sshfleet, "ls", "--host", "h1", home=home)
    assert code == 0, (doc, err)
    code, doc, err = drover_in(sshfleet, "fleet", "check", "--host", "h1", home=home)
    row = doc["data"]["hosts"][0]
    assert row["ok"] and row["control_path"].startswith(f"{home}/.ssh/drover-"), row
