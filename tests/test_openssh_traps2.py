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
from tests.test_openssh import (
    HARD_BOUND_S,
    close_master,
    drover,
    drover_plain,
    open_master,
    ssh_config,
    use_openssh,
)
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


def test_a_timeout_with_no_time_to_ask_the_master_blames_neither(sshfleet: SSHFleet, monkeypatch: Any) -> None:
    """When the bound leaves no time to ask the master, the timeout names neither host nor master as the one that
    hung, and says which command tells."""
    from drover.fleet import load
    from drover.transport import openssh

    use_openssh(sshfleet, "h1")
    fleet_doc, _ = load(sshfleet.fleet_file)  # type: ignore[attr-defined]
    transport = openssh.OpenSSHTransport("h1", fleet_doc.hosts["h1"], fleet_doc.defaults)
    monkeypatch.setattr(openssh, "MASTER_CHECK_S", 0.5)  # under the 1 s a trusted check needs
    pid = open_master(sshfleet, "h1")
    try:
        os.kill(pid, signal.SIGSTOP)

        async def run() -> None:
            try:
                await transport.call("hello", {}, timeout=1)
            finally:
                await transport.close()

        with pytest.raises(TransportError) as caught:
            asyncio.run(asyncio.wait_for(run(), HARD_BOUND_S))
        error = caught.value
        assert error.code == "timeout" and "the host or its master did not answer" in error.message, error
        assert "drover fleet check --host h1" in (error.hint or ""), error.hint
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


def test_accept_new_pins_the_key_with_no_drover_config_directory(sshfleet: SSHFleet) -> None:
    """With no ~/.config/drover (a fleet file given by --fleet), ssh could not record an accepted key ("Failed to
    add the host"), went on, and every later call accepted any key.  drover makes the directory (0700) first;
    the key is recorded where the asyncssh transport then finds it."""
    import shutil

    from drover.transport.host_keys import drover_known_hosts

    _trusted, fresh = sshfleet.spare
    entry = f'ssh = "{fresh}"\nport = {sshfleet.port}\nuser = "{sshfleet.user}"\nidentity = "{sshfleet.client_key}"\n'
    use_openssh(sshfleet, extra=f'[hosts.new]\n{entry}transport = "openssh"\naccept_new = true\n')
    shutil.rmtree(drover_known_hosts().parent, ignore_errors=True)
    code, doc, err = drover(sshfleet, "ls", "--host", "new")
    assert code == 0 and not doc["errors"], (doc, err)
    assert f"[{fresh}]:{sshfleet.port}" in drover_known_hosts().read_text()
    assert drover_known_hosts().parent.stat().st_mode & 0o077 == 0
    # asyncssh, without accept_new, trusts the key openssh pinned: the two transports agree.
    text = sshfleet.fleet_file.read_text()  # type: ignore[attr-defined]
    sshfleet.fleet_file.write_text(text.replace('transport = "openssh"\naccept_new = true\n', ""))  # type: ignore[attr-defined]
    code, doc, err = drover(sshfleet, "ls", "--host", "new")
    assert code == 0 and not doc["errors"], (doc, err)


def test_a_key_ssh_could_not_record_is_a_failure() -> None:
    """ssh says "Failed to add the host" and goes on: drover makes that a host_key failure, never silence."""
    from drover.fleet import HostConfig
    from drover.transport.openssh_config import OpenSSHCommand

    ssh = OpenSSHCommand("new", HostConfig(accept_new=True, known_hosts="/nonexistent-dir/kh"), 5)
    said = "Warning: Permanently added '[127.0.1.22]:2222' (ED25519) to the list of known hosts.\n"
    assert ssh.unrecorded(said) is None
    failed = ssh.unrecorded("Failed to add the host to the list of known hosts (/x/known_hosts).\n")
    assert failed is not None and failed.code == "host_key" and "could not record" in failed.message


def test_a_host_name_that_does_not_resolve_is_not_sent_to_drover_connect(sshfleet: SSHFleet) -> None:
    """fleet check for a name ssh cannot resolve said `open it with drover connect nope`, which fails the same."""
    use_openssh(sshfleet, extra='[hosts.nope]\nssh = "no-such-host.invalid"\ntransport = "openssh"\n')
    _code, out, err = drover_plain(sshfleet, "fleet", "check", "--host", "nope")
    assert "resolve" in out + err and "drover connect nope" not in out + err, (out, err)
