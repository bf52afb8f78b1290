"""The fleet inventory: where it is found, how it is validated, and `drover fleet show | add | remove`."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from drover import fleet as fleet_mod
from drover.errors import ConfigError, FleetInvalid, UnknownHost
from tests.conftest import ROOT


def test_no_file_means_the_builtin_fleet_with_local(isolated: Path) -> None:
    fleet, path = fleet_mod.load()
    assert path is None
    assert fleet.host_names() == ["local"]
    assert fleet.limits.max_chars == 1_048_576 and fleet.defaults.concurrency == 64
    with pytest.raises(UnknownHost, match="known hosts: local"):
        fleet.host("box-a")


def test_search_order(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    default = isolated / "config" / "drover" / "fleet.toml"
    default.parent.mkdir(parents=True)
    default.write_text('[hosts.from-default]\nssh = "a"\n', encoding="utf-8")
    env = isolated / "env.toml"
    env.write_text('[hosts.from-env]\nssh = "b"\n', encoding="utf-8")
    explicit = isolated / "explicit.toml"
    explicit.write_text('[hosts.from-flag]\nssh = "c"\n', encoding="utf-8")
    assert "from-default" in fleet_mod.load()[0].hosts
    monkeypatch.setenv("DROVER_FLEET", str(env))
    assert "from-env" in fleet_mod.load()[0].hosts
    assert "from-flag" in fleet_mod.load(explicit)[0].hosts


def test_the_example_file_is_valid_and_documents_every_key() -> None:
    text = (ROOT / "fleet.example.toml").read_text(encoding="utf-8")
    fleet = fleet_mod.parse(text, ROOT / "fleet.example.toml")
    assert fleet.hosts
    for model in (fleet_mod.HostConfig, fleet_mod.Limits, fleet_mod.Defaults, fleet_mod.EngineProfile):
        for key in model.model_fields:
            assert f"{key} =" in text, f"fleet.example.toml does not document {model.__name__}.{key}"


def test_every_problem_is_reported_with_its_line(tmp_path: Path) -> None:
    text = "\n".join(
        [
            "[defaults]",
            "concurrency = 0",
            "",
            "[hosts.good]",
            'ssh = "good.example"',
            "",
            "[hosts.bad]",
            "port = 70000",
            'tags = "not-a-list"',
            "",
            "[engines.claude]",
            'dialog = ["(unclosed"]',
        ]
    )
    with pytest.raises(FleetInvalid) as info:
        fleet_mod.parse(text, tmp_path / "fleet.toml")
    problems = info.value.problems
    assert any(p.startswith("fleet.toml:2: defaults.concurrency") for p in problems)
    assert any(p.startswith("fleet.toml:8: hosts.bad.port") for p in problems)
    assert any(p.startswith("fleet.toml:9: hosts.bad.tags") for p in problems)
    assert any(p.startswith("fleet.toml:12: engines.claude.dialog") and "not a valid regular expression" in p for p in problems)
    assert len(problems) == 4


def test_host_names_are_checked(tmp_path: Path) -> None:
    with pytest.raises(FleetInvalid, match="no ':'"):
        fleet_mod.parse('[hosts."box:a"]\nssh = "x"\n', tmp_path / "f.toml")
    with pytest.raises(FleetInvalid, match="cannot have an ssh target"):
        fleet_mod.parse('[hosts.local]\nssh = "x"\n', tmp_path / "f.toml")


def test_fleet_add_show_remove(cli: Any, isolated: Path) -> None:
    path = isolated / "config" / "drover" / "fleet.toml"
    res = cli("fleet", "add", "box-a", "--ssh", "a.example", "--user", "dev", "--port", "2222", "--tag", "gpu", "--tag", "eu")
    assert res.code == 0, res.err
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    assert data["hosts"]["box-a"] == {"ssh": "a.example", "user": "dev", "port": 2222, "tags": ["gpu", "eu"]}
    assert cli("fleet", "add", "box-b").code == 0
    again = cli("fleet", "add", "box-a")
    assert again.code == 2 and "already in" in again.err
    shown = cli("fleet", "show")
    assert "box-a" in shown.out and "a.example" in shown.out and "gpu,eu" in shown.out and "local" in shown.out
    js = cli("fleet", "show", "--json").json()
    assert js["fleet"]["hosts"]["box-b"]["ssh"] == "box-b"
    bad = cli("fleet", "add", "box-c", "--port", "0")
    assert bad.code == 7 and "hosts.box-c.port" in bad.err
    assert "box-c" not in path.read_text(encoding="utf-8")
    assert cli("fleet", "remove", "box-a").code == 0
    assert "box-a" not in tomllib.loads(path.read_text(encoding="utf-8"))["hosts"]
    missing = cli("fleet", "remove", "box-a")
    assert missing.code == 6 and "not in" in missing.err


def test_unreadable_fleet_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        fleet_mod.load(tmp_path / "nope.toml")
