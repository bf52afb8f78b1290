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
        # npm's package, and the native installer's binaries (~/.local/share/claude/versions/X.Y.Z).
        "scripts": [r"@anthropic-ai/claude-code(-[a-z0-9-]+)?/", r"/claude/versions/\d+\.\d+\.\d+[^/]*$"],
        # The input box: `❯` at column 0 between two rules (a dialog's `❯ 1. Yes` or ` ❯ Deny` is no input box).
        "input": r"^❯(?:[ \u00a0](?!\d+\.\s)(.*))?$",
        "input_above": r"^\s*─{3,}",
        "input_end": r"^\s*─{3,}",
        "input_end_last": True,
        "placeholder": [r'^Try "[^"]*"$'],
        # Drawn dim (its renderedPlaceholder: chalk.dim, the first letter inverted under the cursor): text in normal
        # intensity is a person's, whatever its words.
        "placeholder_faint": True,
        "paste_marker": [r"\[Pasted text #\d+( \+\d+ lines)?\]"],
        "live_above": 0,
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
        # The hold after a paste shows, before the last look (tmux_lane._settle).  Measured (tests/test_redraw.py,
        # 2.1.328, a shared 2-core machine, three runs of 10 pastes): Claude draws a pasted text in one write,
        # 18-487 ms after the paste (load decides); no second write followed within 600 ms.  The hold counts from
        # that write: it is for a dialog the program might raise in answer to the paste, 60 ms as before.
        "paste_hold_s": 0.06,
        "dialog_scope": "live",
        "default_state": "unknown",
        "queues_when_busy": True,
        "envelope": True,
    },
    "codex": {
        "commands": ["codex"],
        # The npm launcher (@openai/codex/bin/codex.js) and the native binary it runs (@openai/codex-linux-x64/...).
        "scripts": [r"@openai/codex(-[a-z0-9-]+)?/"],
        # The composer: the last `›` line at column 0 (earlier ones are history; `› 1. Yes` is a choice).
        "input": r"^›(?:[ \u00a0](?!\d+\.\s)(.*))?$",
        # The composer's lines go down to the blank line above its status line.
        "input_end": r"^\s*$",
        "placeholder": [r"^Ask Codex to do anything$", r"^Ask a follow-up question$"],
        "placeholder_faint": True,  # SGR 2, measured on 0.169 (gemini-cli draws its own in a theme's grey instead)
        # Any draft, even one that reads like the placeholder, takes `? for shortcuts` off the footer.
        "empty_footer": r"\? for shortcuts",
        "paste_marker": [r"\[Pasted Content \d+ chars\]"],
        "live_above": 2,
        # Messages queued with Tab are listed between the working line and the composer (measured on 0.169):
        # `• Queued follow-up inputs`, a `↳ ` line each (wrapped, indented), and an edit hint last -- the working
        # line sits above them all.
        "live_skip_block": [r"^• Queued follow-up inputs\s*$", r"^\s+shift\+← edit last queued message"],
        # Enter while a turn runs makes Codex drop its in-flight request and answer both; Tab queues the message
        # as its own turn after this one (measured on 0.169).
        "submit_when_busy": "Tab",
        "dialog": [
            r"Press enter to continue",
            r"Press enter to confirm",
            r"\benter (to )?continue\b",
            r"\besc (to )?(back|cancel|dismiss|close)\b",
            r"enter continue",
            r"Trust this folder\?",
            r"Do you trust the contents of this directory",
            r"Sign in with",
            r"^\s*[›>]\s*\d+\.\s",
            r"Allow command\?",
            r"Would you like to (run|make|apply)",
            r"Yes, proceed",
        ],
        "busy": [r"esc to interrupt"],
        "idle": [r"\? for shortcuts"],
        # Measured as for Claude (0.169): one write 4-104 ms after the paste (a second within
        # 0.4 ms of it at most), nothing after it.
        "paste_hold_s": 0.04,
        "dialog_scope": "live",
        "default_state": "unknown",
        "queues_when_busy": True,
        "envelope": True,
    },
    "gemini": {
        "commands": ["gemini"],
        "scripts": [r"@google/gemini-cli/"],
        # The input box is the last `>` line (`*` in YOLO mode, `!` in shell mode): history shows past prompts in
        # the same box, above it.  Its lower edge is `▀▀▀` in a true-colour terminal, nothing in a 256-colour one.
        "input": r"^ ?[>*!] (.*)$",
        "input_end": r"^(▀{3,}|\s*$|\s*workspace \(/directory\))",
        "placeholder": [r"^Type your message or @path/to/file$"],
        "paste_marker": [r"\[Pasted Text: \d+ (lines|chars)\]"],
        "live_above": 5,
        "dialog": [
            r"Do you trust the files in this folder\?",
            r"How would you like to authenticate",
            r"Enter Gemini API Key",
            r"Enter to (select|submit)\b",
            r"Allow execution of",
            r"Apply this change\?",
            r"Do you want to proceed\?",
            r"Waiting for user confirmation",
            r"Shell awaiting input",
            r"shell mode enabled",
            r"^[│\s]*●\s*\d+\.\s",
        ],
        "busy": [r"\(esc to cancel, \d+[hms]"],
        "idle": [r"^ ?[>*] +Type your message or @path/to/file"],
        # Under tmux an Enter within ~40 ms of a paste (plus its redraw) becomes a newline (real 0.61, measured).
        "submit_delay_s": 0.5,
        # It draws a paste in one or two writes, 20-166 ms after it and at most 20 ms apart (tests/test_redraw.py,
        # 0.61, three runs): 60 ms covers the second.
        "paste_hold_s": 0.06,
        "dialog_scope": "live",
        "default_state": "unknown",
        "queues_when_busy": True,
        "envelope": True,
    },
    # The agent-like REPL that `drover demo` and the tests run (drover/demo_agent.py).
    "demo": {
        "commands": ["drover-demo-agent"],
        "scripts": [r"drover[/.]demo_agent"],
        "input": r"^❯(?:[ \u00a0](?!\d+\.\s)(.*))?$",
        "input_above": r"^\s*─{3,}",
        "input_end": r"^\s*─{3,}",
        "input_end_last": True,
        "live_above": 0,
        "dialog": [r"Do you want to proceed\?", r"Enter to confirm"],
        "busy": [r"esc to interrupt"],
        "idle": [r"^\s*❯\s*$"],
        # It draws every frame in one write, 2-63 ms after a paste (tests/test_redraw.py).
        "paste_hold_s": 0.02,
        "dialog_scope": "live",
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

# A process that bears an engine's name but shows no evidence of being it (procs._engine_of): read like a shell
# for `drover ls`, and never typed into (delivery refuses it, whatever the caller asks).
BUILTIN_PROFILES["unknown"] = dict(BUILTIN_PROFILES["shell"], default_state="unknown")

ENGINE_ORDER = ["claude", "codex", "gemini", "demo"]
# Not engines a process can be detected as, but what is left when none is: never in engine_order.
NOT_DETECTED = ("shell", "unknown")
# Keys whose values are regular expressions (one, or a list): checked when profiles are merged.
PATTERN_KEYS = (
    "dialog",
    "busy",
    "idle",
    "scripts",
    "placeholder",
    "paste_marker",
    "input",
    "input_above",
    "input_end",
    "empty_footer",
    "live_skip_block",
)
PROFILE_KEYS = {
    "input": str,
    "empty_footer": str,
    "submit_when_busy": str,
    "submit_delay_s": float,
    "paste_hold_s": float,
    "input_end_last": bool,
    "placeholder_faint": bool,
    "input_above": str,
    "input_end": str,
    "placeholder": list,
    "paste_marker": list,
    "live_above": int,
    "live_skip_block": list,
    "commands": list,
    "scripts": list,
    "dialog": list,
    "busy": list,
    "idle": list,
    "dialog_scope": str,
    "default_state": str,
    "queues_when_busy": bool,
    "envelope": bool,
    "tcsh_emacs": bool,
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
        # The fleet naming an engine's commands is the user vouching for those programs: a process of that name is
        # that engine with no further evidence (built-in profiles' names need it; see procs._engine_of).
        base["vouched"] = bool(over.get("commands"))
        profiles[name] = base
    for name, prof in profiles.items():
        for key in PATTERN_KEYS:
            value = prof.get(key) or []
            for pattern in [value] if isinstance(value, str) else value:
                try:
                    re.compile(pattern)
                except re.error as exc:
                    raise HelperError(
                        BAD_PROFILE, "engine %r: %s pattern %r is not a valid regex: %s" % (name, key, pattern, exc)
                    ) from None
    return profiles


def engine_order(profiles: Dict[str, Dict[str, Any]]) -> List[str]:
    extra = [n for n in profiles if n not in ENGINE_ORDER and n not in NOT_DETECTED]
    return [n for n in ENGINE_ORDER if n in profiles] + sorted(extra)
