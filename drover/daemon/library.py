"""The library's way into a running daemon: `drover op NAME JSON` asked over its socket, on the caller's loop.

The same conversation as the `drover` front's (drover/daemon/client.py), but asynchronous and captured: what the
command prints is the op's document, not text for a terminal.  A script that calls drover.run gets the daemon's
pooled SSH connections without any setup; when no daemon answers, or one refuses (another environment, a stale
version), the caller runs the op itself and nothing was done twice.  A daemon that dies after the op may have had
an effect is never worked around: the answer says so, with the message ids the daemon had recorded.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
import time
from typing import Any

from drover import paths
from drover.daemon import client, wire
from drover.errors import ExitCode
from drover.remote import protocol as P


class Refused(Exception):
    """Nothing was done: the caller runs the op itself."""


def request_text(payload: dict[str, Any]) -> str:
    """The request as the daemon's `drover op` reads it; Refused unless it reads back exactly as given.

    A direct run hands the op the caller's Python objects (a set, bytes, a huge int, a lone surrogate...), and
    the op answers each with a document; JSON would fail on some of them here (a raise) or change them on the
    way (a different answer).  Such a request runs here, so the answer is the same with or without a daemon."""
    try:
        text = json.dumps(payload, ensure_ascii=False, allow_nan=False)
        text.encode("utf-8")  # a lone surrogate cannot travel
        same = json.loads(text) == payload
    except (TypeError, ValueError, RecursionError):
        same = False
    if not same:
        raise Refused("the request does not travel as JSON unchanged")
    return text


def argv_of(name: str, payload: dict[str, Any], fleet: str | None, actor: str | None) -> list[str]:
    argv = ["op", name, request_text(payload)]
    if fleet is not None:
        argv += ["--fleet", fleet]  # resolved against the cwd sent along, as a direct run resolves it
    if actor is not None:
        argv += ["--actor", actor]
    return argv


async def _open(path: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the daemon at `path`, checked as the front checks it: our directory, a peer running as us."""
    try:
        paths.check_dir(os.path.dirname(path))
        reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(path, limit=wire.MAX_LINE), client.CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError, paths.Unsafe) as exc:
        raise Refused(f"no daemon answers at {path}: {exc}") from None
    sock = writer.get_extra_info("socket")
    try:
        cred = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        uid = struct.unpack("3i", cred)[1]
    except OSError:
        uid = -1
    if uid != os.getuid():
        writer.close()
        raise Refused(f"the process listening on {path} does not run as you")
    return reader, writer


async def run(name: str, payload: dict[str, Any], fleet: str | None, actor: str | None) -> tuple[dict[str, Any], int]:
    """(the op's document, its exit code) from the daemon; Refused when the caller must run it (nothing was done)."""
    argv = argv_of(name, payload, fleet, actor)  # before connecting: a request that cannot travel runs here
    env = paths.environment()
    reader, writer = await _open(paths.socket_path(env))
    try:
        try:
            cwd: str | None = os.getcwd()
        except OSError:
            cwd = None
        request = {
            "t": "run",
            "v": wire.VERSION,
            "argv": argv,
            "cwd": cwd,
            "env": env,
            "actor": os.environ.get("DROVER_ACTOR"),
            "tty": {"stdin": False, "stdout": False, "stderr": False},
            "cols": 80,
            "term": {},
            "deadline": time.time() + client.START_TIMEOUT_S - 1.0,
        }
        writer.write(wire.encode(request))
        try:
            return await _Talk(name).follow(reader, writer)
        except asyncio.CancelledError:
            # The caller cancelled (its Ctrl-C): said, so the daemon cancels the command; a connection that merely
            # closes is a caller that died, whose send on its way the daemon finishes and records.
            writer.write(wire.encode({"t": "interrupt"}))
            raise
    finally:
        writer.close()


class _Talk:
    def __init__(self, name: str) -> None:
        self.name = name
        self.started = False
        self.accepting = False
        self.accepted: list[str] = []
        self.out: list[str] = []
        self.err: list[str] = []

    async def follow(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[dict[str, Any], int]:
        while True:
            bound = client.SILENCE_TIMEOUT_S if self.started else client.START_TIMEOUT_S
            try:
                line = await asyncio.wait_for(reader.readline(), bound)
            except (TimeoutError, OSError, ValueError, asyncio.LimitOverrunError):
                line = b""  # silent (stopped, wedged) or gone: the same to us
            if not line.endswith(b"\n"):
                return self.lost()
            try:
                msg = wire.decode(line)
            except ValueError:
                return self.lost()
            kind = msg.get("t")
            if kind == "started":
                self.started = True
            elif kind == "out":
                self.out.append(str(msg.get("d", "")))
            elif kind == "err":
                self.err.append(str(msg.get("d", "")))
            elif kind == "accepting":
                self.accepting = True
            elif kind == "accepted":
                self.accepted.append(str(msg.get("id")))
            elif kind == "stdin?":
                # The request travels in argv, so this does not happen; were it to, nothing was done yet.
                if self.started and (self.accepting or self.accepted):
                    return self.lost()
                raise Refused("the daemon asked for stdin")
            elif kind == "refuse":
                if self.started:
                    return self.lost()
                raise Refused(str(msg.get("why", "refused")))
            elif kind == "exit":
                return self.document(int(msg.get("code", ExitCode.INTERNAL)))

    def document(self, code: int) -> tuple[dict[str, Any], int]:
        text = "".join(self.out)
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None
        if isinstance(doc, dict) and "ok" in doc and "data" in doc:
            return doc, code
        # No document: the daemon's command failed before it could print one (an internal error, said on stderr).
        why = "".join(self.err).strip() or f"the daemon's `drover op {self.name}` printed no document (exit {code})"
        return self.failed(why, code if code else ExitCode.INTERNAL, P.INTERNAL_ERROR)

    def failed(self, message: str, code: int, error: str) -> tuple[dict[str, Any], int]:
        doc = {"drover": 1, "op": self.name, "ok": False, "data": None, "errors": [{"code": error, "message": message}]}
        return doc, code

    def lost(self) -> tuple[dict[str, Any], int]:
        """The daemon went away before it answered: the caller runs the op only if that cannot do anything twice."""
        if self.accepted:
            ids = ", ".join(self.accepted)
            return self.failed(
                f"the daemon stopped while sending {ids}: it may or may not have arrived (messages.retry with its id "
                "looks for it before it sends it again; never twice)",
                ExitCode.FAILED,
                P.CONNECTION_LOST,
            )
        if self.accepting:
            return self.failed(
                "the daemon stopped while recording a message: nothing was delivered, and it is not sent again "
                "(messages.list with pending shows it if it was recorded)",
                ExitCode.FAILED,
                P.CONNECTION_LOST,
            )
        if not self.started or self.name in client.RERUN_SAFE_OPS:
            raise Refused("the daemon stopped before it answered")
        return self.failed(
            f"the daemon stopped while running {self.name}: not run again, as it may have had effects",
            ExitCode.FAILED,
            P.CONNECTION_LOST,
        )
