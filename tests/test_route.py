"""A host resolved once (drover/route.py).

A send reads everything about its host -- local or SSH, timeouts, owner relay, raw -- from one Route made once per
host per command: the fleet's host lookup is counted here, over a real pane on `local` and on a real SSH host.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from drover.errors import ExitCode, UnknownHost
from drover.fleet import Fleet, HostConfig, parse
from drover.ops import Context, run
from drover.route import Route
from tests.conftest import Tmux, remote_agent, wait_for
from tests.support.sshfleet import SSHFleet


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Every `Fleet.host` lookup from here on, counted by host name."""
    counted: Counter[str] = Counter()
    looked_up = Fleet.host

    def host(self: Fleet, name: str) -> HostConfig:
        counted[name] += 1
        return looked_up(self, name)

    monkeypatch.setattr(Fleet, "host", host)
    yield counted


def test_a_send_to_a_local_pane_looks_its_host_up_once(tmux: Tmux, lookups: Counter[str]) -> None:
    pane = tmux.agent("worker")
    doc = run("sessions.message", {"id": "worker", "text": "rebase on main", "actor": "tester"})
    assert doc.ok and doc.data["outcome"] == "delivered", doc.to_json()
    wait_for(pane.messages, what="the message in the pane")
    assert lookups == {"local": 1}


def test_a_send_to_an_ssh_host_looks_it_up_once(sshfleet: SSHFleet, isolated: Path, lookups: Counter[str]) -> None:
    pane = remote_agent(sshfleet, "h2", "worker", isolated)
    doc = run("sessions.message", {"host": "h2", "id": "worker", "text": "rebase on main", "actor": "tester"})
    assert doc.ok and doc.data["outcome"] == "delivered", doc.to_json()
    wait_for(pane.messages, what="the message on h2")
    assert lookups == {"h2": 1}


def test_a_refused_send_and_a_missing_session_look_their_host_up_once(tmux: Tmux, lookups: Counter[str]) -> None:
    """The paths that end early (no session by that name, so the handoff record is consulted too; an --as-owner the
    host does not allow) read the same route."""
    tmux.agent("worker")
    missing = run("sessions.message", {"id": "nobody", "text": "x", "actor": "tester"})
    assert missing.exit_code == ExitCode.TARGET and missing.data["code"] == "session_not_found", missing.to_json()
    assert lookups == {"local": 1}
    lookups.clear()
    owner = run("sessions.message", {"id": "worker", "text": "mine", "actor": "tester", "as_owner": True})
    assert owner.data["code"] == "owner_relay_off", owner.to_json()
    assert lookups == {"local": 1}


def test_an_unknown_host_is_looked_up_once_and_fails_the_send(lookups: Counter[str]) -> None:
    doc = run("sessions.message", {"host": "nowhere", "id": "x", "text": "x", "actor": "tester"})
    assert doc.data["code"] == "unknown_host" and doc.exit_code == ExitCode.TARGET, doc.to_json()
    assert lookups == {"nowhere": 1}


def test_a_broadcast_looks_each_host_up_the_same_number_of_times_whatever_its_sessions(tmux: Tmux, lookups: Counter[str]) -> None:
    """A fan-out over one host with one session and with three: the count does not grow with the sessions (one for
    the route, which the host selector checking the names it was given, the listing and every send read)."""
    tmux.agent("solo-1")
    one = run("sessions.broadcast", {"hosts": ["local"], "name": "solo-*", "text": "one", "actor": "tester"})
    assert one.data["counts"] == {"delivered": 1}, one.to_json()
    alone = dict(lookups)
    lookups.clear()
    for name in ("trio-1", "trio-2", "trio-3"):
        tmux.agent(name)
    three = run("sessions.broadcast", {"hosts": ["local"], "name": "trio-*", "text": "three", "actor": "tester"})
    assert three.data["counts"] == {"delivered": 3}, three.to_json()
    assert lookups == alone == {"local": 1}


def test_a_listing_by_host_or_tag_looks_each_host_up_once(tmux: Tmux, isolated: Path, lookups: Counter[str]) -> None:
    """`ls` and `board` select their hosts (by name, by tag) through the routes their requests then read."""
    fleet_file = isolated / "config" / "drover" / "fleet.toml"
    fleet_file.parent.mkdir(parents=True, exist_ok=True)
    fleet_file.write_text('[hosts.local]\ntags = ["here"]\n', encoding="utf-8")
    tmux.agent("worker")
    for op, payload in (
        ("sessions.list", {"hosts": ["local"]}),
        ("sessions.list", {"tags": ["here"]}),
        ("sessions.list", {}),
        ("board", {"tags": ["here"]}),
    ):
        lookups.clear()
        doc = run(op, payload)
        assert doc.ok, doc.to_json()
        assert lookups == {"local": 1}, (op, payload)


# -- the Route itself ---------------------------------------------------------------------------------------------

FLEET = """\
[defaults]
connect_timeout = 7
request_timeout = 40

[hosts.local]
owner_relay = true
raw = ["shell-1"]

[hosts.box]
ssh = "box.example"
connect_timeout = 3
"""


def fleet() -> Fleet:
    return parse(FLEET, Path("fleet.toml"))


def test_a_route_says_local_or_ssh_and_its_timeouts() -> None:
    local, box = Route.of(fleet(), "local"), Route.of(fleet(), "box")
    assert local.local and not box.local
    assert (local.connect_timeout, local.request_timeout) == (7, 40)
    assert (box.connect_timeout, box.request_timeout) == (3, 40)
    assert local.owner_relay and not box.owner_relay
    assert local.raw_ok("shell-1") and not local.raw_ok("shell-2") and not box.raw_ok("shell-1")


def test_a_commands_timeout_is_every_timeout_but_the_fleets_entry_is_kept() -> None:
    box = Route.of(fleet(), "box", timeout_s=1.5)
    assert (box.connect_timeout, box.request_timeout) == (1.5, 1.5)
    assert box.ssh_config.connect_timeout == 1.5  # what the SSH transport connects with
    assert box.config.connect_timeout == 3  # what the daemon's pool keys its connection by: as the fleet wrote it


def test_a_route_is_frozen_and_made_once_per_context(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET, encoding="utf-8")
    ctx = Context(fleet_path=str(path))
    first = ctx.route("box")
    assert ctx.route("box") is first
    with pytest.raises(AttributeError):
        first.local = True  # type: ignore[misc]
    with pytest.raises(UnknownHost):
        ctx.route("nowhere")
    ctx.forget_fleet()  # the file was edited: the hosts are resolved again
    assert ctx.route("box") is not first and ctx.route("box") == first
