"""Everything the CLI prints: tables for humans, JSON documents for scripts, one line per error.

This is the one place errors are rendered.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from drover.cli.state import environment

if TYPE_CHECKING:  # the ops (and pydantic) load only when a command runs one, not for --help
    from rich.progress import Progress  # only a fan-out over a terminal draws a bar: imported then (~6 ms)

    from drover.ops.core import Document


def out() -> Console:
    """The running invocation's stdout Console (drover/environment.py: its terminal, its width, its colours)."""
    return environment().out


def err() -> Console:
    return environment().err


OUTCOME_STYLE = {
    "delivered": "green",
    "queuedBehindTurn": "cyan",
    "held": "yellow",
    "refused": "red",
    "dropped": "red",
    "failed": "bold red",
    None: "magenta",
}
STATE_STYLE = {
    "idle": "green",
    "working": "cyan",
    "waiting_on_human": "yellow",
    "stalled": "bold red",
    "done": "green",
    "exited": "dim",
    "unknown": "magenta",
    # the host's own words, as `screen_state` and older answers give them
    "busy": "cyan",
    "dialog": "yellow",
    "waiting": "yellow",
    "gone": "dim",
}


# -- terminal safety ---------------------------------------------------------------------------------------------
#
# Message texts, transcripts, screen tails, names and error details come from other people and other programs.
# Printed raw, `ESC]0;title BEL`, cursor moves or an OSC 52 clipboard write would act on the operator's own
# terminal. Humans get them as visible symbols; JSON keeps them as JSON escapes.

# C0 but tab and newline, DEL, C1, the bidi embedding/override/isolate controls, lone surrogates.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _visible(m: re.Match[str]) -> str:
    c = ord(m.group())
    if c < 0x20:
        return chr(0x2400 + c)  # Control Pictures: ESC -> ␛, CR -> ␍, BEL -> ␇
    if c == 0x7F:
        return "\u2421"  # ␡
    if c <= 0x9F:
        return f"\\x{c:02x}"  # C1 (0x9b is a one-byte CSI): shown as text
    if 0xD800 <= c <= 0xDFFF:
        return "\ufffd"
    return f"\\u{c:04x}"


def safe(text: str) -> str:
    """Text as it may be shown on a terminal: every control character visible, none acting."""
    return _UNSAFE.sub(_visible, text)


def clean(value: Any) -> Any:
    """`safe` applied to every string (keys too) of a JSON-like value, for the human renderings."""
    if isinstance(value, str):
        return safe(value)
    if isinstance(value, dict):
        return {clean(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return value


# Inside JSON strings (the only place they can be: the rest of a document is ASCII) as \u escapes, so piping
# `--json` to a terminal is as safe as a table; json.dumps already escapes C0.
_JSON_UNSAFE = re.compile("[\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def to_json(data: Any, indent: int | None = None) -> str:
    text = json.dumps(data, indent=indent, ensure_ascii=False, default=str)
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def print_json(doc: Document | dict[str, Any]) -> None:
    data = doc if isinstance(doc, dict) else doc.to_dict()
    env = environment()
    indent = 2 if env.isatty("stdout") else None
    env.stdout.write(to_json(data, indent) + "\n")
    env.stdout.flush()


def error_line(error: dict[str, Any]) -> str:
    host = f"{error['host']}: " if error.get("host") else ""
    hint = f" ({error['hint']})" if error.get("hint") else ""
    return f"{host}{error.get('message', error.get('code', 'error'))}{hint}"


def errors(doc: Document) -> None:
    error_list(doc.errors)


def error_list(errs: list[dict[str, Any]]) -> None:
    """One line per error (a fleet file's further problems indented under it), control characters visible."""
    for e in clean(errs):
        err().print(Text("drover: " + error_line(e)), style="red")
        for problem in e.get("problems", [])[1:] if e.get("code") == "fleet_invalid" else []:
            err().print(Text("  " + problem), style="red")


def ago(ts: float | int | None) -> str:
    if not ts:
        return "-"
    delta = max(0, time.time() - float(ts))
    if delta < 60:
        return f"{delta:.0f}s ago"
    if delta < 3600:
        return f"{delta / 60:.0f}m ago"
    if delta < 86400:
        return f"{delta / 3600:.1f}h ago"
    return f"{delta / 86400:.1f}d ago"


def sessions_table(data: dict[str, Any]) -> None:
    rows = data.get("sessions", [])
    table = Table(box=None, header_style="bold", pad_edge=False)
    threads = any(s.get("thread") for s in rows)  # a Codex thread id is a target of its own: shown whole
    for col in ("HOST", "ID", "NAME", "ENGINE", "STATE", "SINCE", "PROGRESS", "CWD", "LANES") + (("THREAD",) if threads else ()):
        table.add_column(col, overflow="fold" if col == "CWD" else "ellipsis", no_wrap=col != "CWD")
    for s in rows:
        state = s.get("state", "-")
        if s.get("engine") == "claude" and len(s["id"]) > 12:
            sid = s["id"][:8]  # a unique prefix of the sessionId is enough to name it
        elif s.get("server") in (None, "default"):
            sid = s["id"]
        else:
            sid = f"{s['server']}/{s['id']}"
        table.add_row(
            s["host"],
            sid,
            s.get("name", ""),
            s.get("engine", ""),
            Text(state, style=STATE_STYLE.get(state, "")),
            ago(s.get("since")),
            ago(s.get("last_progress")),
            s.get("cwd", ""),
            ",".join(s.get("lanes", [])),
            *((s.get("thread") or "-",) if threads else ()),
        )
    hosts = data.get("hosts", [])
    failed = [h for h in hosts if not h.get("ok")]
    if rows:
        out().print(table)
    elif failed or data.get("engine"):
        # An empty answer is only "nothing runs" when every host asked answered and nothing was filtered out.
        kind = f"{data['engine']} " if data.get("engine") else ""
        answered = len(hosts) - len(failed)
        out().print(f"no {kind}sessions on the {answered} host(s) that answered", style="dim")
    else:
        out().print("no sessions (start an agent in tmux, or try `drover demo`)", style="dim")
    if failed:
        said = "; ".join(f"{h['host']} ({h.get('code') or 'failed'}: {h.get('error') or '?'})" for h in failed)
        out().print(Text(f"{len(failed)} of {len(hosts)} host(s) failed, their sessions not listed: {said}"), style="red")
    for w in data.get("warnings", []):
        err().print(Text(f"warning: {w['host']}: {w['message']}"), style="yellow")


def _thread(s: dict[str, Any]) -> str:
    """A Codex session's thread: its id (a target of its own) and what its app-server says of it."""
    return f"{s['thread']} ({' '.join([s.get('thread_status') or '?', *(s.get('thread_flags') or [])])})"


def progress_line(s: dict[str, Any]) -> str:
    """When the session last made progress and how that is known; the retries and the threshold beside it."""
    ev = s.get("evidence") or {}
    said = f"{ago(s.get('last_progress'))} ({s.get('progress_source') or 'no evidence'})"
    retries = (ev.get("progress") or {}).get("retries")
    if retries:
        said += f"; {retries} upstream retr{'y' if retries == 1 else 'ies'} since (not progress)"
    if ev.get("stall_after"):
        said += f"; stalled after {ev['stall_after']:g}s"
    return said


def status(data: dict[str, Any]) -> None:
    s = data["session"]
    state = s.get("state", "unknown")
    out().print(
        Text.assemble((f"{s['host']}:{s['id']}", "bold"), f"  {s.get('name', '')}  ", (state, STATE_STYLE.get(state, "")))
    )
    terminal = (s.get("evidence") or {}).get("terminal")
    if state == "exited" and s.get("spawn_id"):
        out().print(Text(f"  {'exited':<10} last seen {ago(s.get('last_seen'))} (spawn {s['spawn_id']}, {s.get('engine')})"))
        if terminal:  # it said it was done (or failed) before it went: that is how its task ended
            said = f": {terminal['summary']}" if terminal.get("summary") else ""
            out().print(Text(f"  {'signal':<10} {terminal.get('event')} {terminal.get('time')}{said}"))
        return
    for label, value in (
        ("since", ago(s.get("since"))),
        ("progress", progress_line(s)),
        ("screen", s.get("screen_state") or "-"),
        *([("signal", f"{terminal.get('event')} {terminal.get('time')}")] if terminal else []),
        ("engine", s.get("engine")),
        ("why", s.get("reason")),
        ("pane", f"{s.get('target')} on tmux server {s.get('server')}" if s.get("target") else "none"),
        ("lanes", ", ".join(s.get("lanes") or []) or "none"),
        *([("thread", _thread(s))] if s.get("thread") else []),
        ("command", f"{s.get('command')} (pid {s.get('pid')})"),
        ("cwd", s.get("cwd")),
        ("last line", s.get("last_line") or "-"),
    ):
        out().print(Text(f"  {label:<10} {value}"))
    tail = s.get("tail") or []
    if tail:
        out().print(Text("  screen tail:", style="dim"))
        for line in tail:
            out().print(Text("  │ " + line), style="dim")


def outcome(data: dict[str, Any], expected: bool = False) -> None:
    name = data.get("outcome") or "pending"
    style = OUTCOME_STYLE.get(data.get("outcome"), "")
    session = data.get("session") or {}
    where = f"{data['host']}:{session.get('name') or data.get('target')}"
    if session.get("engine"):
        sid = session.get("id", "")
        where += f" ({session['engine']} {sid[:8] if len(sid) > 12 else sid})"
    via = f" via {data['lane']}" if data.get("lane") else ""
    ok = name in ("delivered", "queuedBehindTurn")
    prefix = "" if ok or expected else "drover: "
    line = Text.assemble(prefix, (name, f"bold {style}"), f" → {where}{via}: {data.get('detail', '')}  ", (data["id"], "dim"))
    console = out() if expected or ok else err()
    console.print(line)
    if ok and "verified" in data:
        # How drover knows: the receiver's own record, or why it could not look yet.
        if data["verified"]:
            out().print(Text("  verified: " + str(data.get("verification") or "in the receiver's record"), style="green"))
        else:
            out().print(Text("  unverified: " + str(data.get("verification") or "not looked up"), style="yellow"))
    for w in data.get("warnings") or []:
        err().print(Text(f"warning: {w.get('message', w) if isinstance(w, dict) else w}"), style="yellow")
    if data.get("declared_mode") == "bypass":
        out().print(Text("  declared the bypass class: relayed as the owner's own words", style="dim"))
    for c in data.get("candidates") or []:
        where = f"{c['server']}/{c['id']}" if c.get("server") else str(c["id"])  # a Claude record may have no pane
        err().print(Text(f"  candidate: {where}  {c.get('name') or ''}"))


def verified_table(data: dict[str, Any]) -> None:
    rows = data.get("messages", [])
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("ID", "TO", "OUTCOME", "VERIFIED", "HOW"):
        table.add_column(col, no_wrap=col != "HOW", overflow="fold")
    for r in rows:
        mark = Text("yes", style="green") if r.get("verified") else Text("no", style="yellow")
        table.add_row(r["id"], f"{r['host']}:{r['target']}", r.get("outcome") or "pending", mark, r.get("verification") or "")
    if rows:
        out().print(table)
    else:
        out().print("nothing to verify: no recent delivered or queued message is unverified", style="dim")


def messages_table(data: dict[str, Any]) -> None:
    rows = data.get("messages", [])
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("TIME", "ID", "ACTOR", "TO", "OUTCOME", "LANE", "TEXT"):
        table.add_column(col, no_wrap=True, overflow="ellipsis", max_width=48 if col == "TEXT" else None)
    for m in rows:
        text = m.get("text", "").replace("\n", " ⏎ ")
        oc = m.get("outcome") or "pending"
        table.add_row(
            m["time"][:19].replace("T", " "),
            m["id"],
            m["actor"],
            f"{m['host']}:{m['target']}",
            Text(oc, style=OUTCOME_STYLE.get(m.get("outcome"), "")),
            m.get("lane") or "-",
            text,
        )
    if rows:
        out().print(table)
    else:
        out().print(f"no messages match (truth file: {data.get('truth_file')})", style="dim")
    for c in data.get("chats") or []:  # bots' replies: their words, shown as data
        stamp = (c.get("time") or "")[:19].replace("T", " ")
        from drover.bots.untrusted import display_lines  # only when a reply is shown (render loads for --help)

        said = " ⏎ ".join(display_lines(c.get("text") or ""))
        out().print(
            Text.assemble(
                (f"{stamp} {c.get('id')} ", "dim"),
                (f"bot:{c.get('bot')} [untrusted] ", "yellow"),
                f"re {c.get('in_reply_to')}: ",
                said,
            )
        )


def message(data: dict[str, Any]) -> None:
    m = data["message"]
    for label in ("id", "time", "actor", "host", "target", "outcome", "lane", "code", "detail", "outcome_time"):
        value = m.get(label)
        if label == "outcome" and value is None:
            value = "pending (accepted, no outcome recorded: the sender stopped mid-send)"
        if value is not None:
            out().print(Text(f"{label:<13} {value}"))
    if m.get("session"):
        s = m["session"]
        out().print(Text(f"{'session':<13} {s.get('id')} {s.get('name', '')} ({s.get('engine', '')}) on {s.get('server', '')}"))
    out().print(Text(f"text ({m.get('text_chars', 0)} characters):", style="bold"))
    out().print(Text(m.get("text", "")))


def ops_list(ops: list[dict[str, Any]]) -> None:
    for spec in ops:
        out().print(Text.assemble((spec["op"], "bold"), f"  ({spec['cli']})  " if spec["cli"] else "  ", spec["summary"]))
        for f in spec["fields"]:
            req = "required" if f["required"] else f"default {json.dumps(f['default'])}"
            out().print(Text(f"    {f['name']:<14} {f['type']:<22} {req:<24} {f['description']}"))


def fleet_show(data: dict[str, Any]) -> None:
    fleet = data["fleet"]
    path = data.get("path") or f"(none: the built-in fleet, {data.get('default_path')} not found)"
    out().print(Text(f"fleet file: {path}"))
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("HOST", "SSH", "USER", "PORT", "PYTHON", "TAGS"):
        table.add_column(col)
    for name in data["hosts"]:
        h = fleet["hosts"].get(name) or {}
        ssh = h.get("ssh") or ("(this machine)" if name == "local" else name)
        table.add_row(
            name,
            ssh,
            h.get("user") or "-",
            str(h.get("port") or "-"),
            h.get("python", "python3"),
            ",".join(h.get("tags", [])) or "-",
        )
    out().print(table)
    d, lim = fleet["defaults"], fleet["limits"]
    out().print(
        Text(
            f"limits: {lim['max_chars']:,} chars, burst {lim['bucket_size']} then {lim['bucket_refill_per_s']:g}/s, "
            f"duplicates refused within {lim['duplicate_window_s']:g}s · timeouts: connect {d['connect_timeout']:g}s, "
            f"request {d['request_timeout']:g}s · concurrency {d['concurrency']}",
            style="dim",
        )
    )
    if fleet.get("engines"):
        out().print(Text("engine profiles overridden: " + ", ".join(sorted(fleet["engines"])), style="dim"))
    for name, a in sorted((fleet.get("adapters") or {}).items()):  # `adapter:NAME` receivers, a line each
        out().print(Text(f"adapter:{name}  {shlex.join([a['command'], *a['args']])}  (timeout {a['timeout']:g}s)"))


def _mark(value: bool | None) -> Text:
    if value is None:
        return Text("·", style="dim")
    return Text("yes", style="green") if value else Text("NO", style="bold red")


# drover's MCP server registered with each engine found on a host: `claude`, `codex NO`, `claude ?` (unreadable).
MCP_MARK = {True: "", False: " NO", None: " ?"}


def fleet_check(data: dict[str, Any]) -> None:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("HOST", "REACH", "KEY", "AUTH", "SHELL", "PYTHON", "TMUX", "ENGINES", "MCP", "CONNECT", "RTT", "PROBLEM"):
        table.add_column(col, no_wrap=col != "PROBLEM", overflow="fold")
    for row in data.get("hosts", []):
        engines = ", ".join(f"{k}×{v}" for k, v in sorted((row.get("engines") or {}).items())) or "-"
        python = row.get("python") or ("NO" if row.get("python") is False else "-")
        problem = row.get("error", {})
        table.add_row(
            row["host"],
            _mark(row.get("reachable")),
            _mark(row.get("host_key")),
            _mark(row.get("auth")),
            _mark(row.get("shell")),
            Text(str(python), style="bold red" if python == "NO" else ""),
            (row.get("tmux") or "-").replace("tmux ", ""),
            engines,
            ", ".join(f"{k}{MCP_MARK[v]}" for k, v in sorted((row.get("mcp") or {}).items())) or "-",
            f"{row['connect_ms']:.0f} ms" if row.get("connect_ms") is not None else "-",
            f"{row['rtt_ms']:.0f} ms" if row.get("rtt_ms") is not None else "-",
            Text(error_line(problem) if problem else "", style="red"),
        )
    out().print(table)
    for row in data.get("hosts", []):
        for w in row.get("warnings") or []:
            err().print(Text(f"warning: {row['host']}: {w.get('message', w) if isinstance(w, dict) else w}"), style="yellow")
        for stale in row.get("stale_claude_sessions") or []:
            err().print(
                Text(f"warning: {row['host']}: stale Claude session record {stale['record']}: {stale['reason']}"), style="yellow"
            )
    for row in data.get("hosts", []):
        _master_line(row)
    bad = [r["host"] for r in data.get("hosts", []) if not r.get("ok")]
    if bad:
        err().print(Text(f"drover: {len(bad)} host(s) failed the check: {', '.join(bad)}"), style="red")


def _master_line(row: dict[str, Any]) -> None:
    """A `transport = "openssh"` host's master: up, or the command that opens it."""
    if row.get("transport") != "openssh":
        return
    host, state = row["host"], row.get("master")
    if state == "up":
        out().print(Text(f"{host}: OpenSSH master up ({row.get('control_path')})"))
    elif state is None:
        err().print(Text(f"{host}: OpenSSH master unknown: {row.get('master_error')}"), style="yellow")
    elif state == "not answering":  # `drover connect` refuses to open another while this one holds the socket
        from drover.transport.openssh_master import find_master

        err().print(
            Text(
                f"{host}: the OpenSSH master at {row.get('control_path')} accepts but does not answer (stopped or "
                f"wedged): kill its process (`{find_master(str(row.get('control_path')))}` finds it; `ssh -O exit` "
                f"cannot reach it), then `drover connect {host}`"
            ),
            style="yellow",
        )
    elif row.get("master_blocked"):  # something `drover connect` refuses to remove: it cannot open one there
        err().print(Text(f"{host}: no OpenSSH master: {row['master_blocked']}"), style="yellow")
    elif (row.get("error") or {}).get("code") in _UNREACHED:  # no login even began: a master cannot help
        err().print(Text(f"{host}: no OpenSSH master ({state}); ssh does not reach the host, so a master cannot help yet"))
    elif row.get("ok"):  # the login worked without one (a key, a Kerberos ticket): a master would only be faster
        out().print(Text(f"{host}: no OpenSSH master ({state}); logins work without one; `drover connect {host}` opens one"))
    else:
        err().print(
            Text(f"{host}: no OpenSSH master ({state}): open it with `drover connect {host}` (runs: {row.get('connect')})"),
            style="yellow",
        )
    if row.get("control_path_note"):
        err().print(Text(f"{host}: {row['control_path_note']}"), style="yellow")


# Codes for a host ssh never reached (no name, nothing listening, no route): `drover connect` would fail the same.
_UNREACHED = {"dns", "connection_refused", "unreachable", "connect_timeout", "proxy_jump_failed"}


def waited(data: dict[str, Any]) -> None:
    session = data.get("session") or {}
    where = f"{data['host']}:{session.get('name') or session.get('id')}"
    if data.get("reached"):
        out().print(Text(f"{where} is {data['state']} (after {data['waited_s']:.1f}s; {data['how']})"))
    elif data.get("state") == "exited":
        err().print(
            Text(f"drover: {where} exited after {data['waited_s']:.1f}s: it will not be {data['until']} ({data['how']})"),
            style="red",
        )
    else:
        err().print(Text(f"drover: {where} is still {data['state']} after {data['waited_s']:.1f}s ({data['how']})"), style="red")


ROLE_STYLE = {"user": "bold", "assistant": "cyan", "peer": "magenta", "tool": "dim"}


def transcript(data: dict[str, Any]) -> None:
    events = data.get("events", [])
    for e in events:
        if "role" not in e:  # --raw without --json
            out().print(Text(json.dumps(e, ensure_ascii=False)), soft_wrap=True)
            continue
        who = e["role"] + (f" ({e['from']})" if e.get("from") else "")
        stamp = (e.get("time") or "")[:19].replace("T", " ")
        if e.get("untrusted"):
            # A bot's words, under a heading of their own: each line (and each wrap of one) in a marked, indented
            # column, so no line of a reply can pass for an entry of someone else's.
            from drover.bots.untrusted import display_lines

            style = ROLE_STYLE.get(e["role"], "yellow")
            out().print(Text.assemble((f"{stamp} ", "dim"), (f"{who} [untrusted]:", style)))
            grid = Table.grid(padding=(0, 1))
            grid.add_column(no_wrap=True, style=style)
            grid.add_column(overflow="fold")
            for line in display_lines(e.get("text", "")):
                grid.add_row("  │", Text(line))
            out().print(grid)
            continue
        out().print(Text.assemble((f"{stamp} ", "dim"), (f"{who}: ", ROLE_STYLE.get(e["role"], "")), e.get("text", "")))
    shown = len(events)
    out().print(Text(f"{shown} of {data.get('matched', shown)} matching events · {data.get('path')}", style="dim"))


class FanOutProgress:
    """Called once per host as it answers; shows a bar only when there are more than a few hosts."""

    def __init__(self, threshold: int = 4) -> None:
        self.threshold = threshold
        self.console = err()  # the invocation's, taken now: whichever thread the op calls back from
        self.bar: Progress | None = None
        self.task: Any = None

    def __call__(self, host: str, done: int, total: int) -> None:
        if total < self.threshold:
            return
        if self.bar is None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(
                TextColumn("hosts"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.description}"),
                console=self.console,
                transient=True,
            )
            self.bar.start()
            self.task = self.bar.add_task("", total=total)
        self.bar.update(self.task, completed=done, description=f"last: {host}")
        if done >= total:
            self.bar.stop()
