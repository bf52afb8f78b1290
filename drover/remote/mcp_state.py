"""Is drover's MCP server registered with this host's engines?  For `fleet check` (`drover mcp install` writes it).

Read from the files the engines read, never by running them (`claude mcp list` starts every server it lists):
Claude Code's user scope is `mcpServers` in `.claude.json` ($CLAUDE_CONFIG_DIR's, else HOME's; the legacy
`<config dir>/.config.json` while it is the only one); Codex's is `[mcp_servers.drover]` in $CODEX_HOME/config.toml.
A project's `.mcp.json` belongs to a folder, not to the host: not looked at.  Python 3.6 has no TOML parser:
tomllib where there is one (3.11+), else a line scan for the table's header (or a dotted or inline key), which
cannot see an `enabled = false` inside it.
"""

import json
import os
import re
import shutil
from typing import Dict, List, Optional

NAME = "drover"
ENGINES = ("claude", "codex")
# `[mcp_servers.drover]`, `[mcp_servers."drover"]`, and the dotted key `mcp_servers.drover.command = ...` at the top.
_TABLE = re.compile(r"""^\s*\[\s*mcp_servers\s*\.\s*(?:drover|"drover"|'drover')\s*[\].]""")
_DOTTED = re.compile(r"""^\s*mcp_servers\s*\.\s*(?:drover|"drover"|'drover')\s*[.=]""")
# Under a `[mcp_servers]` header: `drover = {...}` or `drover.command = ...`.
_INLINE = re.compile(r"""^\s*(?:drover|"drover"|'drover')\s*[.=]""")
_HEADER = re.compile(r"^\s*\[")
_SERVERS = re.compile(r"^\[\s*mcp_servers\s*\]")


def _home() -> str:
    return os.environ.get("HOME") or os.path.expanduser("~")


def claude_file() -> str:
    configured = os.environ.get("CLAUDE_CONFIG_DIR")
    config_dir = configured or os.path.join(_home(), ".claude")
    current = os.path.join(configured or _home(), ".claude.json")
    legacy = os.path.join(config_dir, ".config.json")
    if not os.path.exists(current) and os.path.isfile(legacy) and os.path.getsize(legacy) > 0:
        return legacy
    return current


def codex_file() -> str:
    return os.path.join(os.environ.get("CODEX_HOME") or os.path.join(_home(), ".codex"), "config.toml")


def claude_registered(path: str) -> bool:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    return isinstance(servers, dict) and isinstance(servers.get(NAME), dict)


def codex_registered(text: str) -> bool:
    try:
        import tomllib  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return scan_toml(text)
    servers = tomllib.loads(text).get("mcp_servers")
    entry = servers.get(NAME) if isinstance(servers, dict) else None
    return isinstance(entry, dict) and entry.get("enabled", True) is not False


def scan_toml(text: str) -> bool:
    """The line scan for Pythons without tomllib: a table or key that names mcp_servers.drover (a multi-line
    string that happens to hold such a line would fool it)."""
    table = None  # type: Optional[str]
    for line in text.splitlines():
        if _TABLE.match(line):
            return True
        if _HEADER.match(line):
            table = line.strip()
            continue
        if table is None and _DOTTED.match(line):
            return True
        if table is not None and _SERVERS.match(table) and _INLINE.match(line):
            return True
    return False


def _found(engine: str, path: str, sessions: Dict[str, int]) -> bool:
    """An engine is there when a session of it runs, its CLI is on PATH, or it has its config file or folder
    (~/.claude, $CODEX_HOME): each engine makes its folder on its first run."""
    folder = (
        os.environ.get("CLAUDE_CONFIG_DIR") or os.path.join(_home(), ".claude") if engine == "claude" else os.path.dirname(path)
    )
    if sessions.get(engine) or os.path.exists(path) or os.path.isdir(folder):
        return True
    return shutil.which(engine) is not None


def registered(sessions: Dict[str, int], warnings: List[str]) -> Dict[str, Optional[bool]]:
    """{engine: registered?} for each engine found here; None when its file could not be read (with a warning)."""
    out = {}  # type: Dict[str, Optional[bool]]
    for engine, path in (("claude", claude_file()), ("codex", codex_file())):
        if not _found(engine, path, sessions):
            continue
        try:
            if engine == "claude":
                out[engine] = claude_registered(path)
            else:
                with open(path, encoding="utf-8") as f:
                    out[engine] = codex_registered(f.read())
        except FileNotFoundError:
            out[engine] = False
        except (OSError, ValueError) as exc:  # tomllib's and json's errors are ValueErrors
            warnings.append("cannot tell whether drover's MCP server is registered with %s: %s: %s" % (engine, path, exc))
            out[engine] = None
    return out
