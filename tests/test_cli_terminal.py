"""What drover prints cannot act on the operator's terminal: control characters in other people's text are shown."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tests.conftest import Tmux, wait_for

# A window title, a screen clear, an OSC 52 clipboard write, a one-byte C1 CSI, a carriage return, a bell,
# a bidi override: all text a sender (or a transcript, or a directory name) can carry.
HOSTILE = "hi\x1b]0;pwned\x07 \x1b[2J\x1b]52;c;cm0gLXJmIH4=\x07 \x9b31m red\r over \u202eevil"
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e]")


def no_controls(text: str) -> None:
    found = RAW.findall(text)
    assert not found, f"raw control characters reached the terminal: {found!r}"


def test_log_and_log_show_render_control_characters_visibly(cli: Any) -> None:
    res = cli("send", "nosuch", HOSTILE)
    assert res.code == 6
    no_controls(res.out + res.err)
    table = cli("log")
    assert table.code == 0
    no_controls(table.out + table.err)
    assert "hi␛]0;pwned␇ ␛[2J␛]52;c;cm0gLXJmIH4=␇" in table.out
    msg_id = cli("log", "--json").json()["data"]["messages"][0]["id"]
    shown = cli("log", "show", msg_id)
    assert shown.code == 0
    no_controls(shown.out + shown.err)
    assert "\\x9b31m red␍ over \\u202eevil" in shown.out
    # --json keeps the text exactly, as JSON escapes: nothing raw on the terminal either
    js = cli("log", "show", msg_id, "--json")
    no_controls(js.out)
    assert js.json()["data"]["message"]["text"] == HOSTILE
    assert "\\u001b]0;pwned\\u0007" in js.out and "\\u009b31m" in js.out


def test_rich_markup_in_a_message_is_just_text(cli: Any) -> None:
    text = "see [/x] and [bold]this[/bold] :warning:"
    assert cli("send", "nosuch", text).code == 6
    res = cli("log")
    assert res.code == 0, res.err
    assert text in res.out
    msg_id = cli("log", "--json").json()["data"]["messages"][0]["id"]
    assert text in cli("log", "show", msg_id).out


def write_rollout(codex_home: Path, rollout_id: str, text: str) -> None:
    day = codex_home / "sessions" / "2026" / "11" / "29"
    day.mkdir(parents=True)
    records = [
        {"timestamp": "2026-11-29T07:00:00.000Z", "type": "session_meta", "payload": {"id": rollout_id, "cwd": "/w"}},
        {
            "timestamp": "2026-11-29T07:00:01.000Z",
            "type": "response_item",
            "payload": {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]},
        },
    ]
    (day / f"rollout-2026-11-29T07-00-00-{rollout_id}.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")


def test_read_renders_transcript_text_visibly(cli: Any, isolated: Path, monkeypatch: Any) -> None:
    rid = "0199a3c2-7f1e-7d40-9b1a-5c2e8f0a4b62"
    write_rollout(isolated / "codex", rid, HOSTILE)
    monkeypatch.setenv("CODEX_HOME", str(isolated / "codex"))
    res = cli("read", rid)
    assert res.code == 0, res.err
    no_controls(res.out + res.err)
    assert "hi␛]0;pwned␇" in res.out
    js = cli("read", rid, "--json")
    assert js.json()["data"]["events"][-1]["text"] == HOSTILE
    no_controls(js.out)


def test_status_and_ls_render_a_hostile_directory_name_visibly(cli: Any, tmux: Tmux, isolated: Path) -> None:
    workdir = isolated / "repo\x1b]0;pwned\x07\x1b[31m"
    workdir.mkdir()
    shell = tmux.start("hostile-dir", f"cd '{workdir}' && exec sleep 600")
    # Until the shell has run its `cd` (under load, a look may come first), the pane's directory is not that one.
    wait_for(lambda: cli("status", shell.id, "--json").json()["data"]["session"]["cwd"] == str(workdir), what="the cd")
    status = cli("status", shell.id)
    assert status.code == 0, status.err
    no_controls(status.out + status.err)
    assert "repo␛]0;pwned␇␛[31m" in status.out
    listing = cli("ls")
    no_controls(listing.out + listing.err)
    assert cli("status", shell.id, "--json").json()["data"]["session"]["cwd"] == str(workdir)
