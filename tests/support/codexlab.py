"""The real Codex CLI, offline, in tmux panes, with a fake Responses API beside it (shared/design/codex.md).

The CLI comes from npm (@openai/codex@0.169.0), installed once into ~/.cache/drover-test/ and reused.

A lab is one HOME (= CODEX_HOME's parent) and one network namespace that has only a loopback. The fake model
(tests/support/fake_responses.py) is the namespace's first process; every Codex process of the lab (the TUIs in their
panes, the app-server daemon they start, `codex queue`) joins that namespace, so nothing Codex does can reach a
real address, and all of it talks to the same fake, which is what Codex needs: the TUI does not own its session,
a per-CODEX_HOME app-server daemon does, and it makes the model requests for every TUI of that CODEX_HOME.
Behaviour of the fake is lab-wide (`lab.set_control(...)`); a test that needs two behaviours makes two labs.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:  # imported as tests.X by pytest, as X by scripts/test.sh
    from tests.support.npmcache import START_S, cache_root, npm_install
except ImportError:
    from npmcache import START_S, cache_root, npm_install  # type: ignore[no-redef]

VERSION = "0.169.0"
PACKAGE = f"@openai/codex@{VERSION}"
HERE = Path(__file__).resolve().parent
PORT = 8766
WIDTH, HEIGHT = 160, 40
# The composer's placeholder: shown only while the input region is empty.
PLACEHOLDER = "Ask Codex to do anything"
# The footer of a ready, idle composer with nothing typed in it.
READY = "for agents · ? for shortcuts"


def cache_dir() -> Path:
    return cache_root() / f"codex-{VERSION}"


def binary_path() -> Path:
    """The npm launcher (node script), as a user's `codex` on PATH is: it runs the native binary as its child."""
    return cache_dir() / "node_modules" / ".bin" / "codex"


def _ns_prefix(pid: int) -> list[str]:
    """The argv prefix that runs a command inside the namespace whose first process is pid."""
    if os.geteuid() == 0:
        return ["nsenter", "-t", str(pid), "-n", "--"]
    return ["nsenter", "-t", str(pid), "-U", "-n", "--preserve-credentials", "--"]


def _unshare() -> list[str]:
    return ["unshare", "-n"] if os.geteuid() == 0 else ["unshare", "-r", "-n"]


@contextmanager
def module_lab(prefix: str) -> Iterator[CodexLab]:
    """One lab for a test module (one CODEX_HOME, one app-server daemon, one fake model: starting them is the slow
    part); a module's tests each start their own panes.  CI must run against the real Codex CLI: elsewhere a machine
    that cannot run it skips."""
    import pytest

    binary, why = ensure_binary()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the tests against the real Codex CLI, but: {why}")
        pytest.skip(f"the real Codex CLI cannot run here: {why}")
    root = Path(tempfile.mkdtemp(prefix=prefix))  # short: Unix socket paths live under it
    lab = CodexLab(root, binary)
    try:
        yield lab
    finally:
        lab.close()
        shutil.rmtree(root, ignore_errors=True)


def ensure_binary() -> tuple[Path | None, str]:
    """(path to the codex launcher, "") or (None, why it cannot run here)."""
    path = binary_path()
    why = npm_install(PACKAGE, cache_dir(), path)
    if why:
        return None, why
    for tool in ("tmux", "unshare", "nsenter", "ip"):
        if not shutil.which(tool):
            return None, f"{tool} is not installed"
    try:
        version = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{path} --version did not run: {exc}"
    if VERSION not in version.stdout:
        return None, f"{path} --version says {version.stdout.strip()!r} {version.stderr.strip()[-300:]!r}"
    probe = subprocess.run([*_unshare(), "sh", "-c", "ip link set lo up"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return None, f"unshare -n does not work here (needs root or user namespaces): {probe.stderr.strip()}"
    return path, ""


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def wait_for(cond: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def message_texts(item: dict[str, Any]) -> list[str]:
    return [str(p.get("text", "")) for p in item.get("content") or [] if isinstance(p, dict) and "text" in p]


# ---------------------------------------------------------------------------------------------------------------
# Reading a Codex screen: the profile proposed for drover (issues 8 and 10), as data, and the reading it implies
# ---------------------------------------------------------------------------------------------------------------

# Every Codex dialog (approval, trust, login, the warnings view, pickers) replaces the composer and draws its key
# hints on the screen's last non-empty line; the composer's footer never says these. So dialogs are read from the
# last line only, and a history line such as `› 1. fix the flaky test` cannot look like a menu.
PROPOSED_PROFILE: dict[str, Any] = {
    "dialog": [
        r"Press enter to confirm or esc to cancel",  # command / edits / permissions approval
        r"\benter (to )?continue\b",  # trust ("enter continue · esc back"), login ("Press enter to continue")
        r"\besc (to )?(back|cancel|dismiss|close)\b",  # other overlays (f2 warnings view: "esc dismiss & close")
        r"Press Enter to\b",
    ],
    "dialog_scope": "last_line",
    # The status line above the composer: "• Working (12s • esc to interrupt)"; the header word varies.
    "busy": [r"^[•◦]\s.*\(\d[\dhms ]*• esc to interrupt\)\s*$"],
    # The composer's footer when nothing is typed: "← for agents · ? for shortcuts" (just "? for shortcuts"
    # while the app-server is still starting; typed input is kept and submitted once it is ready).
    "idle": [r"\? for shortcuts"],
    "default_state": "unknown",
}
# The input region is the last line that starts with "› " and the lines indented under it, down to the blank
# line above the status line ("mock-model default · /cwd"). It is empty when it shows a placeholder (drawn dim)
# and the footer still offers "? for shortcuts": any draft removes that hint (idle: the footer's left side goes
# blank; busy: it says "tab to queue message"), even a draft whose text is a placeholder's.
COMPOSER = re.compile(r"^› (.*)$")
PLACEHOLDERS = ("Ask Codex to do anything", "Ask a follow-up question")
EMPTY_FOOTER = re.compile(r"\? for shortcuts")


def read_screen(screen: str, profile: dict[str, Any] | None = None) -> dict[str, Any]:
    """{"state": dialog|busy|idle|unknown, "draft": text in the composer or None, "reason": the deciding line}."""
    prof = profile or PROPOSED_PROFILE
    lines = [line.rstrip() for line in screen.replace("\r\n", "\n").split("\n")]
    nonempty = [line for line in lines if line.strip()]
    last = nonempty[-1] if nonempty else ""
    scope = [last] if prof.get("dialog_scope") == "last_line" else lines
    for line in scope:
        if any(re.search(rx, line) for rx in prof["dialog"]):
            return {"state": "dialog", "draft": None, "reason": line.strip()}
    starts = [i for i, line in enumerate(lines) if COMPOSER.match(line)]
    if not starts:
        return {"state": "unknown", "draft": None, "reason": "no composer on screen"}
    first = starts[-1]
    region = [COMPOSER.match(lines[first]).group(1)]  # type: ignore[union-attr]
    for line in lines[first + 1 :]:
        if not line.startswith("  ") or not line.strip():
            break
        region.append(line[2:])
    text = "\n".join(region).strip()
    empty = text in PLACEHOLDERS and bool(EMPTY_FOOTER.search(last))
    busy = next((line for line in lines if any(re.search(rx, line) for rx in prof["busy"])), None)
    if busy is not None:
        return {"state": "busy", "draft": None if empty else text, "reason": busy.strip()}
    if any(re.search(rx, last) for rx in prof["idle"]) or not empty:
        return {"state": "idle", "draft": None if empty else text, "reason": last.strip()}
    return {"state": prof.get("default_state", "unknown"), "draft": None, "reason": "no footer recognised"}


def mcp_servers(config: str) -> list[str]:
    """The `[mcp_servers.*]` tables of a config.toml, as lines: what `codex mcp add` registered, which the lab's
    own rewrite of the file (each start trusts one more folder) keeps."""
    out: list[str] = []
    keep = False
    for line in config.splitlines():
        if line.startswith("["):
            keep = line.startswith("[mcp_servers.")
            if keep:
                out.append("")
        if keep:
            out.append(line)
    return out


# ---------------------------------------------------------------------------------------------------------------
# The app-server daemon: JSON-RPC over a WebSocket on its Unix control socket
# ---------------------------------------------------------------------------------------------------------------


def app_server(sock: Path, calls: list[tuple[str, dict[str, Any]]], timeout: float = 10.0) -> list[dict[str, Any]]:
    """Call the app-server daemon (initialize first), return the answers in order. Stdlib only.

    The control socket speaks WebSocket (HTTP upgrade, then text frames, each one JSON-RPC message without the
    "jsonrpc" member). `codex app-server proxy` only pipes raw bytes to it, so a client must frame itself.
    """
    conn = socket.socket(socket.AF_UNIX)
    conn.settimeout(timeout)
    conn.connect(str(sock))
    key = base64.b64encode(os.urandom(16)).decode()
    conn.sendall(
        (
            "GET / HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError("app-server closed the connection during the upgrade")
        buf += chunk
    head, buf = buf.split(b"\r\n\r\n", 1)
    if b" 101 " not in head.split(b"\r\n")[0]:
        raise ConnectionError(f"app-server refused the upgrade: {head[:200]!r}")

    def send(message: dict[str, Any]) -> None:
        data = json.dumps(message).encode()
        mask = os.urandom(4)
        if len(data) < 126:
            header = bytes([0x81, 0x80 | len(data)])
        elif len(data) < 65536:
            header = bytes([0x81, 0x80 | 126]) + struct.pack(">H", len(data))
        else:
            header = bytes([0x81, 0x80 | 127]) + struct.pack(">Q", len(data))
        conn.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def frame() -> tuple[int, bytes]:
        nonlocal buf

        def need(n: int) -> None:
            nonlocal buf
            while len(buf) < n:
                chunk = conn.recv(65536)
                if not chunk:
                    raise ConnectionError("app-server closed the connection")
                buf += chunk

        need(2)
        size, offset = buf[1] & 0x7F, 2
        if size == 126:
            need(4)
            size, offset = struct.unpack(">H", buf[2:4])[0], 4
        elif size == 127:
            need(10)
            size, offset = struct.unpack(">Q", buf[2:10])[0], 10
        need(offset + size)
        opcode, payload, buf = buf[0] & 0x0F, buf[offset : offset + size], buf[offset + size :]
        return opcode, payload

    try:
        send({"id": 0, "method": "initialize", "params": {"clientInfo": {"name": "drover-tests", "version": "0"}}})
        send({"method": "initialized"})
        for n, (method, params) in enumerate(calls, 1):
            send({"id": n, "method": method, "params": params})
        answers: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + timeout
        while len(answers) < len(calls) + 1 and time.monotonic() < deadline:
            opcode, payload = frame()
            if opcode != 1:
                continue
            message = json.loads(payload)
            if isinstance(message.get("id"), int) and ("result" in message or "error" in message):
                answers[message["id"]] = message
        return [answers.get(n, {"error": "no answer"}) for n in range(1, len(calls) + 1)]
    finally:
        conn.close()


@dataclass
class CodexSession:
    lab: CodexLab
    name: str
    cwd: Path
    pane: str
    thread_id: str = ""

    # -- the screen ----------------------------------------------------------------------------------------
    def screen(self) -> str:
        return self.lab.tmux("capture-pane", "-p", "-t", self.pane)

    def title(self) -> str:
        return self.lab.tmux("display-message", "-p", "-t", self.pane, "#{pane_title}").strip()

    def wait_screen(self, pattern: str, timeout: float = 30.0, absent: bool = False) -> str:
        """The screen once `pattern` (a regex, multiline) shows on it (or, with absent, once it is gone)."""
        rx = re.compile(pattern, re.M)

        def check() -> str | None:
            screen = self.screen()
            return screen if bool(rx.search(screen)) != absent else None

        try:
            return str(wait_for(check, timeout, f"{pattern!r} {'to go' if absent else 'on screen'}"))
        except AssertionError as exc:
            raise AssertionError(f"{exc}; {self.name}'s screen:\n{self.screen()}") from None

    def wait_idle(self, timeout: float = 30.0) -> str:
        """Ready, idle and empty: the placeholder in the composer, the full footer, no turn running.

        Codex draws its composer within a second, while its app-server is still starting: the footer then says
        only `? for shortcuts` (input typed then is submitted once it is ready). Ready adds `← for agents`.
        """

        def check() -> str | None:
            screen = self.screen()
            ready = PLACEHOLDER in screen and READY in screen and "esc to interrupt" not in screen
            return screen if ready else None

        try:
            return str(wait_for(check, timeout, "an idle empty composer"))
        except AssertionError as exc:
            raise AssertionError(f"{exc}; {self.name}'s screen:\n{self.screen()}") from None

    # -- keys ----------------------------------------------------------------------------------------------
    def paste(self, text: str) -> None:
        """A bracketed paste, as drover's tmux lane does it."""
        buf = f"codexlab-{os.getpid()}-{time.monotonic_ns()}"
        self.lab.tmux("load-buffer", "-b", buf, "-", stdin=text)
        self.lab.tmux("paste-buffer", "-p", "-r", "-d", "-b", buf, "-t", self.pane)

    def keys(self, *keys: str) -> None:
        self.lab.tmux("send-keys", "-t", self.pane, *keys)

    def submit(self, text: str, key: str = "Enter") -> None:
        """Paste text, wait until the composer shows it, then press Enter (or Tab) on its own."""
        self.paste(text)
        probe = text.strip().splitlines()[0][:40] if len(text) < 1000 else "[Pasted Content"

        def shown() -> bool:
            return probe in (read_screen(self.screen())["draft"] or "")

        try:
            wait_for(shown, 15, f"{probe!r} in the composer")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; {self.name}'s screen:\n{self.screen()}") from None
        time.sleep(0.3)
        self.keys(key)

    # -- Codex's own record ----------------------------------------------------------------------------------
    def rollout_path(self) -> Path | None:
        if not self.thread_id:
            return None
        found = sorted((self.lab.codex_home / "sessions").glob(f"*/*/*/rollout-*-{self.thread_id}.jsonl"))
        return found[-1] if found else None

    def rollout(self) -> list[dict[str, Any]]:
        path = self.rollout_path()
        return read_jsonl(path) if path else []

    def user_messages(self) -> list[str]:
        """The user messages of the rollout, as the model got them (Codex's own injected context left out)."""
        out = []
        for row in self.rollout():
            item = row.get("payload") or {}
            if row.get("type") == "response_item" and item.get("type") == "message" and item.get("role") == "user":
                text = "\n".join(message_texts(item))
                if text.lstrip().startswith(("<environment_context>", "<user_instructions>", "# AGENTS.md", "<permissions")):
                    continue
                out.append(text)
        return out

    def find_thread(self, timeout: float = 30.0) -> str:
        """The thread id of this pane's session, from the rollout whose session_meta names this cwd."""

        def look() -> str | None:
            for path in sorted((self.lab.codex_home / "sessions").glob("*/*/*/rollout-*.jsonl")):
                rows = read_jsonl(path)[:1]
                meta = rows[0].get("payload", {}) if rows and rows[0].get("type") == "session_meta" else {}
                if meta.get("cwd") == str(self.cwd):
                    return str(meta.get("id") or "")
            return None

        self.thread_id = str(wait_for(look, timeout, f"a rollout for {self.cwd}"))
        return self.thread_id


class CodexLab:
    def __init__(self, root: Path, binary: Path) -> None:
        self.root = root
        self.binary = binary
        # The lab's own tmux server, by socket path: it outlives a test's $TMUX_TMPDIR, so a lab can serve a module.
        self.socket = root / "tmux.sock"
        self.home = root / "home"
        self.codex_home = self.home / ".codex"
        self.control = root / "control.json"
        self.requests = root / "requests.jsonl"
        self.codex_home.mkdir(parents=True, exist_ok=True)
        self.sessions: list[CodexSession] = []
        self.fake: subprocess.Popen[bytes] | None = None
        self.set_control()
        self._start_fake()

    # -- plumbing ------------------------------------------------------------------------------------------
    def tmux(self, *args: str, stdin: str | None = None) -> str:
        proc = subprocess.run(["tmux", "-S", str(self.socket), *args], input=stdin, capture_output=True, text=True, timeout=10)
        return proc.stdout

    def env(self) -> dict[str, str]:
        """For codex subcommands run by the test: the test's environment with the lab's HOME."""
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("CODEX_", "OPENAI_", "TMUX"))}
        return dict(keep, HOME=str(self.home), CODEX_HOME=str(self.codex_home), OPENAI_API_KEY="sk-dummy")

    def pane_env(self, path: str | None = None) -> str:
        """`env` arguments for a pane: tmux's environment (TERM, TMUX, TMUX_PANE, as a user's pane has) and ours.

        `path`: the pane's PATH (where a person's shell would find `codex`), else the test's."""
        unset = [k for k in os.environ if k.startswith(("CODEX_", "OPENAI_"))] + ["CODEX_HOME", "OPENAI_BASE_URL"]
        sets = {"HOME": str(self.home), "CODEX_HOME": str(self.codex_home), "OPENAI_API_KEY": "sk-dummy"}
        if path is not None:
            sets["PATH"] = path
        return " ".join([*(f"-u {k}" for k in sorted(set(unset))), *(f"{k}={shlex.quote(v)}" for k, v in sets.items())])

    def set_control(self, **values: Any) -> None:
        self.control.write_text(json.dumps(values))

    def _start_fake(self) -> None:
        fake = [sys.executable, str(HERE / "fake_responses.py"), "--port", str(PORT)]
        fake += ["--log", str(self.requests), "--control", str(self.control)]
        with open(self.root / "fake.err", "wb") as err:
            self.fake = subprocess.Popen(
                [*_unshare(), "sh", "-c", f"ip link set lo up && exec {shlex.join(fake)}"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
            )
        connect = f"import socket; socket.create_connection(('127.0.0.1', {PORT}), 1)"
        probe = [*_ns_prefix(self.fake.pid), sys.executable, "-c", connect]
        up = lambda: subprocess.run(probe, capture_output=True, timeout=60).returncode == 0  # noqa: E731
        wait_for(up, START_S, "the fake Responses API")

    def write_config(self, trusted: list[Path], *, approval: str = "on-request", sandbox: str = "workspace-write") -> None:
        lines = [
            'model = "mock-model"',
            'model_provider = "mock"',
            f'approval_policy = "{approval}"',
            f'sandbox_mode = "{sandbox}"',
            "check_for_update_on_startup = false",
            "",
            "[model_providers.mock]",
            'name = "mock"',
            f'base_url = "http://127.0.0.1:{PORT}/v1"',
            'wire_api = "responses"',
            "requires_openai_auth = false",
            "request_max_retries = 0",
            "stream_max_retries = 0",
            "",
            "[analytics]",
            "enabled = false",
        ]
        for path in trusted:
            lines += ["", f"[projects.{json.dumps(str(path))}]", 'trust_level = "trusted"']
        config = self.codex_home / "config.toml"
        kept = mcp_servers(config.read_text()) if config.exists() else []
        config.write_text("\n".join(lines + kept) + "\n")

    def requests_log(self) -> list[dict[str, Any]]:
        return read_jsonl(self.requests)

    def turns(self) -> list[dict[str, Any]]:
        """The logged model requests that were turns (they carry tools)."""
        return [r for r in self.requests_log() if isinstance(r.get("body"), dict) and r["body"].get("tools")]

    def inputs_of(self, request: dict[str, Any]) -> list[str]:
        """The user texts of one logged request, in order."""
        out = []
        for item in request["body"].get("input") or []:
            if isinstance(item, dict) and item.get("role") == "user":
                out.extend(message_texts(item))
        return out

    # -- sessions ------------------------------------------------------------------------------------------
    def start(
        self,
        name: str,
        *,
        trust: bool = True,
        git: bool = False,
        flags: str = "",
        wait: bool = True,
        approval: str = "on-request",
        sandbox: str = "workspace-write",
        path: str | None = None,
    ) -> CodexSession:
        """A Codex TUI in a new tmux session (160x40) in a fresh folder; trusted unless trust=False; `path`: its PATH."""
        cwd = self.root / name
        cwd.mkdir()
        if git:
            subprocess.run(["git", "init", "-q", str(cwd)], check=True, timeout=30)
        trusted = [s.cwd for s in self.sessions] + ([cwd] if trust else [])
        self.write_config(trusted, approval=approval, sandbox=sandbox)
        assert self.fake is not None
        ns = " ".join(_ns_prefix(self.fake.pid))
        command = f"exec {ns} env {self.pane_env(path)} {shlex.quote(str(self.binary))} {flags}"
        size = ["-x", str(WIDTH), "-y", str(HEIGHT)]
        new = ["new-session", "-d", "-P", "-F", "#{pane_id}", "-s", name, *size, "-c", str(cwd), command]
        proc = subprocess.run(["tmux", "-S", str(self.socket), *new], capture_output=True, text=True, timeout=10)
        assert proc.returncode == 0, proc.stderr
        session = CodexSession(self, name, cwd, proc.stdout.strip())
        self.tmux("set-option", "-t", name, "remain-on-exit", "on")
        self.sessions.append(session)
        if wait:
            session.wait_idle(timeout=START_S)
        return session

    def codex(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run a codex subcommand (e.g. queue) with the lab's HOME, inside the lab's namespace."""
        assert self.fake is not None
        return subprocess.run(
            [*_ns_prefix(self.fake.pid), str(self.binary), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env(),
            cwd=str(self.root),
        )

    def daemon_pids(self) -> list[int]:
        """The app-server daemon and its helper, from their pid files ({"pid": N, ...})."""
        pids = []
        for path in self.codex_home.glob("app-server-daemon/*.pid"):
            try:
                pids.append(int(json.loads(path.read_text())["pid"]))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return pids

    def close(self) -> None:
        self.tmux("kill-server")
        for pid in self._lab_processes():
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                continue
        if self.fake is not None:
            try:
                os.killpg(self.fake.pid, signal.SIGTERM)
            except OSError:
                pass
            try:
                self.fake.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.fake.kill()
        time.sleep(0.2)
        for pid in self._lab_processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue

    def _lab_processes(self) -> Iterator[int]:
        """Codex processes of this lab (the daemon outlives its panes): those whose CODEX_HOME is ours."""
        mine = f"CODEX_HOME={self.codex_home}".encode()
        yield from self.daemon_pids()
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == os.getpid():
                continue
            try:
                with open(f"/proc/{name}/environ", "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            if mine in env:
                yield int(name)


# ---------------------------------------------------------------------------------------------------------------
# Capturing the screens drover's codex profile is tested against: python -m tests.support.codexlab [DEST]
# ---------------------------------------------------------------------------------------------------------------


def capture_screens(dest: Path, binary: Path, root: Path) -> dict[str, str]:
    """Drive a lab through the states drover must recognise and write each screen to dest/codex-real-*.txt."""
    shots: dict[str, str] = {}
    dest.mkdir(parents=True, exist_ok=True)

    def shot(name: str, screen: str) -> None:
        shots[name] = screen
        (dest / f"codex-real-{name}.txt").write_text(screen, encoding="utf-8")

    lab = CodexLab(root, binary)
    try:
        s = lab.start("webapp", wait=False)
        shot("starting", s.wait_screen(r"^  \? for shortcuts", timeout=START_S))
        shot("idle", s.wait_idle(timeout=START_S))
        s.paste("a human draft, not sent")
        shot("idle-with-draft", s.wait_screen(r"^› a human draft, not sent"))
        s.keys("C-u")
        s.wait_idle()
        s.paste("x" * 2000)
        shot("idle-with-pasted-draft", s.wait_screen(r"\[Pasted Content 2000 chars\]"))
        s.keys("C-u")
        s.wait_idle()

        lab.set_control(hold=True)
        s.submit("start a slow turn")
        shot("busy", s.wait_screen(r"esc to interrupt\)"))
        s.paste("a human draft while busy")
        shot("busy-with-draft", s.wait_screen(r"tab to queue message"))
        s.keys("C-u")
        s.wait_screen(PLACEHOLDER)
        lab.set_control()
        s.wait_idle()

        s.submit("1. fix the flaky test")
        s.wait_screen(r"^› 1\. fix the flaky test\s*\n\s*• Understood\.", timeout=30)
        shot("idle-history-numbered-prompt", s.wait_idle())

        lab.set_control(shell={"command": "rm -rf build"})
        s.submit("please clean the build")
        shot("approval-dialog", s.wait_screen(r"Press enter to confirm or esc to cancel"))
        s.keys("Escape")
        lab.set_control()
        s.wait_screen(r"Conversation interrupted")
        # Interrupting a turn may put its prompt back into the composer, as a draft: clear it.
        time.sleep(0.5)
        s.keys("C-u")
        s.wait_idle()

        t = lab.start("newrepo", trust=False, git=True, wait=False)
        shot("trust-dialog", t.wait_screen(r"Trust this folder\?", timeout=START_S))
    finally:
        lab.close()
    return shots


if __name__ == "__main__":
    import tempfile

    found, why = ensure_binary()
    if found is None:
        sys.exit(f"codex cannot run here: {why}")
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parent / "screens"
    lab_root = Path(tempfile.mkdtemp(prefix="dcx-"))
    try:
        for shot_name in capture_screens(out, found, lab_root):
            print(out / f"codex-real-{shot_name}.txt")
    finally:
        shutil.rmtree(lab_root, ignore_errors=True)
