"""`drover mcp install claude|codex` against the real Claude Code 2.1.328 and Codex 0.169 CLIs (isolated HOME and
CODEX_HOME): through their own `mcp add`, through the files written where the CLI is missing (read back by the real
binaries), idempotent, --print, --force; and `fleet check` telling, per engine, whether it is registered."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from drover.remote import mcp_state
from tests.conftest import CliResult

# Nothing the CLIs do here needs the network: say so, so they do not try.
QUIET = {
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
}


class Engines:
    """An isolated HOME (CODEX_HOME inside it) and the real binaries: on PATH (`on_path`), or only by their path."""

    def __init__(self, root: Path, claude: Path, codex: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.home = root / "home"
        self.home.mkdir()
        self.codex_home = self.home / ".codex"
        self.codex_home.mkdir()  # Codex refuses a CODEX_HOME that does not exist
        self.claude, self.codex = claude, codex
        self.bin = root / "bin"
        self.bin.mkdir()
        (self.bin / "claude").symlink_to(claude)
        (self.bin / "codex").symlink_to(codex)
        # PATH without any claude or codex, whatever the machine has: node and tmux stay.
        self.bare_path = ":".join(
            d for d in os.environ["PATH"].split(":") if d and not any((Path(d) / n).exists() for n in ("claude", "codex"))
        )
        self.monkeypatch = monkeypatch
        monkeypatch.setenv("HOME", str(self.home))
        monkeypatch.setenv("CODEX_HOME", str(self.codex_home))
        monkeypatch.delenv("CLAUDE_CONFIG_DIR", raising=False)
        for key, value in QUIET.items():
            monkeypatch.setenv(key, value)
        self.on_path(True)

    def on_path(self, yes: bool) -> None:
        self.monkeypatch.setenv("PATH", f"{self.bin}:{self.bare_path}" if yes else self.bare_path)

    @property
    def claude_json(self) -> Path:
        return self.home / ".claude.json"

    @property
    def config_toml(self) -> Path:
        return self.codex_home / "config.toml"

    def run(self, binary: Path, *args: str, cwd: Path | None = None) -> str:
        proc = subprocess.run(
            [str(binary), *args], capture_output=True, text=True, timeout=120, cwd=cwd or self.home, stdin=subprocess.DEVNULL
        )
        assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
        return proc.stdout

    def claude_list(self, cwd: Path | None = None) -> list[str]:
        """The real `claude mcp list`'s lines about drover (it starts each server to show its health)."""
        return [line for line in self.run(self.claude, "mcp", "list", cwd=cwd).splitlines() if line.startswith("drover:")]

    def codex_entry(self) -> dict[str, Any] | None:
        """drover's entry as the real `codex mcp list --json` reads it."""
        rows = json.loads(self.run(self.codex, "mcp", "list", "--json"))
        return next((r for r in rows if r["name"] == "drover"), None)


@pytest.fixture
def engines(isolated: Path, claude_binary: Path, monkeypatch: pytest.MonkeyPatch) -> Engines:
    from tests.support import codexlab

    codex, why = codexlab.ensure_binary()
    if codex is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the tests against the real Codex CLI, but: {why}")
        pytest.skip(f"the real Codex CLI cannot run here: {why}")
    monkeypatch.chdir(isolated)
    return Engines(isolated, claude_binary, codex, monkeypatch)


def ours() -> list[str]:
    """The command install registers in a test: the console script beside this interpreter (argv[0] is pytest)."""
    return [str(Path(sys.executable).parent / "drover"), "mcp", "serve"]


def line_of(command: list[str]) -> str:
    return " ".join(command)


def install(cli: Callable[..., CliResult], *args: str) -> dict[str, Any]:
    res = cli("mcp", "install", *args, "--json")
    assert res.code == 0, (res.out, res.err)
    doc = res.json()
    assert doc["ok"] and doc["op"] == "mcp.install", doc
    return dict(doc["data"])


# -- through the engines' own CLIs ---------------------------------------------------------------------------------


def test_claude_user_scope_through_claude_mcp_add(engines: Engines, cli: Any) -> None:
    engines.claude_json.write_text(json.dumps({"hasCompletedOnboarding": True, "projects": {"/x": {"a": 1}}}))
    before = engines.claude_json.read_bytes()
    printed = cli("mcp", "install", "claude", "--print")
    assert printed.code == 0, printed.err
    assert f"would run: {engines.bin / 'claude'} mcp add --scope user drover -- {line_of(ours())}" in printed.out
    assert engines.claude_json.read_bytes() == before and engines.claude_list() == []

    data = install(cli, "claude", "--scope", "user")
    assert data["action"] == "added" and data["via"] == "claude mcp add" and data["path"] == str(engines.claude_json)
    (listed,) = engines.claude_list()
    assert listed.startswith(f"drover: {line_of(ours())} - "), listed
    saved = json.loads(engines.claude_json.read_text())
    assert saved["mcpServers"]["drover"]["command"] == ours()[0] and saved["projects"] == {"/x": {"a": 1}}

    written = engines.claude_json.read_bytes()
    again = cli("mcp", "install", "claude")
    assert again.code == 0 and "already registered" in again.out, again
    assert engines.claude_json.read_bytes() == written
    assert install(cli, "claude")["action"] == "unchanged"


def test_codex_through_codex_mcp_add_and_its_other_tables_stay(engines: Engines, cli: Any) -> None:
    engines.config_toml.write_text('model = "o3"  # mine\n\n[profiles.fast]\nmodel = "o4-mini"\n')
    assert cli("mcp", "install", "codex", "--print").code == 0 and engines.codex_entry() is None

    data = install(cli, "codex")
    assert data["action"] == "added" and data["via"] == "codex mcp add" and data["scope"] is None
    entry = engines.codex_entry()
    assert entry is not None and [entry["transport"]["command"], *entry["transport"]["args"]] == ours(), entry
    saved = tomllib.loads(engines.config_toml.read_text())
    assert saved["model"] == "o3" and saved["profiles"] == {"fast": {"model": "o4-mini"}}

    written = engines.config_toml.read_bytes()
    assert install(cli, "codex")["action"] == "unchanged" and engines.config_toml.read_bytes() == written


def test_another_drover_entry_is_replaced_only_with_force(engines: Engines, cli: Any) -> None:
    engines.run(engines.claude, "mcp", "add", "--scope", "user", "drover", "--", "/opt/old/drover", "mcp", "serve")
    before = engines.claude_json.read_bytes()
    refused = cli("mcp", "install", "claude")
    assert refused.code == 2, refused
    assert "another `drover` MCP server" in refused.err and "/opt/old/drover mcp serve" in refused.err
    assert "--force" in refused.err and engines.claude_json.read_bytes() == before
    assert cli("mcp", "install", "claude", "--print").code == 2  # --print says the same: it would refuse

    data = install(cli, "claude", "--force")
    assert data["action"] == "replaced" and data["previous"] == ["/opt/old/drover", "mcp", "serve"]
    (listed,) = engines.claude_list()
    assert listed.startswith(f"drover: {line_of(ours())} - "), listed

    # the same for Codex, whose own `mcp add` would have replaced it silently
    engines.run(engines.codex, "mcp", "add", "drover", "--", "/opt/old/drover", "mcp", "serve")
    refused = cli("mcp", "install", "codex", "--json")
    assert refused.code == 2 and refused.json()["errors"][0]["code"] == "usage", refused
    assert (engines.codex_entry() or {})["transport"]["command"] == "/opt/old/drover"
    install(cli, "codex", "--force")
    assert (engines.codex_entry() or {})["transport"]["command"] == ours()[0]


# -- where the CLI is missing: the files drover writes, read by the real binaries ----------------------------------


def test_the_files_written_without_the_clis_are_what_the_real_binaries_read(engines: Engines, cli: Any) -> None:
    engines.on_path(False)
    engines.claude_json.write_text(json.dumps({"hasCompletedOnboarding": True, "mcpServers": {"other": {"command": "x"}}}))
    engines.claude_json.chmod(0o600)

    data = install(cli, "claude")
    assert data["action"] == "added" and data["via"] == "file" and data["runs"] == []
    (listed,) = engines.claude_list()
    assert listed.startswith(f"drover: {line_of(ours())} - "), listed
    saved = json.loads(engines.claude_json.read_text())
    assert saved["mcpServers"]["other"] == {"command": "x"} and saved["hasCompletedOnboarding"] is True
    assert engines.claude_json.stat().st_mode & 0o777 == 0o600
    assert install(cli, "claude")["action"] == "unchanged"

    project = engines.home / "proj"
    project.mkdir()
    engines.monkeypatch.chdir(project)
    printed = cli("mcp", "install", "claude", "--scope", "project", "--print")
    assert printed.code == 0 and f"would write {project / '.mcp.json'}" in printed.out and '"mcpServers"' in printed.out
    assert not (project / ".mcp.json").exists()
    res = cli("mcp", "install", "claude", "--scope", "project")
    assert res.code == 0 and "New MCP server found" in res.err and "--scope user" in res.err, res
    shown = engines.run(engines.claude, "mcp", "get", "drover", cwd=project)
    assert "Project config" in shown or "project" in shown.lower(), shown

    engines.config_toml.write_text(
        '# my settings\nmodel = "o3"\n\n[profiles.fast]\nmodel = "o4-mini"\n\n[mcp_servers.other]\ncommand = "y"\n'
    )
    printed = cli("mcp", "install", "codex", "--print")
    assert printed.code == 0 and "[mcp_servers.drover]" in printed.out and "drover" not in engines.config_toml.read_text()
    assert install(cli, "codex")["via"] == "file"
    entry = engines.codex_entry()
    assert entry is not None and [entry["transport"]["command"], *entry["transport"]["args"]] == ours(), entry
    text = engines.config_toml.read_text()
    saved = tomllib.loads(text)
    assert text.startswith("# my settings\n") and saved["profiles"] == {"fast": {"model": "o4-mini"}}
    assert saved["mcp_servers"]["other"] == {"command": "y"} and saved["model"] == "o3"
    assert install(cli, "codex")["action"] == "unchanged"

    # a different entry in the file is refused without --force here too
    engines.config_toml.write_text('[mcp_servers.drover]\ncommand = "/opt/old/drover"\nargs = ["mcp", "serve"]\n')
    assert cli("mcp", "install", "codex").code == 2
    assert install(cli, "codex", "--force")["action"] == "replaced"
    assert (engines.codex_entry() or {})["transport"]["command"] == ours()[0]


def test_fleet_is_passed_on_absolute(engines: Engines, cli: Any) -> None:
    engines.on_path(False)
    (engines.home / "fleet.toml").write_text("")
    engines.monkeypatch.chdir(engines.home)
    data = install(cli, "--fleet", "fleet.toml", "codex")
    assert data["args"] == ["mcp", "serve", "--fleet", str(engines.home / "fleet.toml")]
    assert (engines.codex_entry() or {})["transport"]["args"] == data["args"]


# -- usage ----------------------------------------------------------------------------------------------------------


def test_codex_has_no_scope_and_an_unknown_engine_is_named(cli: Any, isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(isolated))
    monkeypatch.setenv("CODEX_HOME", str(isolated / "codex"))
    res = cli("mcp", "install", "codex", "--scope", "project")
    assert res.code == 2 and "Codex has no scopes" in res.err and "Traceback" not in res.err, res
    res = cli("mcp", "install", "gemini")
    assert res.code == 2 and "unknown engine 'gemini'" in res.err, res
    res = cli("mcp", "install", "claude", "--scope", "local")
    assert res.code == 2 and "give user or project" in res.err, res
    (isolated / ".claude.json").write_text("{not json")
    res = cli("mcp", "install", "claude")
    assert res.code == 7 and "is not valid JSON" in res.err and len(res.err.strip().splitlines()) == 1, res
    assert not (isolated / "codex").exists()


# -- the remote side's reading, on a Python without tomllib -------------------------------------------------------


@pytest.mark.parametrize(
    "text, found",
    [
        ('[mcp_servers.drover]\ncommand = "d"\n', True),
        ('[mcp_servers."drover"]\ncommand = "d"\n', True),
        ('[mcp_servers.drover.env]\nA = "1"\n', True),
        ('mcp_servers.drover.command = "d"\n', True),
        ('[mcp_servers]\ndrover = { command = "d" }\n', True),
        ('[mcp_servers]\nother = { command = "d" }\n', False),
        ('[mcp_servers.droverx]\ncommand = "d"\n', False),
        ('[profiles.x]\nmcp_servers.drover.command = "d"\n', False),  # that is profiles.x.mcp_servers
        ('[mcp_servers.other]\ndrover = "x"\n', False),
        ('# [mcp_servers.drover]\nmodel = "o3"\n', False),
        ("", False),
    ],
)
def test_the_line_scan_agrees_with_tomllib(text: str, found: bool) -> None:
    assert mcp_state.scan_toml(text) is found
    assert mcp_state.codex_registered(text) is found


# -- fleet check ----------------------------------------------------------------------------------------------------


def test_fleet_check_shows_the_registration_flip_after_install(engines: Engines, cli: Any) -> None:
    def mcp() -> dict[str, Any]:
        res = cli("fleet", "check", "--host", "local", "--json")
        assert res.code == 0, res.err
        return dict(res.json()["data"]["hosts"][0]["mcp"])

    assert mcp() == {"claude": False, "codex": False}  # both CLIs on PATH: found, neither registered
    table = cli("fleet", "check", "--host", "local")
    assert "MCP" in table.out.splitlines()[0] and "claude NO, codex NO" in table.out, table.out
    install(cli, "claude")
    assert mcp() == {"claude": True, "codex": False}
    install(cli, "codex")
    assert mcp() == {"claude": True, "codex": True}
    assert "claude, codex " in cli("fleet", "check", "--host", "local").out

    engines.on_path(False)  # no CLI and no config folder: Codex is not there at all
    engines.config_toml.unlink()
    engines.codex_home.rmdir()
    assert mcp() == {"claude": True}
    engines.claude_json.write_text("{cut")
    res = cli("fleet", "check", "--host", "local", "--json")
    row = res.json()["data"]["hosts"][0]
    assert row["mcp"] == {"claude": None} and any("cannot tell whether" in w for w in row["warnings"]), row


def test_fleet_check_over_ssh_reads_the_hosts_own_config(sshfleet: Any, cli: Any) -> None:
    home = Path(sshfleet.host_home("h1"))
    codex_home = home / ".codex"
    codex_home.mkdir(exist_ok=True)
    try:
        (codex_home / "config.toml").write_text('model = "o3"\n')

        def codex() -> Any:
            res = cli("fleet", "check", "--host", "h1", "--json")
            assert res.code == 0, res.err
            return res.json()["data"]["hosts"][0]["mcp"].get("codex")

        assert codex() is False
        # `drover mcp install codex` run as that host's user would (its HOME; no codex on its PATH: the file)
        proc = subprocess.run(
            [str(Path(sys.executable).parent / "drover"), "mcp", "install", "codex"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "HOME": str(home), "CODEX_HOME": "", "PATH": "/usr/bin:/bin", "DROVER_DAEMON": "0"},
        )
        assert proc.returncode == 0, proc.stderr
        assert "[mcp_servers.drover]" in (codex_home / "config.toml").read_text()
        assert codex() is True
    finally:
        shutil.rmtree(codex_home, ignore_errors=True)


def test_the_remote_side_reads_codex_config_on_python_3_6(tmp_path: Path) -> None:
    """A login node's Python 3.6 has no tomllib: the line scan is what answers there (the helper's own modules)."""
    python = Path("/root/.pyenv/versions").glob("3.6*/bin/python3")
    found = next(iter(sorted(python)), None)
    if found is None:
        pytest.skip("no Python 3.6 on this machine (pyenv's builds are at /root/.pyenv/versions)")
    (tmp_path / ".codex").mkdir()
    (tmp_path / ".claude.json").write_text('{"mcpServers": {"drover": {"command": "d"}}}')
    probe = "import json; from remote import mcp_state; w = []; print(json.dumps([mcp_state.registered({}, w), w]))"
    answers = []
    for text in ('model = "o3"\n[mcp_servers.drover]\ncommand = "d"\n', '[mcp_servers]\nother = { command = "d" }\n'):
        (tmp_path / ".codex" / "config.toml").write_text(text)
        proc = subprocess.run(
            [str(found), "-c", probe],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=Path(mcp_state.__file__).parent.parent,
            env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        )
        assert proc.returncode == 0, proc.stderr
        answers.append(json.loads(proc.stdout))
    assert answers == [[{"claude": True, "codex": True}, []], [{"claude": True, "codex": False}, []]]


# -- what a stranger left in the files ------------------------------------------------------------------------------


@pytest.mark.parametrize("on_path", [True, False], ids=["codex mcp add", "file"])
def test_our_codex_entry_switched_off_is_switched_back_on_never_called_registered(
    engines: Engines, cli: Any, on_path: bool
) -> None:
    engines.on_path(on_path)
    args = ", ".join(json.dumps(a) for a in ours()[1:])
    engines.config_toml.write_text(f'[mcp_servers.drover]\ncommand = "{ours()[0]}"\nargs = [{args}]\nenabled = false\n')
    data = install(cli, "codex")
    assert data["action"] == "replaced" and data["previous"] == [*ours(), "(enabled = false)"], data
    assert tomllib.loads(engines.config_toml.read_text())["mcp_servers"]["drover"].get("enabled", True) is True
    entry = engines.codex_entry()  # the real binary agrees: on
    assert entry is not None and entry.get("enabled", True) is True, entry
    assert install(cli, "codex")["action"] == "unchanged"


def test_a_servers_table_that_is_none_is_a_config_error_and_the_file_stays(engines: Engines, cli: Any) -> None:
    engines.on_path(False)
    engines.config_toml.write_text("mcp_servers = 5\n")
    res = cli("mcp", "install", "codex")
    assert res.code == 7 and "`mcp_servers` is not a table" in res.err and "Traceback" not in res.err, res
    assert engines.config_toml.read_text() == "mcp_servers = 5\n"
    engines.claude_json.write_text('{"mcpServers": [1, 2]}')
    res = cli("mcp", "install", "claude")
    assert res.code == 7 and "`mcpServers` is not a table" in res.err, res
    assert engines.claude_json.read_text() == '{"mcpServers": [1, 2]}'


def test_a_drover_entry_that_is_not_a_server_is_replaced_only_with_force(engines: Engines, cli: Any) -> None:
    engines.on_path(False)
    engines.claude_json.write_text('{"mcpServers": {"drover": "garbage"}}')
    res = cli("mcp", "install", "claude")
    assert res.code == 2 and "not a server entry" in res.err and "--force" in res.err, res
    assert json.loads(engines.claude_json.read_text()) == {"mcpServers": {"drover": "garbage"}}
    assert install(cli, "claude", "--force")["action"] == "replaced"
    assert json.loads(engines.claude_json.read_text())["mcpServers"]["drover"]["command"] == ours()[0]


def test_a_long_command_is_printed_on_one_line_whatever_its_length(engines: Engines, cli: Any) -> None:
    """A command to copy is never broken by the printer (CI's deep checkout wrapped `mcp serve` onto a new line)."""
    deep = engines.home / ("d" * 120) / ("e" * 120)
    deep.mkdir(parents=True)
    fleet = deep / "fleet.toml"
    fleet.write_text("")
    res = cli("--fleet", str(fleet), "mcp", "install", "claude", "--print")
    assert res.code == 0, res.err
    (run,) = [line for line in res.out.splitlines() if "would run:" in line]
    assert run.endswith(f"drover -- {line_of(ours())} --fleet {fleet}") or run.endswith(f"mcp serve --fleet {fleet}"), res.out
