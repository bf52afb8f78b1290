"""The real gemini-cli, offline, in tmux panes: each session in its own network namespace with a fake Gemini API
beside it (tests/support/fake_gemini.py), like tests/support/claudelab.py does for Claude Code.

The program comes from npm (@google/gemini-cli@0.61.0), installed once into ~/.cache/drover-test/ and reused. It
is started the way a global npm install starts it (`node …/node_modules/.bin/gemini`), so drover sees a `gemini`
command in the pane. gemini-cli reads its base URL from GOOGLE_GEMINI_BASE_URL and its key from GEMINI_API_KEY
(packages/core createContentGenerator); with `security.auth.selectedType = "gemini-api-key"` in settings.json it
asks nothing at start. Every session of one lab shares a HOME (so they share ~/.gemini, as a user's sessions do).

    python -m tests.support.geminilab capture tests/screens     # (re)make the gemini-*.txt captures
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:  # imported as tests.X by pytest, as X by scripts/test.sh
    from tests.support.npmcache import START_S, cache_root, npm_install
except ImportError:
    from npmcache import START_S, cache_root, npm_install  # type: ignore[no-redef]

VERSION = "0.61.0"
PACKAGE = f"@google/gemini-cli@{VERSION}"
HERE = Path(__file__).resolve().parent
PORT = 8766
WIDTH, HEIGHT = 160, 40
API_KEY = "dummy-gemini-key"
# The empty input box, as gemini draws it: ` >   Type your message or @path/to/file` (`*` instead of `>` in YOLO mode).
PLACEHOLDER = "Type your message or @path/to/file"
# Variables of the outer environment that would change how gemini authenticates or where it sends requests.
SCRUB = [
    # CI runs the suite with CI=true, and gemini-cli (like other ink programs) then renders nothing interactive.
    "CI",
    "CONTINUOUS_INTEGRATION",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "GOOGLE_GEMINI_BASE_URL",
    "GOOGLE_VERTEX_BASE_URL",
    "GOOGLE_GENAI_USE_VERTEXAI",
    "GOOGLE_GENAI_USE_GCA",
    "GOOGLE_CLOUD_PROJECT",
    "GOOGLE_CLOUD_LOCATION",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GEMINI_MODEL",
    "GEMINI_CLI_HOME",
    "GEMINI_CLI_SYSTEM_SETTINGS_PATH",
    "GEMINI_CLI_TRUSTED_FOLDERS_PATH",
    "GEMINI_CLI_TRUST_WORKSPACE",
    "GEMINI_DEFAULT_AUTH_TYPE",
    "GEMINI_SANDBOX",
    "HTTPS_PROXY",
    "HTTP_PROXY",
    "https_proxy",
    "http_proxy",
    "NO_COLOR",
    "TMUX_PANE",
]


def cache_dir() -> Path:
    return cache_root() / f"gemini-cli-{VERSION}"


def binary_path() -> Path:
    """The `gemini` command as npm links it (a symlink to bundle/gemini.js, run by node)."""
    return cache_dir() / "node_modules" / ".bin" / "gemini"


# Node 20 as a binary in the npm registry, for machines whose own node is older (Debian bookworm ships Node 18).
NODE_VERSION = "20.20.2"


def _node_major(node: str = "node") -> int:
    try:
        out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout
        return int(out.strip().lstrip("v").split(".")[0])
    except (OSError, ValueError, subprocess.SubprocessError):
        return 0


def node_binary() -> tuple[str | None, str]:
    """(the node to run gemini-cli with, "") or (None, why there is none): this machine's own when it is 20 or
    newer, else Node NODE_VERSION from the npm registry's `node-linux-*` package, installed once into the cache."""
    if shutil.which("node") and _node_major() >= 20:
        return "node", ""
    arch = {"x86_64": "x64", "aarch64": "arm64"}.get(os.uname().machine)
    if arch is None:
        return None, f"gemini-cli needs Node >= 20; this node is older and npm has no Node for {os.uname().machine}"
    prefix = cache_root() / f"node-{NODE_VERSION}"
    path = prefix / "node_modules" / f"node-linux-{arch}" / "bin" / "node"
    why = npm_install(f"node-linux-{arch}@{NODE_VERSION}", prefix, path)
    if why:
        return None, f"gemini-cli needs Node >= 20 and this node is older; {why}"
    if _node_major(str(path)) < 20:
        return None, f"{path} does not run"
    return str(path), ""


def ensure_binary() -> tuple[Path | None, str]:
    """(path to the `gemini` command, "") or (None, why it cannot run here)."""
    node, why = node_binary()
    if node is None:
        return None, why
    path = binary_path()
    why = npm_install(PACKAGE, cache_dir(), path)
    if why:
        return None, why
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return None, f"unshare -n does not work here (needs root or user namespaces): {probe.stderr.strip()}"
    if not shutil.which("tmux"):
        return None, "tmux is not installed"
    return path, ""


def wait_until(cond: Callable[[], Any], timeout: float, what: str, screen: Callable[[], str] | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            shown = f"; screen:\n{screen()}" if screen else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}{shown}")
        time.sleep(0.1)


@dataclass
class GeminiSession:
    lab: GeminiLab
    name: str
    cwd: Path
    pane: str
    control: Path
    requests: Path
    pid: int = 0  # the pane's process: gemini itself (unshare and sh exec into it)

    def set_control(self, **values: Any) -> None:
        self.control.write_text(json.dumps(values))

    def screen(self) -> str:
        return self.lab.tmux("capture-pane", "-p", "-t", self.pane)

    def title(self) -> str:
        return self.lab.tmux("display-message", "-p", "-t", self.pane, "#{pane_title}").strip()

    def keys(self, *keys: str) -> None:
        self.lab.tmux("send-keys", "-t", self.pane, *keys)

    def type(self, text: str) -> None:
        """Type text as keys, then give gemini time to take it: an Enter within 40 ms of fast input is a newline."""
        self.lab.tmux("send-keys", "-t", self.pane, "-l", text)
        wait_until(lambda: text[-20:] in self.screen(), 10, f"{text!r} in the input box", self.screen)
        time.sleep(0.3)

    def submit(self, text: str) -> None:
        self.type(text)
        self.keys("Enter")

    def api_calls(self) -> list[dict[str, Any]]:
        if not self.requests.exists():
            return []
        return [json.loads(line) for line in self.requests.read_text().splitlines() if line.strip()]

    def main_turns(self) -> int:
        """How many main-turn requests (those that offer tools) reached the fake API."""
        return sum(1 for call in self.api_calls() if call.get("body") and call["body"].get("tools"))

    def wait_screen(self, cond: Callable[[str], bool], timeout: float = 30.0, what: str = "the screen") -> str:
        return str(wait_until(lambda: (lambda s: s if cond(s) else "")(self.screen()), timeout, what, self.screen))

    def wait_idle(self, timeout: float = 60.0) -> str:
        """Until the input box is empty and nothing runs (the placeholder shows, no `esc to cancel`), and the screen
        has stopped changing (gemini draws its banner after the prompt)."""
        self.wait_screen(lambda s: PLACEHOLDER in s and "esc to cancel" not in s, timeout, f"{self.name} idle")
        return self.settled()

    def settled(self, quiet: float = 1.5, timeout: float = 20.0) -> str:
        """The screen once it has not changed for `quiet` seconds (or as it is after `timeout`)."""
        deadline = time.monotonic() + timeout
        last, since = self.screen(), time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.1)
            now = self.screen()
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet:
                break
        return last


class GeminiLab:
    def __init__(
        self,
        root: Path,
        binary: Path,
        *,
        auth: bool = True,
        truecolor: bool = True,
        home: Path | None = None,
        server: str = "default",
    ) -> None:
        """auth=False: no key anywhere, so gemini opens with its auth method chooser.

        truecolor: COLORTERM=truecolor (a modern terminal's setting; gemini then draws its input box with half-block
        rules). Without it gemini warns once and draws plain rules: both look the same on the prompt line."""
        self.root = root
        self.truecolor = truecolor
        self.binary = binary
        self.auth = auth
        self.server = server
        self.home = home or root / "home"
        self.config = self.home / ".gemini"
        self.root.mkdir(parents=True, exist_ok=True)
        self.config.mkdir(parents=True, exist_ok=True)
        self.sessions: list[GeminiSession] = []
        self._settings()

    def tmux(self, *args: str) -> str:
        proc = subprocess.run(["tmux", "-L", self.server, *args], capture_output=True, text=True, timeout=10)
        return proc.stdout

    def _settings(self) -> None:
        settings: dict[str, Any] = {
            "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
        }
        if self.auth:
            settings["security"] = {"auth": {"selectedType": "gemini-api-key"}}
        (self.config / "settings.json").write_text(json.dumps(settings, indent=2))
        # Written once, before any session starts: gemini rewrites this file when a folder is trusted from its dialog.
        trusted = {str(self.root / f"w{i}"): "TRUST_FOLDER" for i in range(10)}
        (self.config / "trustedFolders.json").write_text(json.dumps(trusted, indent=2))

    def start(self, name: str, *, trust: bool = True, wait: bool = True, **control: Any) -> GeminiSession:
        """A gemini session in a new tmux session, WIDTHxHEIGHT, in its own network namespace."""
        n = len(self.sessions)
        cwd = self.root / (f"w{n}" if trust else f"untrusted{n}")
        cwd.mkdir()
        session = GeminiSession(self, name, cwd, "", self.root / f"{name}.control.json", self.root / f"{name}.requests.jsonl")
        session.set_control(**control)
        api = (
            f"{shlex.quote(sys.executable)} {shlex.quote(str(HERE / 'fake_gemini.py'))} --port {PORT} "
            f"--log {shlex.quote(str(session.requests))} --control {shlex.quote(str(session.control))} --watch-pid $$"
        )
        env = ["env", *(f"-u{var}" for var in SCRUB), "-uCOLORTERM", f"HOME={self.home}"]
        if self.truecolor:
            env.append("COLORTERM=truecolor")
        if self.auth:
            env += [f"GEMINI_API_KEY={API_KEY}", f"GOOGLE_GEMINI_BASE_URL=http://127.0.0.1:{PORT}"]
        node = node_binary()[0] or "node"
        argv = " ".join(shlex.quote(a) for a in [*env, node, str(self.binary)])
        # The fake API watches this shell's pid, which becomes gemini's: it exits with gemini.
        inner = f"ip link set lo up && {{ {api} & }} && sleep 0.3 && exec {argv}"
        command = f"unshare -n sh -c {shlex.quote(inner)}"
        tmux = ["tmux", "-L", self.server, "new-session", "-d", "-P", "-F", "#{pane_id}", "-s", name]
        size = ["-x", str(WIDTH), "-y", str(HEIGHT), "-c", str(cwd)]
        proc = subprocess.run([*tmux, *size, command], capture_output=True, text=True, timeout=10)
        assert proc.returncode == 0, proc.stderr
        session.pane = proc.stdout.strip()
        session.pid = int(self.tmux("display-message", "-p", "-t", session.pane, "#{pane_pid}").strip() or 0)
        self.sessions.append(session)
        if wait:
            session.wait_idle(START_S)
        return session

    def stop(self) -> None:
        """End every session. gemini outlives its pane (it ignores the hangup), so its processes are ended by pid."""
        for session in self.sessions:
            pids = descendants(session.pid) if session.pid else []
            self.tmux("kill-session", "-t", session.name)
            for pid in pids:
                _signal(pid, signal.SIGTERM)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
                time.sleep(0.1)
            for pid in pids:
                if _alive(pid):
                    _signal(pid, signal.SIGKILL)
        self.sessions.clear()


def descendants(root: int) -> list[int]:
    """root and every process under it, deepest first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out: list[int] = []
    todo = [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out[::-1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# ---------------------------------------------------------------------------------------------------------------
# Making the captures in tests/screens/ (python -m tests.support.geminilab capture tests/screens)
# ---------------------------------------------------------------------------------------------------------------

DRAFT = "half-written: please also check the migration"
BUSY_DRAFT = "a second thought, not sent yet"
QUEUED = "after that, run the tests"


def is_busy(screen: str) -> bool:
    return "esc to cancel" in screen


def capture(dest: Path, binary: Path, root: Path, server: str = "gemini-capture") -> dict[str, str]:
    """Produce every gemini-*.txt capture; returns {file name: how it was produced}."""
    made: dict[str, str] = {}

    def save(name: str, screen: str, how: str) -> None:
        (dest / name).write_text(screen)
        made[name] = how

    lab = GeminiLab(root / "keyed", binary, server=server)
    try:
        s = lab.start("main", delay=25, reply="Done: the build is clean.")
        save("gemini-idle.txt", s.wait_idle(), "fresh session, trusted folder, API key configured: the first idle screen")

        s.type(DRAFT)
        s.wait_screen(lambda t: DRAFT in t and PLACEHOLDER not in t, what="the idle draft")
        screen = s.settled()
        save("gemini-idle-with-draft.txt", screen, f"idle, then {DRAFT!r} typed into the input box, no Enter")

        s.keys("Enter")  # the draft becomes the first turn: the fake API holds it for 25 s
        screen = s.wait_screen(lambda t: is_busy(t) and PLACEHOLDER in t, what="the busy screen")
        time.sleep(2)
        save("gemini-busy.txt", s.screen(), "the draft submitted with Enter; the fake API delays its answer 25 s")

        s.type(BUSY_DRAFT)
        screen = s.wait_screen(lambda t: is_busy(t) and BUSY_DRAFT in t, what="the busy draft")
        save("gemini-busy-with-draft.txt", screen, f"busy, then {BUSY_DRAFT!r} typed into the input box, no Enter")

        s.keys("C-c")  # Ctrl+C with text in the box clears the box (the turn goes on)
        s.wait_screen(lambda t: is_busy(t) and PLACEHOLDER in t, what="the cleared input box")
        s.submit(QUEUED)
        screen = s.wait_screen(lambda t: is_busy(t) and "Queued (press ↑ to edit):" in t, what="the queued message")
        save("gemini-queued.txt", screen, f"busy, then {QUEUED!r} typed and submitted with Enter: gemini queues it")

        wait_until(lambda: s.main_turns() == 1, 20, "the slow turn at the API", s.screen)
        s.set_control(reply="Done.")
        # Between the two turns the screen looks idle for a moment: count the queued turn's request first.
        wait_until(lambda: s.main_turns() >= 2, 60, "the queued turn to reach the API", s.screen)
        s.wait_idle()

        s.set_control(shell="rm -rf build", reply="Cleaned.")
        s.submit("clean the build")
        s.wait_screen(lambda t: "Allow execution of" in t, what="the approval dialog")
        screen = s.settled()
        save(
            "gemini-approval-dialog.txt",
            screen,
            "idle, then 'clean the build' submitted; the fake API answers with a run_shell_command call (rm -rf build)",
        )
        s.keys("Escape")  # 3. No, suggest changes (esc): nothing runs

        u = lab.start("untrusted", trust=False, wait=False)
        u.wait_screen(lambda t: "Do you trust the files in this folder?" in t, START_S, "the trust dialog")
        screen = u.settled()
        save("gemini-trust-dialog.txt", screen, "a session started in a folder that trustedFolders.json does not list")
    finally:
        lab.stop()

    lab = GeminiLab(root / "nokey", binary, auth=False, server=server)
    try:
        a = lab.start("nokey", wait=False)
        a.wait_screen(lambda t: "How would you like to authenticate" in t, START_S, "the auth dialog")
        screen = a.settled()
        save("gemini-auth-dialog.txt", screen, "trusted folder, no key in the environment, no auth type in settings.json")
    finally:
        lab.stop()

    lab = GeminiLab(root / "plain", binary, truecolor=False, server=server)
    try:
        p = lab.start("plain")
        save("gemini-idle-256color.txt", p.wait_idle(), "as gemini-idle.txt, but without COLORTERM=truecolor")
    finally:
        lab.stop()
    return made


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "capture":
        print("usage: python -m tests.support.geminilab capture DIR", file=sys.stderr)
        return 2
    binary, why = ensure_binary()
    if binary is None:
        print(f"cannot run gemini-cli: {why}", file=sys.stderr)
        return 1
    root = Path("/tmp/drover-gemini")  # a fixed place, so the paths on the captured screens stay the same
    shutil.rmtree(root, ignore_errors=True)
    try:
        made = capture(Path(argv[1]), binary, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for name, how in made.items():
        print(f"{name}: {how}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
