"""Codex's app-server daemon, asked directly: JSON-RPC over a WebSocket on its Unix control socket (stdlib only).

Codex 0.169's TUI does not own its session: a daemon per CODEX_HOME does, and only it knows which threads are
loaded and whether each is idle, running a turn or waiting on its human.  `codex app-server proxy` just pipes raw
bytes to that socket, so drover frames the WebSocket itself (a client masks its frames; the server does not).
Every call is bounded by a deadline: a daemon that stopped answering costs at most that, never a hang.
"""

import base64
import json
import os
import socket
import struct
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

SOCKET = os.path.join("app-server-control", "app-server-control.sock")


class AppServerError(Exception):
    """No answer from the daemon: no socket, nobody listening, a refused upgrade, or the deadline passed."""


def control_socket(home: str) -> str:
    return os.path.join(home, SOCKET)


def _frame(data: bytes) -> bytes:
    mask = os.urandom(4)
    if len(data) < 126:
        header = bytes([0x81, 0x80 | len(data)])
    elif len(data) < 65536:
        header = bytes([0x81, 0x80 | 126]) + struct.pack(">H", len(data))
    else:
        header = bytes([0x81, 0x80 | 127]) + struct.pack(">Q", len(data))
    return header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data))


class _Reader:
    def __init__(self, conn: socket.socket, deadline: float, buf: bytes) -> None:
        self.conn, self.deadline, self.buf = conn, deadline, buf

    def need(self, n: int) -> None:
        while len(self.buf) < n:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise AppServerError("the app-server did not answer in time")
            self.conn.settimeout(left)
            chunk = self.conn.recv(65536)
            if not chunk:
                raise AppServerError("the app-server closed the connection")
            self.buf += chunk

    def frame(self) -> Tuple[int, bytes]:
        self.need(2)
        size, offset = self.buf[1] & 0x7F, 2
        if size == 126:
            self.need(4)
            size, offset = struct.unpack(">H", self.buf[2:4])[0], 4
        elif size == 127:
            self.need(10)
            size, offset = struct.unpack(">Q", self.buf[2:10])[0], 10
        self.need(offset + size)
        opcode, payload = self.buf[0] & 0x0F, self.buf[offset : offset + size]
        self.buf = self.buf[offset + size :]
        return opcode, payload


def call(
    home: str,
    calls: List[Tuple[str, Dict[str, Any]]],
    timeout: float = 3.0,
    then: Optional[Callable[[List[Dict[str, Any]]], List[Tuple[str, Dict[str, Any]]]]] = None,
) -> List[Dict[str, Any]]:
    """Initialize, make the calls, return each one's answer ({"result": ...} or {"error": ...}) in order.

    `then`: given those answers, the calls to make next on the same connection (their answers follow in the list):
    a daemon busy with a turn takes ~10 ms per connection (its upgrade and initialize), and discovery's second
    question depends on the first's answer."""
    path = control_socket(home)
    if not os.path.exists(path):
        raise AppServerError("no app-server control socket at %s" % path)
    deadline = time.monotonic() + timeout
    conn = socket.socket(socket.AF_UNIX)
    try:
        conn.settimeout(timeout)
        conn.connect(path)
        key = base64.b64encode(os.urandom(16)).decode()
        upgrade = (
            "GET / HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n" % key
        )
        conn.sendall(upgrade.encode())
        reader = _Reader(conn, deadline, b"")
        while b"\r\n\r\n" not in reader.buf:
            reader.need(len(reader.buf) + 1)
        head, reader.buf = reader.buf.split(b"\r\n\r\n", 1)
        if b" 101 " not in head.split(b"\r\n")[0]:
            raise AppServerError("the app-server refused the WebSocket upgrade: %r" % head[:120])
        client = {"name": "drover", "version": "1"}
        conn.sendall(_frame(json.dumps({"id": 0, "method": "initialize", "params": {"clientInfo": client}}).encode()))
        conn.sendall(_frame(json.dumps({"method": "initialized"}).encode()))
        answers = _exchange(conn, reader, calls, 1)
        if then is not None:
            more = then(answers)
            if more:
                answers += _exchange(conn, reader, more, len(calls) + 1)
        return answers
    except (OSError, ValueError) as exc:
        raise AppServerError("the app-server at %s did not answer: %s" % (path, exc)) from None
    finally:
        conn.close()


def _exchange(conn: socket.socket, reader: _Reader, calls: List[Tuple[str, Dict[str, Any]]], first: int) -> List[Dict[str, Any]]:
    """Send the calls numbered from `first`, and read until each has its answer (and, after the initialize, that
    one's too: id 0)."""
    for n, (method, params) in enumerate(calls, first):
        conn.sendall(_frame(json.dumps({"id": n, "method": method, "params": params}).encode()))
    wanted = set(range(first, first + len(calls))) | ({0} if first == 1 else set())
    answers: Dict[int, Dict[str, Any]] = {}
    while wanted - set(answers):
        opcode, payload = reader.frame()
        if opcode == 8:
            raise AppServerError("the app-server closed the connection")
        if opcode != 1:
            continue
        try:
            message = json.loads(payload.decode("utf-8", "replace"))
        except ValueError:
            continue
        if isinstance(message, dict) and isinstance(message.get("id"), int):
            if "result" in message or "error" in message:
                answers[message["id"]] = message
    return [answers[n] for n in range(first, first + len(calls))]
