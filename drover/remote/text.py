"""Text on its way to a session: control characters neutralised, and the envelope Claude Code's own sender writes."""

import bisect
import unicodedata
from typing import List

from .protocol import BAD_REQUEST, HelperError

TAG = "cross-session-message"
# `<` and what Claude Code counts as looking like it (its confusables table, read off 2.1.328), plus a few more.
LESS_THAN = (
    "<\u02c2\u1438\u16b2\u2039\u226e\u227a\u2280\u22d6\u2329\u276c\u276e\u2770\u27e8\u2991\u2993\u29fc"
    "\u2a79\u2aa6\u3008\ufe3f\ufe64\uff1c\U0001d236\u226a\u22d8\u2aa1\u2af7\u27ea\ufe3d\u300a"
)


def neutralise(text: str) -> str:
    """Make text safe to paste: no byte of it can act as a key or a terminal control sequence.

    CRLF becomes LF; C0 controls other than tab and newline become their Unicode Control Pictures
    (ESC -> U+241B, Ctrl-C -> U+2403, CR -> U+240D), DEL becomes U+2421 and C1 controls become U+FFFD.
    So an ``ESC[201~`` in the text cannot end a bracketed paste, and nothing in it can press a key.
    """
    text = text.replace("\r\n", "\n")
    out = []
    for ch in text:
        code = ord(ch)
        if ch == "\n" or ch == "\t":
            out.append(ch)
        elif code < 0x20:
            out.append(chr(0x2400 + code))
        elif code == 0x7F:
            out.append("\u2421")
        elif 0x80 <= code <= 0x9F:
            out.append("\ufffd")
        else:
            out.append(ch)
    return "".join(out)


# Letters that look like the tag's letters without being them (Cyrillic, Greek, small capitals, dotless i): a model
# reads `<сross-session-message` (Cyrillic с) as the tag, so drover disarms it as one.
LOOKALIKES = dict(
    zip(
        "асеорухкіјѕԁԛԝһӏвмнтαεικνορτυχϳβζημνυᴀʙᴄᴅᴇꜰɢʜɪᴊᴋʟᴍɴᴏᴘʀꜱᴛᴜᴠᴡʏᴢıɩ",
        "aceopyxkijsdqwhlbmhtaeikvoptuxjbzhmnyabcdefghijklmnoprstuvwyzii",
    )
)


def _letters(text: str) -> List[tuple]:
    """(index, letter) for every character of text that reads as an ASCII letter (NFKC, case-folded, lookalikes)."""
    out = []
    for i, ch in enumerate(text):
        folded = unicodedata.normalize("NFKC", LOOKALIKES.get(ch.lower(), ch)).casefold()
        for letter in folded:
            if "a" <= letter <= "z":
                out.append((i, letter))
    return out


def escape_tags(body: str) -> str:
    """Disarm every opening or closing <cross-session-message tag in the body, and every lookalike of one.

    Claude Code escapes a closing tag in a peer message's body as `<\\/cross-session-message` -- case-insensitively,
    through lookalikes of `<` and `/`, filler characters and invisible ones between the letters -- and then requires
    the envelope it re-renders to equal the one it received.  So drover escapes a superset of what Claude would:
    any `<` or lookalike whose next letters, whatever stands between them, spell the tag.  The body is then left
    alone by Claude's escaper (the round trip holds and the transcript keeps its body), and on the tmux lane no
    forged opening or closing tag reaches the model.  Over-escaping `<1/cross…` costs a backslash, nothing more.
    """
    letters = _letters(body)
    positions = [i for i, _ in letters]
    wanted = TAG.replace("-", "")
    out = []
    for i, ch in enumerate(body):
        out.append(ch)
        if ch not in LESS_THAN or body[i + 1 : i + 2] == "\\":
            continue
        k = bisect.bisect_right(positions, i)
        if "".join(letter for _, letter in letters[k : k + len(wanted)]) == wanted:
            out.append("\\")
    return "".join(out)


def sanitise_name(name: str) -> str:
    """from-name as Claude Code renders it: no quotes or angle brackets, no control, format, surrogate or
    line/paragraph-separator characters, trimmed, at most 64 characters (so its round trip holds)."""
    drop = ("Cc", "Cf", "Cs", "Zl", "Zp")
    kept = [ch for ch in name if ch not in '"<>' and unicodedata.category(ch) not in drop]
    return "".join(kept).strip()[:64].strip()


def envelope(body: str, actor: str, mode: str = "prompting", from_addr: str = "", session: str = "") -> str:
    """The <cross-session-message> wrapping Claude Code's own sender writes, with a fixed attribute order."""
    if mode not in ("prompting", "bypass"):
        raise HelperError(BAD_REQUEST, "from-mode must be 'prompting' or 'bypass', not %r" % mode)
    attrs = []
    if from_addr:
        attrs.append('from="%s"' % from_addr)
    if session:
        attrs.append('from-session="%s"' % session)
    attrs.append('from-name="%s"' % sanitise_name("drover (%s)" % actor))
    attrs.append('from-mode="%s"' % mode)
    return "<%s %s>\n%s\n</%s>" % (TAG, " ".join(attrs), escape_tags(body), TAG)
