"""Text on its way to a session: control characters neutralised, and the envelope Claude Code's own sender writes."""

import unicodedata

from .protocol import BAD_REQUEST, HelperError

CLOSING_TAG = "</cross-session-message"


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


def sanitise_name(name: str) -> str:
    """from-name as Claude Code requires: no quotes or angle brackets, no control/format chars, <= 64 chars."""
    kept = [ch for ch in name if ch not in '"<>' and unicodedata.category(ch) not in ("Cc", "Cf")]
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
    safe_body = body.replace(CLOSING_TAG, "<\\/cross-session-message")
    return "<cross-session-message %s>\n%s\n</cross-session-message>" % (" ".join(attrs), safe_body)
