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

Symbols = Dict[str, int]
_SYMBOLS = {}  # type: Dict[Tuple[str, float], Symbols]


def _dynamic_symbols(path: str, want: List[str]) -> Symbols:
    """The addresses (relative to the load base) of the wanted dynamic symbols of a 64-bit little-endian ELF file;
    {} for anything else.  Cached per file and modification time: the helper may live long."""
    try:
        key = (path, os.stat(path).st_mtime)
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


READLINE = ["_rl_keymap", "rl_editing_mode", "emacs_standard_keymap", "vi_insertion_keymap"]


def _bash(pid: int) -> Optional[str]:
    # Readline lives in bash itself (Debian builds it in) or in libreadline.so (some distributions link it).
    base, syms = _locate(pid, re.compile(r"^(bash|libreadline\.so)"), READLINE)
    keymap = struct.unpack("<Q", _read(pid, base + syms["_rl_keymap"], 8))[0]
    vi = struct.unpack("<i", _read(pid, base + syms["rl_editing_mode"], 4))[0] == 0
    if keymap == base + syms["vi_insertion_keymap"] or keymap == base + syms["emacs_standard_keymap"]:
        return None
    if vi:
        return "bash's line editor is in vi command mode: the text would be read as vi commands (k, v, ZZ run things)"
    return "bash's line editor is in the middle of a key sequence (an Esc or Ctrl-X pressed): the text would finish it"


def _zsh(pid: int) -> Optional[str]:
    base, syms = _locate(pid, re.compile(r"^zle\.so$"), ["curkeymapname"])
    pointer = struct.unpack("<Q", _read(pid, base + syms["curkeymapname"], 8))[0]
    name = _read(pid, pointer, 16).split(b"\0")[0].decode("ascii", "replace")
    # `main` is whichever of emacs and viins the user bound it to; both insert what is typed.
    if name in ("main", "emacs", "viins"):
        return None
    return "zsh's line editor is in its %r keymap, not one that inserts text: the text would be read as commands" % name


TCSH_FILES = ["/etc/csh.cshrc", "/etc/csh.login", "~/.tcshrc", "~/.cshrc", "~/.login"]
VI_TYPED = re.compile(r"(^|[\s;])bindkey\s+-v\b")


def _home(pid: int) -> str:
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(b"HOME="):
                    return item[5:].decode("utf-8", "replace")
    except OSError:
        pass
    return os.path.expanduser("~")


def _tcsh(pid: int, screen: str) -> Optional[str]:
    """tcsh takes the text as keys (no bracketed paste): fine in its emacs bindings, commands in vi command mode.
    Its mode is kept where drover cannot read it, so any sign of vi bindings refuses."""
    home = _home(pid)
    paths = [p.replace("~", home, 1) for p in TCSH_FILES]
    try:
        paths += sorted(os.path.join("/etc/csh/cshrc.d", n) for n in os.listdir("/etc/csh/cshrc.d"))
    except OSError:
        pass
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        if any(VI_TYPED.search(line.split("#", 1)[0]) for line in lines):
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


def refusal(shell: str, pid: int, tty: str, screen: str) -> Optional[str]:
    """Why a paste into this shell at its prompt would not be read as text, or None when it would."""
    if canonical(tty):
        return None  # no line editor: the terminal collects the line, every byte is text until Enter
    try:
        # bash or zsh under another name (sh is bash on some systems): the program, not its name, has the editor.
        exe = os.path.basename(os.readlink("/proc/%d/exe" % pid))
    except OSError:
        exe = shell
    if exe in ("bash", "zsh"):
        shell = exe
    try:
        if shell == "bash":
            return _bash(pid)
        if shell == "zsh":
            return _zsh(pid)
    except (OSError, ValueError, struct.error) as exc:
        return "cannot read %s's line-editing mode (%s): it might take the text as commands (vi command mode)" % (
            shell,
            exc,
        )
    if shell == "fish":
        return None
    if shell == "tcsh":
        return _tcsh(pid, screen)
    return "%s's line editor is not one drover knows: it might take the text as commands (vi command mode)" % shell
