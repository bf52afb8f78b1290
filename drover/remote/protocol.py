"""The words drover answers with: the protocol version, the outcome names, and every error code.

One list for the whole program, the remote side and the client alike: the helper raises and answers with these
names, and `drover/errors.py` derives its exit codes from the class each code belongs to.  `tests/test_protocol.py`
pins the list, so a code can be added on purpose but never renamed by accident.

Stdlib only and Python 3.6+: this module is shipped to every host inside the helper bundle.
"""

from typing import Any

# The helper protocol.  2: answers are framed (ANSWER_MARK), requests are JSON lines, the bundle is hashed.
PROTOCOL = 2

# Everything the helper writes on stdout before this mark is noise from the remote login shell, not the answer.
# A record separator makes it unlikely in any rc file's output; the length after it makes a truncated answer
# detectable.
ANSWER_MARK = b"\x1edrover-answer "

# Exit statuses of the remote bootstrap that come before any JSON can be written.
EXIT_TOO_OLD = 97  # the interpreter is older than MIN_PYTHON
EXIT_NOT_FOUND = 127  # the shell could not find the interpreter
EXIT_SSH_FAILED = 255  # OpenSSH's client failed itself (the remote command's own status is anything else)
MIN_PYTHON = (3, 6)

# -- outcomes: what became of a message ------------------------------------------------------------------------
DELIVERED = "delivered"  # the target took it (an idle target)
QUEUED = "queuedBehindTurn"  # the target is busy; it arrives when its turn allows
HELD = "held"  # the receiver holds it for its human
REFUSED = "refused"  # the receiver's policy, or drover's guard or limits, refused it
DROPPED = "dropped"  # the receiver dropped it (duplicate, rate limit, queue full)
FAILED = "failed"  # it never reached the receiver (or, with indeterminate, drover cannot know)
OUTCOMES = (DELIVERED, QUEUED, HELD, REFUSED, DROPPED, FAILED)

# -- error classes: what kind of failure a code is, and so which exit code it gets ----------------------------
USAGE = "usage"  # the request is wrong: fix the arguments
TARGET = "target"  # no such host or session, or more than one
CONFIG = "config"  # the fleet file or an engine profile is wrong
REFUSAL = "refusal"  # a refused outcome: the guard, drover's limits, or the receiver said no
DROP = "drop"  # a dropped outcome: the receiver dropped it
FAILURE = "failure"  # the host or the lane failed: the message did not get there
TIMEOUT = "timeout"  # a wait ran out
INTERNAL = "internal"  # a bug

# -- codes ------------------------------------------------------------------------------------------------------
# Usage
BAD_REQUEST = "bad_request"
BAD_LANE = "bad_lane"
EMPTY_TEXT = "empty_text"
UNKNOWN_ENGINE = "unknown_engine"
USAGE_ERROR = "usage"
BAD_JSON = "bad_json"
UNKNOWN_OP = "unknown_op"
INVALID_REQUEST = "invalid_request"
# Target
SESSION_NOT_FOUND = "session_not_found"
AMBIGUOUS_SESSION = "ambiguous_session"
NO_TRANSCRIPT = "no_transcript"
PANE_GONE = "pane_gone"
UNKNOWN_HOST = "unknown_host"
TARGET_ERROR = "target"
MESSAGE_NOT_FOUND = "message_not_found"
SESSION_EXITED = "session_exited"
AMBIGUOUS_MESSAGE = "ambiguous_message"
HANDOFF_BROKEN = "handoff_broken"  # the named session is gone and no generation of its handoff chain lives
UNKNOWN_ENDPOINT = "unknown_endpoint"  # `bot:NAME` / `adapter:NAME` with no such entry in the fleet
# A bot's webhook (drover/bots/deliver.py): what its HTTP answer, or the lack of one, means
BOT_DISABLED = "bot_disabled"  # it answered 410: sends are refused until its url or secret changes
BOT_DISABLED_UNSENT = "bot_disabled_unsent"  # refused without a request: it answered 410 earlier, nothing was sent
BOT_REDIRECT = "bot_redirect"  # it answered a redirect, which is never followed
BOT_REFUSED = "bot_refused"  # another 4xx
BOT_FAILED = "bot_failed"  # a 5xx: retryable, the same webhook-id
BOT_TIMEOUT = "bot_timeout"  # no answer in its timeout
BOT_UNREACHABLE = "bot_unreachable"  # no connection, or it broke
BOT_SECRET = "bot_secret"  # its secret_env names no whsec_ secret: nothing was sent
# Config
BAD_PROFILE = "bad_profile"
CONFIG_ERROR = "config"
FLEET_INVALID = "fleet_invalid"
# The truth file (the client's local record) cannot be used: nothing is sent that cannot be recorded
TRUTH_FILE_ERROR = "truth_file_error"
TRUTH_UNWRITABLE = "truth_unwritable"
TRUTH_DISK_FULL = "truth_disk_full"
TRUTH_UNSAFE = "truth_unsafe"
# Refusals by drover's guard on the tmux lane
DIALOG = "dialog"
BUSY = "busy"
UNRECOGNISED_SCREEN = "unrecognised_screen"
PANE_DEAD = "pane_dead"
COPY_MODE = "copy_mode"
INPUT_OFF = "input_off"
ENGINE_CHANGED = "engine_changed"
ENGINE_MISMATCH = "engine_mismatch"
DIALOG_AFTER_PASTE = "dialog_after_paste"
WAITING = "waiting"
DRAFT_IN_INPUT = "draft_in_input"
NOT_AN_AGENT = "not_an_agent"
UNVERIFIED_ENGINE = "unverified_engine"  # a program named like an engine shows no evidence of being it
NOT_AT_PROMPT = "not_at_prompt"
MULTILINE_UNBRACKETED = "multiline_unbracketed"
KEYS_NOT_TEXT = "keys_not_text"  # --raw: the shell's line editor would read the text as commands (vi command mode)
PASTE_NOT_SHOWN = "paste_not_shown"
# The pane changed between drover's last look and its Enter (a key typed, a redraw): Enter was not pressed
CHANGED_BEFORE_ENTER = "changed_before_enter"
PANE_LOCKED = "pane_locked"
WOULD_BE_HELD = "would_be_held"
# A paste asked for a session whose engine has its own lane (Claude's inbox, a Codex thread's queue): native only
NATIVE_LANE = "native_lane"
# A real Claude or Codex (by its package) whose own lane drover cannot find: no paste on doubt
LANE_UNKNOWN = "lane_unknown"
CANNOT_VERIFY = "cannot_verify"
NOT_FOREGROUND = "not_foreground"
# Refusals on the queue lane (Codex): threads `codex queue` would take a message for and never run it
THREAD_NOT_LOADED = "thread_not_loaded"
EXEC_THREAD = "exec_thread"
THREAD_ERROR = "thread_error"
WAITING_ON_HUMAN = "waiting_on_human"  # skipped by a broadcast, refused by a nudge or the inbox: a dialog, a wait, a draft
# Refusals by drover's limits and policy
TOO_LARGE = "too_large"
DUPLICATE = "duplicate"
RATE_LIMITED = "rate_limited"
OWNER_RELAY_OFF = "owner_relay_off"
# Refusals of a nudge (drover nudge): it delivers only to a live, idle session that is alone in its directory
NOT_LIVE = "not_live"  # no live agent session by that name: a nudge never creates one (--create-if-missing does)
GENERATING = "generating"  # the session is live but busy with a turn: a nudge waits for it to be idle
SHARED_CWD = "shared_cwd"  # another live session works in the same directory: the nudge could land in the wrong one
NUDGE_RUN_LOCKED = "nudge_run_locked"  # another `drover nudge run` still holds the schedule's lock
REFUSED_BY_DROVER = "refused"
# Receipts from Claude Code's inbox (claude-code-inbox.md): refused, expired, and its drop reasons
RECEIVER_REFUSED = "refused"
EXPIRED = "expired"
DENIED = "denied"
HOP_LOOP = "hop_loop"
HOP_RUNAWAY = "hop_runaway"
QUEUE_FULL = "queue_full"
RECEIVER_DROPPED = "receiver_dropped"
# Host-side failures
NO_TMUX = "no_tmux"
TMUX_ERROR = "tmux_error"
TMUX_TIMEOUT = "tmux_timeout"
PASTE_UNCERTAIN = "paste_uncertain"
REPLY_SOCKET = "reply_socket"
SOCKET_STALE = "socket_stale"
SOCKET_MISSING = "socket_missing"
SOCKET_FOREIGN = "socket_foreign"  # what is at the inbox path is not the session's own listening socket
INBOX_TIMEOUT = "inbox_timeout"
INBOX_ERROR = "inbox_error"
HELPER_CRASH = "helper_crash"
PROTOCOL_MISMATCH = "protocol"
BUNDLE_MISMATCH = "bundle_mismatch"
# Transport failures (the client's side of SSH)
UNREACHABLE = "unreachable"
CONNECTION_REFUSED = "connection_refused"
CONNECT_TIMEOUT = "connect_timeout"
DNS = "dns"
CONNECTION_LOST = "connection_lost"
UNKNOWN_HOST_KEY = "unknown_host_key"
HOST_KEY_CHANGED = "host_key_changed"
HOST_KEY = "host_key"
AUTH_FAILED = "auth_failed"
SSH_ERROR = "ssh_error"
PYTHON_MISSING = "python_missing"
PYTHON_TOO_OLD = "python_too_old"
SHELL_FAILED = "shell_failed"
PROXY_JUMP_FAILED = "proxy_jump_failed"
IDENTITY_MISSING = "identity_missing"
SECOND_FACTOR = "second_factor"  # the host asks for a code (keyboard-interactive) asyncssh cannot type
NO_MASTER = "no_master"  # an openssh-transport host that needs the user's ControlMaster, which is not up
HELPER_ERROR = "helper_error"
REQUEST_TIMEOUT = "timeout"
INTERRUPTED = "interrupted"
NOT_SUBMITTED = "not_submitted"
QUEUE_UNAVAILABLE = "queue_unavailable"
QUEUE_FAILED = "queue_failed"
QUEUE_TIMEOUT = "queue_timeout"
# Timeouts of a wait
WAIT_TIMEOUT = "wait_timeout"
# What a broadcast or a file wait names does not exist (or cannot be looked at)
NO_MATCH = "no_match"
NO_SUCH_DIRECTORY = "no_such_directory"
PERMISSION_DENIED = "permission_denied"
# Starting a session (drover spawn)
CWD_NOT_FOUND = "cwd_not_found"  # the directory to start in does not exist on the host (or is not a directory)
NAME_TAKEN = "name_taken"  # a tmux session or a live session already has that name
ENGINE_EXITED = "engine_exited"  # the engine's command exited at once (its pane died): nothing is running
SPAWN_TIMEOUT = "spawn_timeout"  # the new session was not ready (nor at a dialog) in time; it is left running
TRUST_FILE_ERROR = "trust_file_error"  # the engine's settings file could not be read or written to pre-trust a folder
# The catch-all of a bug
# Command adapters (`adapter:NAME`, drover/adapters.py): what their exit status said
ADAPTER_REFUSED = "adapter_refused"  # it exited 4
ADAPTER_FAILED = "adapter_failed"  # it exited non-zero (not 3 or 4): retryable
ADAPTER_CRASHED = "adapter_crashed"  # killed by a signal: it may have acted first
ADAPTER_TIMEOUT = "adapter_timeout"  # past its timeout, killed with its process group: it may have acted first
ADAPTER_MISSING = "adapter_missing"  # its command (or cwd) is not there, or cannot be executed: it never ran
INTERNAL_ERROR = "error"

# Every code and its class.  Some names are shared by two meanings of one word (drover's own `duplicate` refusal
# and the receiver's `duplicate` drop): the outcome tells them apart, the class is the outcome's.
CODES = {
    BAD_REQUEST: USAGE,
    BAD_LANE: USAGE,
    EMPTY_TEXT: USAGE,
    UNKNOWN_ENGINE: USAGE,
    USAGE_ERROR: USAGE,
    BAD_JSON: USAGE,
    UNKNOWN_OP: USAGE,
    INVALID_REQUEST: USAGE,
    SESSION_NOT_FOUND: TARGET,
    AMBIGUOUS_SESSION: TARGET,
    NO_TRANSCRIPT: TARGET,
    PANE_GONE: TARGET,
    UNKNOWN_HOST: TARGET,
    TARGET_ERROR: TARGET,
    MESSAGE_NOT_FOUND: TARGET,
    AMBIGUOUS_MESSAGE: TARGET,
    SESSION_EXITED: TARGET,
    HANDOFF_BROKEN: TARGET,
    UNKNOWN_ENDPOINT: TARGET,
    BOT_DISABLED: REFUSAL,
    BOT_DISABLED_UNSENT: REFUSAL,
    BOT_REDIRECT: REFUSAL,
    BOT_REFUSED: REFUSAL,
    BOT_FAILED: FAILURE,
    BOT_TIMEOUT: FAILURE,
    BOT_UNREACHABLE: FAILURE,
    BOT_SECRET: CONFIG,
    BAD_PROFILE: CONFIG,
    CONFIG_ERROR: CONFIG,
    FLEET_INVALID: CONFIG,
    TRUTH_FILE_ERROR: CONFIG,
    TRUTH_UNWRITABLE: CONFIG,
    TRUTH_DISK_FULL: CONFIG,
    TRUTH_UNSAFE: CONFIG,
    DIALOG: REFUSAL,
    BUSY: REFUSAL,
    UNRECOGNISED_SCREEN: REFUSAL,
    PANE_DEAD: REFUSAL,
    COPY_MODE: REFUSAL,
    INPUT_OFF: REFUSAL,
    ENGINE_CHANGED: REFUSAL,
    ENGINE_MISMATCH: REFUSAL,
    DIALOG_AFTER_PASTE: REFUSAL,
    WAITING: REFUSAL,
    DRAFT_IN_INPUT: REFUSAL,
    NOT_AN_AGENT: REFUSAL,
    UNVERIFIED_ENGINE: REFUSAL,
    NOT_AT_PROMPT: REFUSAL,
    MULTILINE_UNBRACKETED: REFUSAL,
    KEYS_NOT_TEXT: REFUSAL,
    PASTE_NOT_SHOWN: REFUSAL,
    CHANGED_BEFORE_ENTER: REFUSAL,
    PANE_LOCKED: REFUSAL,
    WOULD_BE_HELD: REFUSAL,
    NATIVE_LANE: REFUSAL,
    LANE_UNKNOWN: REFUSAL,
    CANNOT_VERIFY: REFUSAL,
    NOT_FOREGROUND: REFUSAL,
    THREAD_NOT_LOADED: REFUSAL,
    EXEC_THREAD: REFUSAL,
    THREAD_ERROR: REFUSAL,
    WAITING_ON_HUMAN: REFUSAL,
    TOO_LARGE: REFUSAL,
    DUPLICATE: REFUSAL,
    RATE_LIMITED: REFUSAL,
    OWNER_RELAY_OFF: REFUSAL,
    NOT_LIVE: REFUSAL,
    GENERATING: REFUSAL,
    SHARED_CWD: REFUSAL,
    NUDGE_RUN_LOCKED: REFUSAL,
    REFUSED_BY_DROVER: REFUSAL,
    EXPIRED: REFUSAL,
    DENIED: REFUSAL,
    HOP_LOOP: DROP,
    HOP_RUNAWAY: DROP,
    QUEUE_FULL: DROP,
    RECEIVER_DROPPED: DROP,
    NO_TMUX: FAILURE,
    TMUX_ERROR: FAILURE,
    TMUX_TIMEOUT: FAILURE,
    PASTE_UNCERTAIN: FAILURE,
    REPLY_SOCKET: FAILURE,
    SOCKET_STALE: FAILURE,
    SOCKET_MISSING: FAILURE,
    SOCKET_FOREIGN: FAILURE,
    INBOX_TIMEOUT: FAILURE,
    INBOX_ERROR: FAILURE,
    HELPER_CRASH: FAILURE,
    PROTOCOL_MISMATCH: FAILURE,
    BUNDLE_MISMATCH: FAILURE,
    UNREACHABLE: FAILURE,
    CONNECTION_REFUSED: FAILURE,
    CONNECT_TIMEOUT: FAILURE,
    DNS: FAILURE,
    CONNECTION_LOST: FAILURE,
    UNKNOWN_HOST_KEY: FAILURE,
    HOST_KEY_CHANGED: FAILURE,
    HOST_KEY: FAILURE,
    AUTH_FAILED: FAILURE,
    SSH_ERROR: FAILURE,
    PYTHON_MISSING: FAILURE,
    PYTHON_TOO_OLD: FAILURE,
    SHELL_FAILED: FAILURE,
    PROXY_JUMP_FAILED: FAILURE,
    IDENTITY_MISSING: CONFIG,
    SECOND_FACTOR: FAILURE,
    NO_MASTER: FAILURE,
    HELPER_ERROR: FAILURE,
    REQUEST_TIMEOUT: FAILURE,
    INTERRUPTED: FAILURE,
    NOT_SUBMITTED: FAILURE,
    QUEUE_UNAVAILABLE: FAILURE,
    QUEUE_FAILED: FAILURE,
    QUEUE_TIMEOUT: FAILURE,
    WAIT_TIMEOUT: TIMEOUT,
    NO_MATCH: TARGET,
    NO_SUCH_DIRECTORY: TARGET,
    PERMISSION_DENIED: TARGET,
    CWD_NOT_FOUND: USAGE,
    NAME_TAKEN: USAGE,
    ENGINE_EXITED: FAILURE,
    SPAWN_TIMEOUT: TIMEOUT,
    TRUST_FILE_ERROR: CONFIG,
    ADAPTER_REFUSED: REFUSAL,
    ADAPTER_FAILED: FAILURE,
    ADAPTER_CRASHED: FAILURE,
    ADAPTER_TIMEOUT: FAILURE,
    ADAPTER_MISSING: FAILURE,
    INTERNAL_ERROR: INTERNAL,
}

# Failures after the request left: the host may have acted on it, so the message's fate is unknown and it is
# never retried blindly.
INDETERMINATE = frozenset(
    [CONNECTION_LOST, REQUEST_TIMEOUT, PASTE_UNCERTAIN, INTERRUPTED, QUEUE_TIMEOUT, ADAPTER_CRASHED, ADAPTER_TIMEOUT]
)

# Claude Code's drop reasons (hyphenated on the wire) as drover's codes.
DROP_REASONS = {
    "duplicate": DUPLICATE,
    "rate-limited": RATE_LIMITED,
    "hop-loop": HOP_LOOP,
    "hop-runaway": HOP_RUNAWAY,
    "queue-full": QUEUE_FULL,
}


class HelperError(Exception):
    """An error with a stable code, reported in the answer instead of a traceback."""

    def __init__(self, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.extra = extra
