"""`drover mcp install claude|codex`: register drover's MCP server with an engine, in one idempotent command.

Through the engine's own CLI when it is on PATH (`claude mcp add --scope S drover -- CMD mcp serve`, `codex mcp
add drover -- CMD mcp serve`), else by writing the file that CLI would have written: Claude Code 2.1.328 keeps user
scope in `~/.claude.json` (`$CLAUDE_CONFIG_DIR/.claude.json` when set) under `mcpServers`, project scope in the cwd's
`.mcp.json`; Codex 0.169 in `$CODEX_HOME/config.toml` (default ~/.codex) as `[mcp_servers.drover]`.  What is there
now is always read from those files (both CLIs write exactly there), so the decision -- unchanged, added, refused
without --force, replaced -- is the same whichever way the change is made.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from drover.errors import ConfigError, UsageError

NAME = "drover"
ENGINES = ("claude", "codex")
SCOPES = ("user", "project")
# `claude mcp add` starts node and reads its config: seconds on a loaded machine, never minutes.
CLI_TIMEOUT_S = 120.0
PROJECT_DIALOG = (
    'a project .mcp.json makes Claude Code ask "New MCP server found in this project" when it starts there (a '
    "dialog a session waits on): --scope user registers it for every project with no dialog"
)


def server_command(fleet: str | None) -> list[str]:
    """The argv an engine runs to start this drover's server: this very drover's executable, absolute.

    sys.argv[0] when it is the `drover` script (not followed through symlinks: a pipx or nix-profile link on PATH is
    the name that survives an upgrade, the store path behind it is not), else the console script beside the running
    interpreter (`python -m drover`, or a test), else that interpreter with `-m drover`."""
    argv0 = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if argv0 is not None and argv0.name == "drover" and argv0.is_file():
        command = [os.path.abspath(argv0)]
    else:
        beside = Path(sys.executable).parent / "drover"
        command = [str(beside)] if beside.is_file() else [sys.executable, "-m", "drover"]
    command += ["mcp", "serve"]
    if fleet:
        command += ["--fleet", os.path.abspath(os.path.expanduser(fleet))]
    return command


# -- where each engine keeps its servers ---------------------------------------------------------------------------


def claude_user_file(env: dict[str, str] | None = None) -> Path:
    """Claude Code's global config file, as 2.1.328 picks it: the legacy `<config dir>/.config.json` while it is the
    only one, else `.claude.json` in $CLAUDE_CONFIG_DIR, or in HOME."""
    env = dict(os.environ) if env is None else env
    home = Path(env.get("HOME") or os.path.expanduser("~"))
    config_dir = Path(env["CLAUDE_CONFIG_DIR"]) if env.get("CLAUDE_CONFIG_DIR") else home / ".claude"
    current = (config_dir if env.get("CLAUDE_CONFIG_DIR") else home) / ".claude.json"
    legacy = config_dir / ".config.json"
    if not current.exists() and legacy.is_file() and legacy.stat().st_size > 0:
        return legacy
    return current


def codex_config_file(env: dict[str, str] | None = None) -> Path:
    env = dict(os.environ) if env is None else env
    home = env.get("CODEX_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".codex")
    return Path(home) / "config.toml"


def config_file(engine: str, scope: str, cwd: Path | None = None) -> Path:
    if engine == "codex":
        return codex_config_file()
    return (cwd or Path.cwd()) / ".mcp.json" if scope == "project" else claude_user_file()


def _read_json(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}", hint="fix the file or its permissions, then run this again") from None
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}", hint="fix the file, then run this again") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} holds no JSON object", hint="fix the file, then run this again")
    return data


def _read_toml(path: Path) -> Any:
    import tomlkit
    from tomlkit.exceptions import TOMLKitError

    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return tomlkit.document()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}", hint="fix the file or its permissions, then run this again") from None
    try:
        return tomlkit.parse(text)
    except TOMLKitError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}", hint="fix the file, then run this again") from None


def existing(engine: str, path: Path) -> list[str] | None:
    """The argv of the `drover` server registered in that file now, or None.  A servers table that is not one is
    the file's fault (a config error, nothing overwritten); a `drover` entry that is not a server, or one switched
    off (`enabled = false`), is shown as what it is -- not ours as it stands, so replacing it needs --force or,
    for our own command switched off, is switching it back on."""
    key = "mcp_servers" if engine == "codex" else "mcpServers"
    data = _read_toml(path) if engine == "codex" else _read_json(path)
    servers = data.get(key)
    if servers is None:
        return None
    if not isinstance(servers, dict):
        raise ConfigError(
            f"{path}: `{key}` is not a table of servers (it is {type(servers).__name__} {str(servers)[:40]!r})",
            hint="fix the file, then run this again",
        )
    if NAME not in servers:
        return None
    entry = servers.get(NAME)
    if not isinstance(entry, dict):
        return [f"(not a server entry: {str(entry)[:40]!r})"]
    args = entry.get("args") or []
    argv = [str(entry.get("command") or "")] + [str(a) for a in args if isinstance(args, list)]
    if entry.get("enabled") is False:
        argv.append(DISABLED)
    return argv


DISABLED = "(enabled = false)"  # marks an entry switched off: never "already registered"


# -- writing the file where the CLI is missing ---------------------------------------------------------------------


def _replace(path: Path, text: str) -> None:
    """Write the whole file at once (a reader never sees half of it), keeping its mode; 0600 for a new one: these
    files can carry tokens (Claude's OAuth account, servers' env)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o600
    tmp = path.with_name(f".{path.name}.drover-{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"cannot write {path}: {exc}", hint="check the folder's permissions") from None


def write_claude(path: Path, command: list[str]) -> str:
    """The file with our entry (every other key kept, in order), as `claude mcp add` writes one."""
    data = _read_json(path)
    servers = data.get("mcpServers")
    if not isinstance(servers, dict):
        servers = data["mcpServers"] = {}
    servers[NAME] = {"type": "stdio", "command": command[0], "args": command[1:], "env": {}}
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def write_codex(path: Path, command: list[str]) -> str:
    """config.toml with `[mcp_servers.drover]` set, through tomlkit: its other tables, comments and order stay."""
    import tomlkit

    doc = _read_toml(path)
    if "mcp_servers" not in doc:
        doc["mcp_servers"] = tomlkit.table(is_super_table=True)
    table = tomlkit.table()
    table["command"] = command[0]
    table["args"] = command[1:]
    doc["mcp_servers"][NAME] = table
    return tomlkit.dumps(doc)


# -- the plan, and carrying it out ---------------------------------------------------------------------------------


@dataclass
class Plan:
    engine: str
    scope: str | None
    command: list[str]
    path: Path
    current: list[str] | None
    cli: str | None  # the engine's CLI found on PATH, else None: the file is written directly
    runs: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def action(self) -> str:
        if self.current == self.command:
            return "unchanged"
        return "replace" if self.current is not None else "add"

    @property
    def via(self) -> str:
        return f"{self.engine} mcp add" if self.cli else "file"

    def to_dict(self, done: bool) -> dict[str, Any]:
        action = self.action
        if done and action != "unchanged":
            action = {"add": "added", "replace": "replaced"}[action]
        return {
            "engine": self.engine,
            "scope": self.scope,
            "name": NAME,
            "command": self.command[0],
            "args": self.command[1:],
            "action": action,
            "changed": done and self.action != "unchanged",
            "via": self.via,
            "path": str(self.path),
            "previous": self.current,
            "runs": [shlex.join(r) for r in self.runs],
            "notes": self.notes,
        }


def plan(engine: str, scope: str | None, fleet: str | None, force: bool, cwd: Path | None = None) -> Plan:
    if engine not in ENGINES:
        raise UsageError(f"unknown engine {engine!r}", hint="give claude or codex")
    if engine == "codex" and scope is not None and scope != "user":
        raise UsageError(
            f"--scope {scope}: Codex has no scopes (its servers are in $CODEX_HOME/config.toml)", hint="leave out --scope"
        )
    if scope is not None and scope not in SCOPES:
        raise UsageError(f"--scope {scope}: give user or project")
    if engine == "claude":
        scope = scope or "user"
    command = server_command(fleet)
    path = config_file(engine, scope or "user", cwd)
    cli = shutil.which(engine)
    p = Plan(engine, scope if engine == "claude" else None, command, path, existing(engine, path), cli)
    ours_switched_off = p.current == [*command, DISABLED]
    if p.action == "replace" and not force and not ours_switched_off:
        where = f"{engine} ({scope} scope, {path})" if engine == "claude" else f"codex ({path})"
        raise UsageError(
            f"another `{NAME}` MCP server is registered for {where}: {shlex.join(p.current or [])}",
            hint="--force replaces it with " + shlex.join(command),
        )
    if cli and p.action != "unchanged":
        if engine == "claude":
            if p.current is not None:  # `claude mcp add` refuses a name that exists: remove it first
                p.runs.append([cli, "mcp", "remove", "--scope", str(scope), NAME])
            p.runs.append([cli, "mcp", "add", "--scope", str(scope), NAME, "--", *command])
        else:  # `codex mcp add` replaces an entry of the same name itself
            p.runs.append([cli, "mcp", "add", NAME, "--", *command])
    if engine == "claude" and scope == "project":
        p.notes.append(PROJECT_DIALOG)
    return p


def entry_text(p: Plan) -> str:
    """Our entry as the file would hold it: what --print shows (never the whole file: it can hold tokens)."""
    if p.engine == "codex":
        import tomlkit

        command, args = tomlkit.string(p.command[0]).as_string(), tomlkit.item(p.command[1:]).as_string()
        return f"[mcp_servers.{NAME}]\ncommand = {command}\nargs = {args}"
    entry = {"type": "stdio", "command": p.command[0], "args": p.command[1:], "env": {}}
    return json.dumps({"mcpServers": {NAME: entry}}, indent=2, ensure_ascii=False)


def new_text(p: Plan) -> str:
    return write_codex(p.path, p.command) if p.engine == "codex" else write_claude(p.path, p.command)


def apply(p: Plan) -> None:
    """Make the change, then read the file back: an engine that wrote somewhere else is an error, not a success."""
    if p.action == "unchanged":
        return
    if not p.runs:
        _replace(p.path, new_text(p))
    elif p.engine == "codex":  # `codex mcp add` refuses a CODEX_HOME that does not exist yet
        try:
            p.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot make {p.path.parent}: {exc}", hint="check CODEX_HOME and its permissions") from None
    for argv in p.runs:
        try:
            # Project scope is the cwd's: the CLI runs where the file is.
            where = p.path.parent if p.scope == "project" else None
            proc = subprocess.run(
                argv, capture_output=True, text=True, timeout=CLI_TIMEOUT_S, cwd=where, stdin=subprocess.DEVNULL
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigError(f"`{shlex.join(argv)}` did not run: {exc}", hint="run it yourself to see why") from None
        if proc.returncode != 0:
            said = " ".join((proc.stderr or proc.stdout).split())[:300] or f"exit {proc.returncode}"
            raise ConfigError(f"`{shlex.join(argv)}` failed: {said}", hint="run it yourself to see why")
    now = existing(p.engine, p.path)
    if now != p.command:
        raise ConfigError(
            f"{p.engine} did not register drover in {p.path} (found {shlex.join(now) if now else 'nothing'} there)",
            hint="CLAUDE_CONFIG_DIR or CODEX_HOME may differ from this shell's; check with `" + f"{p.engine} mcp list`",
        )
