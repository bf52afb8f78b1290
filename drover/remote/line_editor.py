"""What a shell's line editor will make of pasted bytes: text, or commands.

A paste reaches a shell as keys.  Where the line editor reads a bracketed paste as text (bash's readline in emacs
or vi insert mode, zsh's zle in its insert keymaps, fish in every bind mode) or no line editor runs at all (the
terminal in canonical mode: dash, sh), the text is text.  Elsewhere each byte is a key, and in a vi command mode a
key is a command: `k` recalls the last command, `v` opens an editor, `ZZ` runs it -- no Enter needed.  Facts
checked on bash 5.2, zsh 5.9, fish 3.6 and tcsh 6.24 under tmux 3.3a:

- tmux 3.3 does not tell whether a program asked for bracketed paste, and readline binds the paste only in its
  emacs and vi insert keymaps: in vi command mode a bracketed paste is typed as commands.  Nothing on screen shows
  the mode (unless the user turned show-mode-in-prompt on), so it is read where bash keeps it: bash exports
  readline's variables (`_rl_keymap`, `rl_editing_mode`) for its loadable builtins, and /proc/PID/mem gives their
  values to the same user.  zsh keeps its keymap name in zle.so's `curkeymapname`.  Read-only, a few bytes.
- fish binds the paste in every bind mode (its __fish_shared_key_bindings): text whatever the mode.
- tcsh has no bracketed paste and keeps its state unexported: the text is typed as keys, safe in emacs bindings;
  its vi bindings are refused where drover can see them (its startup files, a `bindkey -v` on screen).

What cannot be read is doubt, and doubt refuses.
"""

import os
import re
import struct
import termios
from typing import Dict, List, Optional, Pattern, Tuple

from . import protocol as P

Symbols = Dict[str, int]
_SYMBOLS = {}  # type: Dict[Tuple[str, float, Tuple[str, ...]], Symbols]


def _dynamic_symbols(path: str, want: List[str]) -> Symbols:
    """The addresses (relative to the load base) of the wanted dynamic symbols of a 64-bit little-endian ELF file;
    {} for anything else.  Cached per file and modification time: the helper may live long."""
    try:
        key = (path, os.stat(path).st_mtime, tuple(sorted(want)))  # per wanted list: callers want different symbols
    except OSError:
        return {}
    if key in _SYMBOLS:
        return _SYMBOLS[key]
    found = {}  # type: Symbols
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                return {}
            shoff = struct.unpack_from("<Q", head, 0x28)[0]
            shentsize, shnum = struct.unpack_from("<HH", head, 0x3A)
            f.seek(shoff)
            table = f.read(shentsize * shnum)
            sections = [struct.unpack_from("<IIQQQQIIQQ", table, i * shentsize) for i in range(shnum)]
            for sec in sections:
                if sec[1] != 11:  # SHT_DYNSYM
                    continue
                strsec = sections[sec[6]]
                f.seek(strsec[4])
                names = f.read(strsec[5])
                f.seek(sec[4])
                syms = f.read(sec[5])
                wanted = set(w.encode() for w in want)
                for k in range(len(syms) // 24):
                    name, _info, _other, _shndx, value, _size = struct.unpack_from("<IBBHQQ", syms, k * 24)
                    end = names.find(b"\0", name)
                    if names[name:end] in wanted and value:
                        found[names[name:end].decode()] = value
    except (OSError, struct.error, IndexError):
        return {}
    _SYMBOLS[key] = found
    return found


def _mapped(pid: int) -> Dict[str, int]:
    """Each file mapped into the process, and where its first page was loaded (the base its symbols count from)."""
    bases = {}  # type: Dict[str, int]
    with open("/proc/%d/maps" % pid) as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/") and int(parts[2], 16) == 0:
                bases.setdefault(parts[5].rstrip("\n"), int(parts[0].split("-")[0], 16))
    return bases


def _read(pid: int, address: int, size: int) -> bytes:
    with open("/proc/%d/mem" % pid, "rb") as mem:
        mem.seek(address)
        return mem.read(size)


def _locate(pid: int, which: Pattern[str], want: List[str]) -> Tuple[int, Symbols]:
    """(load base, symbols) of the first mapped file whose name matches `which` and that exports `want`."""
    for path, base in _mapped(pid).items():
        if which.search(os.path.basename(path)):
            syms = _dynamic_symbols(path, want)
            if all(w in syms for w in want):
                return base, syms
    raise OSError("no mapped file exports %s" % ", ".join(want))


READLINE = [
    "_rl_keymap",
    "rl_editing_mode",
    "emacs_standard_keymap",
    "vi_insertion_keymap",
    "_rl_enable_bracketed_paste",
    "rl_end",
    "rl_key_sequence_length",
    "rl_readline_state",
]
RL_STATE_TERMPREPPED = 0x4  # readline is reading the line (bash's own prompt), not `read -p` or a lone terminal
RL_STATE_MOREINPUT = 0x40  # readline waits for the rest of a key sequence (after Esc, C-x, C-v)


def _int(pid: int, address: int) -> int:
    return struct.unpack("<i", _read(pid, address, 4))[0]


def _bash(pid: int) -> Optional[Tuple[str, str]]:
    # Readline lives in bash itself (Debian builds it in) or in libreadline.so (some distributions link it).
    base, syms = _locate(pid, re.compile(r"^(bash|libreadline\.so)"), READLINE)
    state = _int(pid, base + syms["rl_readline_state"])
    if not state & RL_STATE_TERMPREPPED:
        # An interactive bash whose readline is not reading runs something else at the prompt's look-alike: a
        # `read -p "$ "` question (the terminal in canonical mode), or no line editing at all -- doubt.
        return P.NOT_AT_PROMPT, "bash's line editor is not reading its prompt (a `read -p` question imitating the prompt?)"
    if _int(pid, base + syms["rl_end"]) != 0:
        # A draft that looks like part of the prompt (`~/bin$`, spaces) is still on the line: the text would join it.
        return P.DRAFT_IN_INPUT, "bash's input line already holds a person's draft: the text would be joined to it and run"
    if _int(pid, base + syms["rl_key_sequence_length"]) != 0 or state & RL_STATE_MOREINPUT:
        # readline keeps _rl_keymap at the base keymap while it waits for the key after Esc, C-x or C-v.
        return (
            P.KEYS_NOT_TEXT,
            "bash's line editor is in the middle of a key sequence (Esc, C-x or C-v pressed): the text would finish it",
        )
    keymap = struct.unpack("<Q", _read(pid, base + syms["_rl_keymap"], 8))[0]
    vi = _int(pid, base + syms["rl_editing_mode"]) == 0
    bracketed = _int(pid, base + syms["_rl_enable_bracketed_paste"]) != 0
    if vi and not bracketed:
        # Without bracketed paste each byte is a key even in vi insert mode, and a binding such as `jk` to
        # vi-movement-mode turns the rest of the text into vi commands (`k` recalls, `v` runs: no Enter needed).
        return P.KEYS_NOT_TEXT, (
            "bash is in vi mode with bracketed paste off: every pasted byte would be a key, and a vi binding "
            "could turn the text into commands (turn bracketed paste on, or use emacs mode)"
        )
    if keymap == base + syms["vi_insertion_keymap"] or keymap == base + syms["emacs_standard_keymap"]:
        return None
    if vi:
        return (
            P.KEYS_NOT_TEXT,
            "bash's line editor is in vi command mode: the text would be read as vi commands (k, v, ZZ run things)",
        )
    return (
        P.KEYS_NOT_TEXT,
        "bash's line editor is in the middle of a key sequence (an Esc or Ctrl-X pressed): the text would finish it",
    )


def _zsh(pid: int) -> Optional[Tuple[str, str]]:
    base, syms = _locate(pid, re.compile(r"^zle\.so$"), ["curkeymapname", "curkeymap", "zlell", "keybuflen"])
    if _int(pid, base + syms["zlell"]) != 0:
        return P.DRAFT_IN_INPUT, "zsh's input line already holds a person's draft: the text would be joined to it and run"
    if _int(pid, base + syms["keybuflen"]) != 0:
        # zle keeps the keys of an unfinished sequence (Esc, C-x; C-v's quoted-insert) in keybuf; 0 between commands.
        why = "zsh's line editor is in the middle of a key sequence (Esc, C-x or C-v pressed): the text would finish it"
        return P.KEYS_NOT_TEXT, why
    pointer = struct.unpack("<Q", _read(pid, base + syms["curkeymapname"], 8))[0]
    name = _read(pid, pointer, 16).split(b"\0")[0].decode("ascii", "replace")
    if name not in ("main", "emacs", "viins"):
        why = "zsh's line editor is in its %r keymap, not one that inserts text: the text would be read as commands"
        return P.KEYS_NOT_TEXT, why % name
    # `main` is whichever of emacs and viins the user bound it to.  viins binds C-w and C-h to vi- widgets (struct
    # keymap starts with its 256 Thingy pointers; a thingy's name follows its hash-chain pointer).  zsh's
    # bracketed paste (the zle_bracketed_paste parameter) cannot be read from outside: in vi mode a binding such
    # as `jk` could turn the pasted keys into commands, so vi is refused on doubt.
    keymap = struct.unpack("<Q", _read(pid, base + syms["curkeymap"], 8))[0]
    bound = []  # type: List[str]
    for key in (8, 23):  # C-h, C-w: emacs' backward-delete-char and backward-kill-word, viins' vi-... ones
        thingy = struct.unpack("<Q", _read(pid, keymap + key * 8, 8))[0]
        if thingy:
            nam = struct.unpack("<Q", _read(pid, thingy + 8, 8))[0]
            bound.append(_read(pid, nam, 32).split(b"\0")[0].decode("ascii", "replace"))
    if name == "viins" or any(b.startswith("vi-") for b in bound):
        return P.KEYS_NOT_TEXT, (
            "zsh is in vi mode and drover cannot read whether its bracketed paste is on: pasted bytes could be keys, "
            "and a vi binding could turn the text into commands (use emacs mode: bindkey -e)"
        )
    return None


TCSH_FILES = ["/etc/csh.cshrc", "/etc/csh.login", "~/.tcshrc", "~/.cshrc", "~/.login"]
VI_TYPED = re.compile(r"(^|[\s;])bindkey\s+-v\b")
SOURCED = re.compile(r"(?:^|[\s;])source\s+(?:-h\s+)?(\S+)")


def _home(pid: int) -> str:
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(b"HOME="):
                    return item[5:].decode("utf-8", "replace")
    except OSError:
        pass
    return os.path.expanduser("~")


def _tcsh(pid: int, screen: str, vouched: bool) -> Optional[str]:
    """tcsh takes the text as keys (no bracketed paste): fine in its emacs bindings, commands in vi command mode.
    Its mode is kept where drover cannot read it (`bindkey -v; clear` leaves no trace), so tcsh gets text only when
    the user vouched that it never uses vi bindings, and even then any sign of them refuses."""
    if not vouched:
        return (
            "tcsh takes pasted text as keys and drover cannot read whether its vi bindings are on (a `bindkey -v` "
            "typed and cleared): if this tcsh never uses them, set tcsh_emacs = true under [engines.shell]"
        )
    home = _home(pid)
    paths = [p.replace("~", home, 1) for p in TCSH_FILES]
    try:
        paths += sorted(os.path.join("/etc/csh/cshrc.d", n) for n in os.listdir("/etc/csh/cshrc.d"))
    except OSError:
        pass
    seen = []  # type: List[str]
    while paths and len(seen) < 64:
        path = paths.pop(0)
        if path in seen:
            continue
        seen.append(path)
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                lines = [line.split("#", 1)[0] for line in f.read().splitlines()]
        except OSError:
            continue
        for line in lines:
            # Files sourced from a startup file count as startup files (relative names from the home directory).
            for name in SOURCED.findall(line):
                name = name.strip("'\"").replace("~", home, 1).replace("$HOME", home, 1)
                paths.append(os.path.join(home, name))
        if any(VI_TYPED.search(line) for line in lines):
            return "tcsh takes pasted text as keys, and %s turns on its vi bindings (Esc makes keys commands)" % path
    if any(VI_TYPED.search(line) for line in screen.splitlines()):
        return "tcsh takes pasted text as keys, and a `bindkey -v` on screen turned on its vi bindings"
    return None


def canonical(tty: str) -> Optional[bool]:
    """Is the terminal in canonical mode (the kernel reads a line, no line editor runs)?  None: unreadable."""
    try:
        fd = os.open(tty, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return bool(termios.tcgetattr(fd)[3] & termios.ICANON)
    except termios.error:
        return None
    finally:
        os.close(fd)


def verdict(shell: str, pid: int, tty: str, screen: str, tcsh_emacs: bool = False) -> Optional[Tuple[str, str]]:
    """(outcome code, why) when a paste into this shell at its prompt would not be read as text, or None."""
    try:
        # bash or zsh under another name (sh is bash on some systems): the program, not its name, has the editor.
        exe = os.path.basename(os.readlink("/proc/%d/exe" % pid))
    except OSError:
        exe = shell
    if exe in ("bash", "zsh"):
        shell = exe
    if shell != "bash" and canonical(tty):
        # No line editor: the terminal collects the line, every byte is text until Enter.  (bash's readline state
        # tells its prompt from a `read -p` question; dash's cannot be told apart.)
        return None
    try:
        if shell == "bash":
            return _bash(pid)
        if shell == "zsh":
            return _zsh(pid)
    except (OSError, ValueError, struct.error) as exc:
        why = "cannot read %s's line-editing mode (%s): it might take the text as commands (vi command mode)"
        return P.KEYS_NOT_TEXT, why % (shell, exc)
    if shell == "fish":
        return None
    if shell == "tcsh":
        vi = _tcsh(pid, screen, tcsh_emacs)
        return (P.KEYS_NOT_TEXT, vi) if vi else None
    return (
        P.KEYS_NOT_TEXT,
        "%s's line editor is not one drover knows: it might take the text as commands (vi command mode)" % shell,
    )


def refusal(shell: str, pid: int, tty: str, screen: str) -> Optional[str]:
    """Why a paste into this shell at its prompt would not be read as text, or None when it would."""
    seen = verdict(shell, pid, tty, screen)
    return seen[1] if seen else None
