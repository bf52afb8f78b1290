"""--raw only where the text is text: real bash, zsh, fish and tcsh in real tmux panes, in each line-editing mode.

A shell's line editor in a vi command mode takes a paste's bytes as commands (bash: `k` recalls the last command,
`v` runs it through $EDITOR, no Enter needed); drover must see that before anything is pasted."""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import drover
from drover.remote import line_editor
from tests.conftest import Tmux, stays, wait_for


def send(address: str, text: str, **extra: Any) -> Any:
    return drover.run("sessions.message", {"id": address, "text": text, "raw": True, **extra}, actor="tester")


def which(shell: str) -> str:
    path = shutil.which(shell)
    if path is None:
        pytest.fail(f"{shell} is not installed (the README's test command installs it)")
    return path


def start(tmux: Tmux, home: Path, name: str, shell: str, prompt_ends: str, env: str = "") -> Any:
    """A shell as a person runs it: its own HOME, history on, a prompt of its own."""
    home.mkdir(exist_ok=True)
    # fish's first start in a new HOME runs a completion generator in the background, in its own process group
    # (drover refuses while another program shares the shell's group); an existing user has them already.
    (home / ".local/share/fish/generated_completions").mkdir(parents=True, exist_ok=True)
    rc = " --norc" if shell == "bash" else ""  # Debian's /etc/bash.bashrc sets a PS1 of its own
    cmd = f"env -i HOME={home} TERM=screen PATH={os.environ['PATH']} {env} {which(shell)}{rc}"
    pane = tmux.start(name, cmd)
    wait_for(lambda: pane.screen().rstrip().endswith(prompt_ends), what=f"{shell}'s prompt")
    return pane


def type_line(pane: Any, line: str, prompt_ends: str) -> None:
    """A person typing a command and pressing Enter, then the prompt back."""
    before = pane.screen().count(line)
    pane.tmux("send-keys", "-t", pane.id, "-l", line)
    pane.tmux("send-keys", "-t", pane.id, "Enter")
    wait_for(lambda: pane.screen().count(line) > before and pane.screen().rstrip().endswith(prompt_ends), what=line)


def editor_says(pane: Any, shell: str) -> Any:
    """What drover reads of the shell's line editor (used to wait until the shell took a person's Esc)."""
    pid = int(pane.tmux("display", "-p", "-t", pane.id, "#{pane_pid}").strip())
    return line_editor.refusal(shell, pid, os.readlink(f"/proc/{pid}/fd/0"), pane.screen())


def test_bash_in_vi_command_mode_gets_nothing_typed(tmux: Tmux, isolated: Path) -> None:
    """The stranger's finding: `set -o vi`, Esc, and a paste of "kvetching ..." recalled and ran the last command."""
    home = isolated / "bashhome"
    recalled = isolated / "recalled.txt"
    pane = start(tmux, home, "vicmd", "bash", "$", f"PS1='$ ' EDITOR=true VISUAL=true HISTFILE={home}/hist")
    type_line(pane, "set -o vi", "$")
    type_line(pane, f"touch {recalled}", "$")
    recalled.unlink()
    pane.tmux("send-keys", "-t", pane.id, "Escape")  # a person leaves insert mode
    wait_for(lambda: editor_says(pane, "bash") is not None, what="bash to take the Esc")
    doc = send(pane.address, "kvetching about the build")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "keys_not_text"), doc.data
    assert "vi command mode" in doc.data["detail"] and not doc.data.get("pasted")
    stays(lambda: not recalled.exists(), what="no command recalled and run")
    assert pane.screen().rstrip().endswith("$")  # nothing typed at the prompt
    # Back in insert mode (the person presses i) the same text is text: typed, and run with Enter.
    pane.tmux("send-keys", "-t", pane.id, "i")
    wait_for(lambda: editor_says(pane, "bash") is None, what="bash back in insert mode")
    marker = isolated / "insert.txt"
    doc = send(pane.address, f"echo kvetching > {marker}")
    assert doc.data["outcome"] == "delivered", (doc.data["code"], doc.data["detail"])
    wait_for(marker.exists, what="the line to run")
    assert not recalled.exists()


def test_zsh_in_vi_mode_is_refused_and_in_emacs_delivered(tmux: Tmux, isolated: Path) -> None:
    """zsh's bracketed paste cannot be read from outside: in vi mode (insert or command) a binding could turn pasted
    keys into commands, so only emacs mode gets text."""
    home = isolated / "zshhome"
    pane = start(tmux, home, "zvi", "zsh", "%", "PS1='%% '")
    marker = isolated / "zsh.txt"
    doc = send(pane.address, f"echo emacs > {marker}")
    assert doc.data["outcome"] == "delivered", (doc.data["code"], doc.data["detail"])
    wait_for(marker.exists, what="zsh to run the line")
    type_line(pane, "bindkey -v", "%")
    viins = isolated / "zsh1.txt"
    doc = send(pane.address, f"echo viins > {viins}")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "keys_not_text"), doc.data
    assert "vi mode" in doc.data["detail"]
    pane.tmux("send-keys", "-t", pane.id, "Escape")
    wait_for(lambda: "vicmd" in (editor_says(pane, "zsh") or ""), what="zsh to take the Esc")
    second = isolated / "zsh2.txt"
    doc = send(pane.address, f"echo vicmd > {second}")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "keys_not_text"), doc.data
    assert "vicmd" in doc.data["detail"]
    stays(lambda: not second.exists() and not viins.exists(), what="nothing run")
    assert pane.screen().rstrip().endswith("%")


def test_zsh_vi_insert_without_bracketed_paste_and_a_jk_binding_runs_nothing(tmux: Tmux, isolated: Path) -> None:
    """The stranger's zsh: viins, zle_bracketed_paste unset, `jk` bound to vi-cmd-mode: each pasted byte a key."""
    home = isolated / "zshjk"
    pane = start(tmux, home, "zjk", "zsh", "%", f"PS1='%% ' HISTFILE={home}/hist")
    recalled = isolated / "zrecalled.txt"
    type_line(pane, "bindkey -v; unset zle_bracketed_paste; bindkey -M viins jk vi-cmd-mode", "%")
    type_line(pane, f"touch {recalled}", "%")
    recalled.unlink()
    doc = send(pane.address, "ajk kkv")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "keys_not_text"), doc.data
    stays(lambda: not recalled.exists() and pane.screen().rstrip().endswith("%"), what="no history recalled")


@pytest.mark.parametrize("keys", [["Escape"], ["C-x"], ["C-v"]])
def test_zsh_in_the_middle_of_a_key_sequence_gets_nothing(tmux: Tmux, isolated: Path, keys: list[str]) -> None:
    """zsh's emacs keymap after Esc, C-x or C-v waits for the next key: a paste would finish the sequence."""
    pane = start(tmux, isolated / "zshseq", "zseq", "zsh", "%", "PS1='%% '")
    before = pane.screen().rstrip()
    pane.tmux("send-keys", "-t", pane.id, *keys)
    wait_for(lambda: editor_says(pane, "zsh") is not None, what="zsh to take the key")
    marker = isolated / "zseq.txt"
    doc = send(pane.address, f"echo X > {marker}")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "keys_not_text"), doc.data
    assert "key sequence" in doc.data["detail"]
    stays(lambda: not marker.exists() and pane.screen().rstrip() == before, what="nothing typed")


def test_zsh_with_a_draft_gets_nothing(tmux: Tmux, isolated: Path) -> None:
    pane = start(tmux, isolated / "zshdraft", "zdraft", "zsh", "%", "PS1='%% '")
    pane.tmux("send-keys", "-t", pane.id, "-l", "~/bin%")
    wait_for(lambda: "~/bin%" in pane.screen(), what="the draft")
    marker = isolated / "zdraft.txt"
    doc = send(pane.address, f"echo X > {marker}")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "draft_in_input"), doc.data
    stays(lambda: not marker.exists(), what="nothing run")


def bash_pane(tmux: Tmux, isolated: Path, name: str) -> Any:
    home = isolated / name
    return start(tmux, home, name, "bash", "$", f"PS1='$ ' EDITOR=true VISUAL=true HISTFILE={home}/hist")


def test_bash_vi_insert_without_bracketed_paste_and_a_jk_binding_runs_nothing(tmux: Tmux, isolated: Path) -> None:
    """The stranger's worst: without bracketed paste each byte is a key even in vi insert mode; `jk` switched to
    command mode, `k` recalled the last command and `v` ran it through $EDITOR -- with no Enter from drover."""
    pane = bash_pane(tmux, isolated, "bashjk")
    recalled = isolated / "recalled.txt"
    type_line(pane, "set -o vi; bind 'set enable-bracketed-paste off'; bind -m vi-insert '\"jk\": vi-movement-mode'", "$")
    type_line(pane, f"touch {recalled}", "$")
    recalled.unlink()
    doc = send(pane.address, "ajk kkv")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "keys_not_text"), doc.data
    assert "bracketed paste off" in doc.data["detail"]
    stays(lambda: not recalled.exists() and pane.screen().rstrip().endswith("$"), what="no command recalled and run")
    # With bracketed paste back on, vi insert mode takes the paste as text.
    type_line(pane, "bind 'set enable-bracketed-paste on'", "$")
    marker = isolated / "bracketed.txt"
    doc = send(pane.address, f"echo ajk > {marker}")
    assert doc.data["outcome"] == "delivered", (doc.data["code"], doc.data["detail"])
    wait_for(marker.exists, what="the line to run")
    assert marker.read_text() == "ajk\n" and not recalled.exists()


@pytest.mark.parametrize("draft", ["~/bin$", "   "])
def test_bash_draft_that_looks_like_the_prompt_gets_nothing(tmux: Tmux, isolated: Path, draft: str) -> None:
    """A person's `~/bin$` (or three spaces) after a `$ ` prompt reads as part of the prompt on screen; readline's
    line buffer says otherwise."""
    pane = bash_pane(tmux, isolated, "bashdraft")
    pane.tmux("send-keys", "-t", pane.id, "-l", draft)
    wait_for(lambda: editor_says(pane, "bash") is not None, what="bash to take the draft")
    before = pane.screen().rstrip()
    assert before.endswith("$")  # on screen the draft passes for (part of) the prompt
    marker = isolated / "draft.txt"
    doc = send(pane.address, f"echo X > {marker}")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "draft_in_input"), doc.data
    stays(lambda: not marker.exists(), what="nothing run")
    assert pane.screen().rstrip() == before


@pytest.mark.parametrize("keys", [["Escape"], ["C-x"], ["C-v"]])
def test_bash_in_the_middle_of_a_key_sequence_gets_nothing(tmux: Tmux, isolated: Path, keys: list[str]) -> None:
    """readline keeps its keymap at emacs_standard while it waits for the key after Esc, C-x or C-v: its key
    sequence length shows the pending key."""
    pane = bash_pane(tmux, isolated, "bashseq")
    before = pane.screen().rstrip()
    pane.tmux("send-keys", "-t", pane.id, *keys)
    wait_for(lambda: editor_says(pane, "bash") is not None, what="bash to take the key")
    marker = isolated / "seq.txt"
    doc = send(pane.address, f"echo X > {marker}")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "keys_not_text"), doc.data
    assert "key sequence" in doc.data["detail"]
    stays(lambda: not marker.exists() and pane.screen().rstrip() == before, what="nothing typed")


def test_bash_read_question_imitating_the_prompt_gets_nothing(tmux: Tmux, isolated: Path) -> None:
    """`read -p "$ "` looks like the prompt; bash's readline is not reading then (the terminal in canonical mode)."""
    pane = bash_pane(tmux, isolated, "bashread")
    got = isolated / "answer.txt"
    pane.tmux("send-keys", "-t", pane.id, "-l", f'read -p "$ " answer; echo "$answer" > {got}')
    pane.tmux("send-keys", "-t", pane.id, "Enter")
    wait_for(lambda: editor_says(pane, "bash") is not None and pane.screen().rstrip().endswith("$"), what="the question")
    doc = send(pane.address, "echo X")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "not_at_prompt"), doc.data
    stays(lambda: not got.exists(), what="the question unanswered")


def test_fish_at_its_default_prompt_gets_a_line_in_any_bind_mode(tmux: Tmux, isolated: Path) -> None:
    """fish's own prompt (`user@host ~> `, `[N] ` first in vi bindings) and its paste, bound in every bind mode."""
    home = isolated / "fishhome"
    pane = start(tmux, home, "fish", "fish", ">" if os.getuid() else "#", "USER=tester")
    marker = isolated / "fish.txt"
    doc = send(pane.address, f"echo fish > {marker}")
    assert doc.data["outcome"] == "delivered", (doc.data["code"], doc.data["detail"])
    wait_for(marker.exists, what="fish to run the line")
    end = ">" if os.getuid() else "#"
    type_line(pane, "fish_vi_key_bindings", end)
    pane.tmux("send-keys", "-t", pane.id, "Escape")
    wait_for(lambda: pane.screen().rstrip().splitlines()[-1].startswith("[N]"), what="fish's normal mode")
    second = isolated / "fish2.txt"
    doc = send(pane.address, f"echo normal > {second}")
    assert doc.data["outcome"] == "delivered", (doc.data["code"], doc.data["detail"])
    wait_for(second.exists, what="fish to run the pasted line in normal mode")
    assert second.read_text() == "normal\n"


def test_fish_with_a_persons_draft_gets_nothing(tmux: Tmux, isolated: Path) -> None:
    home = isolated / "fishhome"
    pane = start(tmux, home, "fishdraft", "fish", ">" if os.getuid() else "#", "USER=tester")
    pane.tmux("send-keys", "-t", pane.id, "-l", "git push --force")
    wait_for(lambda: "git push --force" in pane.screen(), what="the draft")
    doc = send(pane.address, "echo hello")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "not_at_prompt"), doc.data


def vouch_tcsh(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The user's word that their tcsh never uses vi bindings (drover cannot read tcsh's mode)."""
    fleet = isolated / "fleet.toml"
    fleet.write_text("[engines.shell]\ntcsh_emacs = true\n")
    monkeypatch.setenv("DROVER_FLEET", str(fleet))


def test_tcsh_at_its_default_prompt_gets_a_line_and_its_vi_bindings_refuse(
    tmux: Tmux, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tcsh's default prompt (`host:~> `, `host:~# ` for root, from Debian's /etc/csh.cshrc) takes a line typed as
    keys where the user vouched for emacs bindings; once vi bindings show, Esc would make those keys commands."""
    vouch_tcsh(isolated, monkeypatch)
    home = isolated / "tcshhome"
    end = ">" if os.getuid() else "#"
    pane = start(tmux, home, "tcsh", "tcsh", end)
    marker = isolated / "tcsh.txt"
    doc = send(pane.address, f"echo tcsh > {marker}")
    assert doc.data["outcome"] == "delivered", (doc.data["code"], doc.data["detail"])
    wait_for(marker.exists, what="tcsh to run the line")
    type_line(pane, "bindkey -v", end)
    second = isolated / "tcsh2.txt"
    doc = send(pane.address, f"echo vi > {second}")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "keys_not_text"), doc.data
    stays(lambda: not second.exists(), what="nothing run")
    # The same from its startup file, with nothing on screen to show it.
    (home / ".tcshrc").write_text("source /etc/csh.cshrc\nbindkey -v  # vi keys\n")
    fresh = start(tmux, home, "tcshrc", "tcsh", end)
    doc = send(fresh.address, f"echo rc > {second}")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "keys_not_text"), doc.data
    assert ".tcshrc" in doc.data["detail"]
    # And from a file the .tcshrc sources.
    (home / ".tcsh_keys").write_text("bindkey -v\n")
    (home / ".tcshrc").write_text("source /etc/csh.cshrc\nsource ~/.tcsh_keys\n")
    third = start(tmux, home, "tcshsrc", "tcsh", end)
    doc = send(third.address, f"echo src > {second}")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "keys_not_text"), doc.data
    assert ".tcsh_keys" in doc.data["detail"]
    stays(lambda: not second.exists(), what="nothing run")


def test_tcsh_vi_bindings_cleared_off_screen_run_nothing(tmux: Tmux, isolated: Path) -> None:
    """The stranger's `bindkey -v; clear`, Esc: vi command mode with no trace drover can read.  Unvouched tcsh
    gets nothing, and the refusal says how to vouch."""
    home = isolated / "tcshclear"
    end = ">" if os.getuid() else "#"
    pane = start(tmux, home, "tcshclr", "tcsh", end)
    recalled = isolated / "trecalled.txt"
    type_line(pane, f"touch {recalled}", end)
    recalled.unlink()
    pane.tmux("send-keys", "-t", pane.id, "-l", "bindkey -v; clear")
    pane.tmux("send-keys", "-t", pane.id, "Enter")
    wait_for(lambda: "bindkey" not in pane.screen() and pane.screen().rstrip().endswith(end), what="the screen cleared")
    pane.tmux("send-keys", "-t", pane.id, "Escape")
    doc = send(pane.address, "kkv")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "keys_not_text"), doc.data
    assert "tcsh_emacs" in doc.data["detail"]
    stays(lambda: not recalled.exists() and "touch" not in pane.screen(), what="no history recalled")


FAKE_KSH = """import sys, termios, tty
tty.setcbreak(0)  # a line editor of its own: the terminal out of canonical mode, keys read one by one
sys.stdout.write("$ ")
sys.stdout.flush()
line = sys.stdin.readline()
open(sys.argv[1], "w").write(line)
"""


def test_a_shell_whose_line_editor_drover_does_not_know_is_refused(tmux: Tmux, isolated: Path) -> None:
    """A `ksh` drover cannot read (here a stand-in: a program named ksh reading keys out of canonical mode, as
    ksh's and mksh's vi and emacs modes do): refused on doubt, nothing typed."""
    bindir = isolated / "kbin"
    bindir.mkdir()
    (bindir / "ksh").symlink_to(Path(os.path.realpath(sys.executable)))  # the interpreter itself, named ksh
    script = isolated / "ksh.py"
    script.write_text(FAKE_KSH)
    got = isolated / "ksh.txt"
    pane = tmux.start("ksh", f"{bindir / 'ksh'} {script} {got}")
    wait_for(lambda: pane.screen().rstrip().endswith("$"), what="the stand-in's prompt")
    doc = send(pane.address, "echo hello")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "keys_not_text"), doc.data
    assert "ksh's line editor is not one drover knows" in doc.data["detail"]
    stays(lambda: not got.exists() and pane.screen().rstrip().endswith("$"), what="nothing typed")


def test_bash_under_the_name_sh_is_read_as_bash(tmux: Tmux, isolated: Path) -> None:
    """sh is bash on some systems: its line editor is readline all the same, read and refused in vi command mode."""
    bindir = isolated / "shbin"
    bindir.mkdir()
    (bindir / "sh").symlink_to(which("bash"))
    pane = tmux.start("sh", f"env PS1='$ ' {bindir / 'sh'} --norc")
    wait_for(lambda: pane.screen().rstrip().endswith("$"), what="sh's prompt")
    marker = isolated / "sh.txt"
    doc = send(pane.address, f"echo emacs > {marker}")
    assert doc.data["outcome"] == "delivered", (doc.data["code"], doc.data["detail"])
    wait_for(marker.exists, what="the line to run")
    type_line(pane, "set -o vi", "$")
    pane.tmux("send-keys", "-t", pane.id, "Escape")
    wait_for(lambda: editor_says(pane, "sh") is not None, what="bash to take the Esc")
    doc = send(pane.address, "kvetching")
    assert (doc.data["outcome"], doc.data["code"]) == ("refused", "keys_not_text"), doc.data


def test_dash_runs_no_line_editor_and_gets_a_line(tmux: Tmux, isolated: Path) -> None:
    """dash runs no line editor (the terminal collects the line, canonical mode): a line is text there."""
    pane = start(tmux, isolated / "dashhome", "dash", "dash", "$", "PS1='$ '")
    marker = isolated / "dash.txt"
    doc = send(pane.address, f"echo dash > {marker}")
    assert doc.data["outcome"] == "delivered", (doc.data["code"], doc.data["detail"])
    wait_for(marker.exists, what="dash to run the line")


# -- over SSH, as the users whose login shells these are (not root: the line editor read as its own user) ----------


def as_user(user: str, command: str) -> str:
    proc = subprocess.run(
        ["su", "-s", "/bin/sh", user, "-c", f"env -u TMUX_TMPDIR -u TMUX {command}"], capture_output=True, text=True, timeout=10
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def user_pane(user: str, shell: str, home: Path) -> Callable[..., str]:
    """A pane of the user's own tmux server running their shell as Debian sets it up (its default prompt);
    returns a runner of tmux commands on it."""
    as_user(user, "tmux -L drraw kill-server 2>/dev/null; true")
    as_user(user, f"tmux -L drraw new-session -d -s raw -x 160 -y 40 -c {home} 'exec {which(shell)}'")

    def run(*args: str) -> str:
        return as_user(user, "tmux -L drraw " + " ".join(shlex.quote(a) for a in args))

    return run


@pytest.mark.parametrize("shell", ["bash", "tcsh", "fish"])
def test_over_ssh_a_users_own_shell_at_its_default_prompt_gets_a_line(shell: str, sshfleet: Any) -> None:
    if os.geteuid() != 0:
        pytest.skip("logging in as the test users of the fleet needs root (CI runs as root)")
    user = sshfleet.shell_user(shell)
    home = Path(pwd.getpwnam(user).pw_dir)
    marker = home / "raw-ssh.txt"
    marker.unlink(missing_ok=True)
    for rc in (".tcshrc", ".bashrc"):
        (home / rc).unlink(missing_ok=True)
    (home / ".local/share/fish/generated_completions").mkdir(parents=True, exist_ok=True)
    subprocess.run(["chown", "-R", f"{user}:", str(home)], check=True)
    tmux = user_pane(user, shell, home)
    try:
        wait_for(lambda: tmux("capture-pane", "-p", "-t", "raw").rstrip().endswith(("$", ">")), what=f"{shell}'s prompt")
        vouch = "[engines.shell]\ntcsh_emacs = true\n" if shell == "tcsh" else ""
        sshfleet.fleet_file.write_text(sshfleet.fleet_toml(f'[hosts.colleague]\nssh = "h1"\nuser = "{user}"\n' + vouch))
        doc = drover.run(
            "sessions.message", {"host": "colleague", "id": "raw", "text": f"echo ok > {marker}", "raw": True}, actor="t"
        )
        assert doc.data["outcome"] == "delivered", (doc.data.get("code"), doc.data.get("detail"))
        wait_for(marker.exists, what="the line to run as the user")
        if shell != "bash":
            return
        # The user switches to vi and presses Esc: drover, logged in as that user, reads the mode and refuses.
        recalled = home / "recalled.txt"
        tmux("send-keys", "-t", "raw", "set -o vi", "Enter", f"touch {recalled}", "Enter")
        wait_for(recalled.exists, what="the command to recall")
        recalled.unlink()
        # Its prompt drawn again before Esc: else the guard's first finding is a shell not at its prompt.
        at_prompt = lambda: tmux("capture-pane", "-p", "-t", "raw").rstrip().endswith("$")  # noqa: E731
        wait_for(at_prompt, what="bash's prompt after the command")
        tmux("send-keys", "-t", "raw", "Escape")
        pid = int(tmux("display", "-p", "-t", "raw", "#{pane_pid}"))
        wait_for(
            lambda: line_editor.refusal("bash", pid, os.readlink(f"/proc/{pid}/fd/0"), "") is not None, what="vi command mode"
        )
        doc = drover.run("sessions.message", {"host": "colleague", "id": "raw", "text": "kvetching", "raw": True}, actor="t")
        assert (doc.data["outcome"], doc.data["code"]) == ("refused", "keys_not_text"), doc.data
        stays(lambda: not recalled.exists(), what="no command recalled and run")
    finally:
        tmux("kill-server")


@pytest.mark.parametrize(
    ("shell", "line", "bare"),
    [
        ("tcsh", ">", True),  # tcsh's built-in prompt (no startup files), a non-root user
        ("tcsh", "vm:~>", True),  # Debian's /etc/csh.cshrc
        ("tcsh", "vm:~> ls -la", False),  # a person's half-typed command
        ("fish", "user@host ~>", True),
        ("fish", "[I] user@host ~>", True),
        ("fish", "root@vm /w/main (main)#", True),
        ("fish", "user@host ~> git push", False),
        ("bash", ">", False),  # bash's continuation prompt
        ("zsh", "vm:~>", False),
    ],
)
def test_prompt_lines_per_shell(shell: str, line: str, bare: bool) -> None:
    from drover.remote.tmux_lane import prompt_line

    assert prompt_line(shell, line) is bare
