"""A small agent-like REPL for `drover demo` and the tests.

It behaves the way the coding-agent TUIs drover delivers to do: it takes the terminal in raw mode, asks for
bracketed paste, draws an input box with a `❯` prompt, shows a busy footer ("esc to interrupt") while it
"works", and can draw a permission dialog that any Enter would answer.  Every message it receives, every key
that is not part of a paste, and every dialog answer is appended to a JSON-lines log, so a test can compare
what arrived with what was sent, byte for byte.

Signals: SIGUSR1 draws the dialog, SIGUSR2 toggles busy.
"""

from __future__ import annotations

import argparse
import codecs
import json
import os
import select
import signal
import subprocess
import sys
import termios
import threading
import time

BOX_LINES = 6
PASTE_START = "\x1b[200~"
PASTE_END = "\x1b[201~"
TOOL = "run: "  # with --tools: a message line that is a command to run
KEY_NAMES = {"\x1b[A": "Up", "\x1b[B": "Down", "\x1b[C": "Right", "\x1b[D": "Left", "\x1b": "Esc"}


def body_of(text: str) -> str:
    """A message's words without drover's envelope around them, on one line."""
    lines = [line for line in text.splitlines() if not line.startswith(("<cross-session-message", "</cross-session-message"))]
    return " ".join(line.strip() for line in lines if line.strip())


class Agent:
    def __init__(
        self,
        log: str,
        name: str,
        busy_after: float,
        dialog_on_paste: bool,
        dialog_after_paste: bool = False,
        dialog_delay: float = 0.0,
        split_draw: float = 0.0,
        ignore_enter: float = 0.0,
        reply: bool = False,
        tools: bool = False,
    ) -> None:
        self.log_path = log
        # With --tools, a message's lines that start `run: ` are run as a shell command, a child of this process,
        # as an agent runs a tool: how the tests run `drover spawn` and `drover done` from inside a session.
        self.tools = tools
        # Hostile-program knobs for the tests: a dialog some ms after a paste lands, each frame drawn in two writes,
        # an Enter ignored for a while after a paste.
        self.dialog_delay = dialog_delay
        self.dialog_at = 0.0
        self.split_draw = split_draw
        self.ignore_enter = ignore_enter
        self.pasted_at = 0.0
        self.dialog_shown = 0.0
        self.name = name
        # With --reply, each message is answered (a `reply` event in the log) once the work it caused is done: what
        # a coordinator reads back with `drover read` (the log is the demo agent's transcript).
        self.reply = reply
        self.unanswered: list[str] = []
        self.busy_after = busy_after
        self.dialog_on_paste = dialog_on_paste
        self.dialog_after_paste = dialog_after_paste
        self.buf = ""
        self.pending = ""
        self.in_paste = False
        self.dialog = False
        self.dialog_choice = 1
        self.busy_until = 0.0
        self.busy_forced = False
        self.history: list[str] = []
        self.dirty = True

    # -- state -----------------------------------------------------------------------------------------------
    def busy(self) -> bool:
        return self.busy_forced or time.monotonic() < self.busy_until

    def record(self, **event: object) -> None:
        event["t"] = time.time()
        with open(self.log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(event, ensure_ascii=False) + "\n")
            f.flush()

    # -- drawing ---------------------------------------------------------------------------------------------
    def draw(self) -> None:
        # Clear the flag first: a signal arriving while we draw must leave it set for the next round.
        self.dirty = False
        try:
            cols, rows = os.get_terminal_size(1)
        except OSError:
            cols, rows = 80, 24
        rule = "─" * max(10, cols - 1)
        lines = [f" drover demo agent · {self.name}", ""]
        if self.dialog:
            lines += [
                " Bash command: rm -rf build/",
                "",
                " Do you want to proceed?",
                (" ❯ 1. Yes" if self.dialog_choice == 1 else "   1. Yes"),
                (" ❯ 2. No" if self.dialog_choice == 2 else "   2. No"),
                "",
                " Enter to confirm · Esc to cancel",
            ]
        else:
            for msg in self.history[-(rows - 9) :]:
                lines.append(" › " + msg.replace("\n", " ⏎ ")[: cols - 5])
            # The input box wraps the text over up to BOX_LINES lines, as the real programs' boxes do; a longer text
            # shows its first and last lines with "…" between them.
            width = max(10, cols - 4)
            flat = self.buf.replace("\n", " ⏎ ")
            rows_of = [flat[i : i + width] for i in range(0, len(flat), width)] or [""]
            if len(rows_of) > BOX_LINES:
                half = BOX_LINES // 2
                rows_of = [*rows_of[:half], "…", *rows_of[-half:]]
            box = ["❯ " + rows_of[0], *("  " + row for row in rows_of[1:])]
            while len(lines) < rows - 4 - len(box):
                lines.append("")
            lines += [rule, *box, rule]
            if self.busy():
                lines.append("  ✻ Working… (esc to interrupt)")
            else:
                lines.append("  idle · paste or type a message")
        shown = [line[: cols - 1] for line in lines[-rows:]]
        # The cursor rests where the real programs keep it: after the text in the input box (it moves with every key
        # typed there), or on the dialog's choice -- what drover's conditional Enter compares.
        if self.dialog:
            row = next(i for i, line in enumerate(shown) if "❯" in line)
            col = shown[row].index("❯")
        else:
            row = len(shown) - 3  # the box's last row: above its lower rule and the footer
            col = len(shown[row])
        out = ("\x1b[H\x1b[2J" + "\r\n".join(shown) + f"\x1b[{row + 1};{col + 1}H").encode("utf-8")
        if self.split_draw:
            os.write(1, out[: len(out) // 2])
            time.sleep(self.split_draw)
            out = out[len(out) // 2 :]
        os.write(1, out)

    # -- input -----------------------------------------------------------------------------------------------
    def submit(self) -> None:
        text = self.buf
        self.buf = ""
        if not text:
            return
        self.record(type="message", text=text, while_busy=self.busy())
        self.history.append(text)
        if self.tools:
            for line in text.splitlines():
                if line.startswith(TOOL):
                    threading.Thread(target=self.run_tool, args=(line[len(TOOL) :],), daemon=True).start()
        if self.reply:
            self.unanswered.append(text)
        if self.busy_after > 0 and not self.busy():
            self.busy_until = time.monotonic() + self.busy_after

    def run_tool(self, command: str) -> None:
        """One tool call: its exit code and output in the log (a `tool` event), while the REPL goes on."""
        self.record(type="tool_start", command=command)
        try:
            done = subprocess.run(
                ["/bin/sh", "-c", command], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600
            )
            self.record(type="tool", command=command, rc=done.returncode, out=done.stdout[-4000:], err=done.stderr[-4000:])
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.record(type="tool", command=command, rc=None, out="", err=str(exc))

    def key(self, name: str) -> None:
        if self.dialog:
            if name in ("Up", "Down"):
                self.dialog_choice = 2 if self.dialog_choice == 1 else 1
                return
            if name == "Enter":
                # How long the dialog had been on screen (written out) when the Enter was read: the window a
                # sender's look could not close.
                age = round((time.monotonic() - self.dialog_shown) * 1000, 2) if self.dialog_shown else None
                self.record(type="dialog", answer="yes" if self.dialog_choice == 1 else "no", shown_ms=age)
            else:
                self.record(type="dialog", answer="cancel" if name == "Esc" else "key:" + name)
            self.dialog = False
            return
        if name == "Enter":
            if self.ignore_enter and time.monotonic() - self.pasted_at < self.ignore_enter:
                self.record(type="ignored_enter")
                return
            self.submit()
        elif name == "Backspace":
            self.buf = self.buf[:-1]
        elif name == "C-u":
            self.buf = ""  # clears the box, as in the real programs
        else:
            self.record(type="key", key=name)

    def feed(self, text: str) -> None:
        self.pending += text
        while self.pending:
            if self.in_paste:
                end = self.pending.find(PASTE_END)
                if end < 0:
                    # keep a tail that could be the start of the end marker
                    keep = next((k for k in range(len(PASTE_END) - 1, 0, -1) if PASTE_END.startswith(self.pending[-k:])), 0)
                    chunk, self.pending = self.pending[: len(self.pending) - keep], self.pending[len(self.pending) - keep :]
                    self._paste_text(chunk)
                    return
                self._paste_text(self.pending[:end])
                self.pending = self.pending[end + len(PASTE_END) :]
                self.in_paste = False
                self.pasted_at = time.monotonic()
                if self.dialog_after_paste and self.dialog_delay > 0:
                    self.dialog_at = self.pasted_at + self.dialog_delay  # drawn by the main loop when it is due
                elif self.dialog_after_paste:
                    # A permission dialog that pops up right after the text landed in the input box (kept there).
                    self.dialog = True
                    self.dirty = True
                    self.record(type="dialog_drawn")
                continue
            ch = self.pending[0]
            if ch == "\x1b":
                if self.pending.startswith(PASTE_START):
                    self.pending = self.pending[len(PASTE_START) :]
                    self.in_paste = True
                    if self.dialog_on_paste:
                        self.dialog = True
                        self.draw()
                    continue
                if len(self.pending) < 3 and PASTE_START.startswith(self.pending):
                    return  # wait for the rest of the sequence
                seq = self.pending[:3] if self.pending[1:2] in ("[", "O") else "\x1b"
                self.pending = self.pending[len(seq) :]
                self.key(KEY_NAMES.get(seq, "Esc" + repr(seq[1:])))
                continue
            self.pending = self.pending[1:]
            if ch == "\r":
                self.key("Enter")
            elif ch in ("\x7f", "\x08"):
                self.key("Backspace")
            elif ch == "\x03":
                self.key("C-c")
            elif ord(ch) < 0x20 and ch not in "\t\n":
                self.key("C-" + chr(ord(ch) + 0x60))
            elif self.dialog:
                self.record(type="dialog_input", text=ch)
                self.key(ch)
            else:
                self.buf += ch

    def _paste_text(self, chunk: str) -> None:
        if not chunk:
            return
        if self.dialog:
            self.record(type="dialog_input", text=chunk)
        else:
            self.buf += chunk

    def take_waiting(self, fd: int, decoder: codecs.IncrementalDecoder) -> None:
        while select.select([fd], [], [], 0)[0]:
            data = os.read(fd, 65536)
            if not data:
                break
            self.feed(decoder.decode(data))

    # -- main loop -------------------------------------------------------------------------------------------
    def run(self) -> None:
        fd = 0
        old = termios.tcgetattr(fd)
        new = termios.tcgetattr(fd)
        new[0] &= ~(termios.ICRNL | termios.IXON | termios.INLCR | termios.IGNCR | termios.BRKINT | termios.ISTRIP)
        new[3] &= ~(termios.ICANON | termios.ECHO | termios.ISIG | termios.IEXTEN)
        new[6][termios.VMIN] = 1
        new[6][termios.VTIME] = 0
        termios.tcsetattr(fd, termios.TCSANOW, new)
        decoder = codecs.getincrementaldecoder("utf-8")("replace")

        def show_dialog(*_: object) -> None:
            self.dialog_at = time.monotonic()  # drawn by the main loop at once, after the keys that came before it

        def toggle_busy(*_: object) -> None:
            self.busy_forced = not self.busy_forced
            self.dirty = True

        signal.signal(signal.SIGUSR1, show_dialog)
        signal.signal(signal.SIGUSR2, toggle_busy)
        signal.signal(signal.SIGWINCH, lambda *_: setattr(self, "dirty", True))
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # through `finally`: the cursor goes below the screen
        os.write(1, b"\x1b[?2004h")
        self.record(type="start", pid=os.getpid())
        was_busy = False
        try:
            while True:
                if self.unanswered and not self.busy():
                    # Before the idle screen is drawn: a session seen idle has its answer in the log already.
                    for text in self.unanswered:
                        self.record(type="reply", text="done: " + body_of(text))
                    self.unanswered = []
                if self.dirty or was_busy != self.busy():
                    was_busy = self.busy()
                    self.draw()
                wait = 0.05
                if self.dialog_at:
                    wait = max(0.0, min(wait, self.dialog_at - time.monotonic()))
                try:
                    ready, _, _ = select.select([fd], [], [], wait)
                except InterruptedError:
                    continue
                if self.dialog_at and time.monotonic() >= self.dialog_at:
                    # Keys that reached the program before its dialog was written out were sent before anyone --
                    # a person, tmux -- could have seen that dialog: they are meant for the screen shown until then
                    # (an Enter onto the input box submits it), taken first, as they came.  Looked for before the
                    # dialog is drawn and again once its write returned (a key may land while it is written).
                    self.take_waiting(fd, decoder)
                    self.dialog_at, self.dialog = 0.0, True
                    self.draw()
                    self.dialog_shown = time.monotonic()
                    if select.select([fd], [], [], 0)[0]:
                        self.dialog = False
                        self.take_waiting(fd, decoder)
                        self.dialog = True
                        self.draw()
                    self.record(type="dialog_drawn")
                    continue
                if not ready:
                    if self.pending == "\x1b":
                        self.pending = ""
                        self.key("Esc")
                        self.dirty = True
                    continue
                data = os.read(fd, 65536)
                if not data:
                    break
                self.feed(decoder.decode(data))
                self.dirty = True
        finally:
            # Leave the cursor below the last line, where the shell that gets the terminal back prints its prompt.
            os.write(1, b"\x1b[?2004l\x1b[999;1H\r\n")
            termios.tcsetattr(fd, termios.TCSANOW, old)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="drover-demo-agent", description=__doc__.split("\n")[0])
    parser.add_argument("--log", required=True, help="JSON-lines file to record what arrives")
    parser.add_argument("--name", default="demo", help="name shown in the header")
    parser.add_argument("--busy-after-message", type=float, default=0.0, help="seconds to stay busy after a message")
    parser.add_argument("--dialog-on-paste", action="store_true", help="draw a dialog the moment a paste starts")
    parser.add_argument("--dialog-after-paste", action="store_true", help="draw a dialog once a paste has landed")
    parser.add_argument("--dialog-delay", type=float, default=0.0, help="with --dialog-after-paste: this many seconds later")
    parser.add_argument("--split-draw", type=float, default=0.0, help="draw each frame in two writes, this many seconds apart")
    parser.add_argument("--reply", action="store_true", help="answer each message in the log when its busy time is over")
    parser.add_argument("--tools", action="store_true", help="run each message line that starts `run: ` as a shell command")
    parser.add_argument("--ignore-enter", type=float, default=0.0, help="ignore Enter for this many seconds after a paste")
    # What `drover spawn ... -- ARGS` may pass an engine: taken and ignored, as an engine takes its own flags.
    parser.add_argument("--model", help="accepted and ignored (an engine flag a spawn may pass)")
    parser.add_argument("words", nargs="*", help="accepted and ignored (arguments a spawn may pass)")
    args = parser.parse_args(argv)
    Agent(
        args.log,
        args.name,
        args.busy_after_message,
        args.dialog_on_paste,
        args.dialog_after_paste,
        args.dialog_delay,
        args.split_draw,
        args.ignore_enter,
        args.reply,
        args.tools,
    ).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
