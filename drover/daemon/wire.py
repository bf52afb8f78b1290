"""The daemon's wire format: one JSON object per line, both ways, over the Unix socket.  Standard library only.

Client -> daemon
    {"t": "run", "v": V, "argv": [...], "cwd": "...", "env": {...}, "actor": "..."|null,
     "tty": {"stdin": b, "stdout": b, "stderr": b}, "cols": N, "term": {"TERM": ..., ...},
     "deadline": EPOCH_S}               not to be started after this: the client has run it itself
    {"t": "stdin", "d": "..."}          the caller's stdin, sent only when the command asked for it
    {"t": "interrupt"}                  Ctrl-C: cancel the command (a connection that merely ends cancels it only
                                        before a message is recorded; after, the send runs to its real outcome)
    {"t": "status"} | {"t": "stop"}
Daemon -> client
    {"t": "refuse", "why": "..."}       not run, nothing done: the client runs the command itself
    {"t": "started"}                    the command runs from here on
    {"t": "out"|"err", "d": "..."}      what it printed, as it printed it
    {"t": "stdin?"}                     it reads stdin: send it
    {"t": "accepting"}                  a message is about to be recorded (write-ahead)...
    {"t": "accepted", "id": "msg_..."}  ...and was, and nothing was delivered before this line was sent
    {"t": "exit", "code": N}            done
    {"t": "status", ...}                answer to status

Text is JSON-escaped, so undecodable bytes (PEP 383 surrogates) and newlines travel intact.
"""

from __future__ import annotations

import json

VERSION = 1
MAX_LINE = 256 << 20  # a message of up to 1 MiB characters is at most 4 MiB of UTF-8, JSON-escaped 6x: ample


def encode(message: dict[str, object]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode("ascii") + b"\n"


def decode(line: bytes) -> dict:
    value = json.loads(line)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value
