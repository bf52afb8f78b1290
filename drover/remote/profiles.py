"""Engine profiles: how to recognise an engine in a pane's process tree and how to read its screen.

Kept as data so users can override them in fleet.toml ([engines.NAME]) and check them against their own
captures with `drover guard check`.  Patterns are Python regular expressions searched line by line.
"""

import re
from typing import Any, Dict, List, Optional

from .protocol import BAD_PROFILE, HelperError

BUILTIN_PROFILES: Dict[str, Dict[str, Any]] = {
    "claude": {
        "commands": ["claude"],
        "scripts": [r"@anthropic-ai/claude-code(-[a-z0-9-]+)?/"],
        # A `❯` cursor on a choice line, or any of the footers Claude draws under a menu: Enter here answers it.
        "dialog": [
            r"Enter to confirm",
            r"Esc to cancel",
            r"Do you want to proceed\?",
            r"Do you want to (use|make|create|allow|run)\b",
            r"Held message from another session",
            r"Quick safety check",
            r"Yes, I (trust|accept)",
            r"^\s*❯\s*\d+\.\s",
            r"^\s*❯\s*(Yes|No|Deny|Allow)\b",
            r"Select login method",
            r"Press Enter to continue",
        ],
        "busy": [r"esc to interrupt"],
        "idle": [r"^\s*❯\s*$"],
        "dialog_scope": "screen",
        "default_state": "unknown",
        "queues_when_busy": True,
        "envelope": True,
    },
    "codex": {
        "commands": ["codex"],
        "scripts": [r"@openai/codex/"],
        "dialog": [
            r"Press enter to continue",
            r"enter continue",
            r"Trust this folder\?",
            r"Sign in with",
            r"^\s*[›>]\s*\d+\.\s",
            r"Allow command\?",
            r"Would you like to (run|make|apply)",
            r"Yes, proceed",
        ],
        "busy": [r"esc to interrupt"],
        "idle": [r"\? for shortcuts"],
        "dialog_scope": "screen",
        "default_state": "unknown",
        "queues_when_busy": True,
        "envelope": True,
    },
    "gemini": {
        "commands": ["gemini"],
        "scripts": [r"@google/gemini-cli/"],
        "dialog": [
            r"Allow execution",
            r"Waiting for user confirmation",
            r"Do you want to proceed",
            r"^\s*●\s*\d+\.\s",
            r"Enter to select",
        ],
        "busy": [r"esc to cancel"],
        "idle": [r"Type your message"],
        "dialog_scope": "screen",
        "default_state": "unknown",
        "queues_when_busy": False,
        "envelope": True,
    },
    # The agent-like REPL that `drover demo` and the tests run (drover/demo_agent.py).
    "demo": {
        "commands": ["drover-demo-agent"],
        "scripts": [r"drover[/.]demo_agent"],
        "dialog": [r"Do you want to proceed\?", r"Enter to confirm"],
        "busy": [r"esc to interrupt"],
        "idle": [r"^\s*❯\s*$"],
        "dialog_scope": "screen",
        "default_state": "unknown",
        "queues_when_busy": True,
        "envelope": True,
    },
    # Anything else in a pane: a shell or a TUI drover knows nothing about.  Raw text, no envelope.  Only the
    # line the program is asking on counts: a shell's old "Password:" line further up is history, not a prompt.
    "shell": {
        "commands": [],
        "scripts": [],
        "dialog": [
            r"[Pp]assword[^\n]*:\s*$",
            r"[Pp]assphrase[^\n]*:\s*$",
            r"\(yes/no(/\[fingerprint\])?\)\??\s*$",
            r"\[[yY]/[nN]\]\s*\??\s*$",
            r"\([yY]/[nN]\)\s*\??\s*$",
            r"Are you sure",
            r"Press (any key|ENTER|RETURN|Enter)",
        ],
        "busy": [],
        "idle": [],
        "dialog_scope": "last_line",
        "default_state": "idle",
        "queues_when_busy": False,
        "envelope": False,
    },
}

ENGINE_ORDER = ["claude", "codex", "gemini", "demo"]
PROFILE_KEYS = {
    "commands": list,
    "scripts": list,
    "dialog": list,
    "busy": list,
    "idle": list,
    "dialog_scope": str,
    "default_state": str,
    "queues_when_busy": bool,
    "envelope": bool,
}


def merge_profiles(overrides: Optional[Dict[str, Dict[str, Any]]]) -> Dict[str, Dict[str, Any]]:
    """Built-in profiles with the fleet's overrides laid over them, key by key."""
    profiles = {name: dict(p) for name, p in BUILTIN_PROFILES.items()}
    for name, over in (overrides or {}).items():
        base = profiles.get(name, dict(BUILTIN_PROFILES["shell"], commands=[], scripts=[]))
        for key, value in over.items():
            if key not in PROFILE_KEYS:
                raise HelperError(BAD_PROFILE, "engine profile %r has an unknown key %r" % (name, key))
            base[key] = value
        profiles[name] = base
    for name, prof in profiles.items():
        for key in ("dialog", "busy", "idle", "scripts"):
            for pattern in prof.get(key, []):
                try:
                    re.compile(pattern)
                except re.error as exc:
                    raise HelperError(
                        BAD_PROFILE, "engine %r: %s pattern %r is not a valid regex: %s" % (name, key, pattern, exc)
                    ) from None
    return profiles


def engine_order(profiles: Dict[str, Dict[str, Any]]) -> List[str]:
    extra = [n for n in profiles if n not in ENGINE_ORDER and n != "shell"]
    return [n for n in ENGINE_ORDER if n in profiles] + sorted(extra)
