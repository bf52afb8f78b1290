"""Text on its way to a session: control characters neutralised, and the envelope Claude Code's own sender writes."""

import re
import unicodedata
from typing import Dict, List

from . import confusables, confusables_multi
from .protocol import BAD_REQUEST, HelperError

TAG = "cross-session-message"


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


# The tags whose lookalikes a message body must not carry: the envelope's own, and the others Claude Code disarms in
# a peer message's body (it drops the body from its record when it had to disarm anything there).
TAGS = ("cross-session-message", "teammate-message", "agent-message", "cited")
OPENERS = frozenset(confusables.OPENERS) | {"\U000e003c"}  # and the TAG character that shadows `<` (below)


def _reading_table() -> Dict[int, str]:
    """str.translate table that writes text as a reader reads it, for the tag search, one symbol per character:

    a letter as its lower-case ASCII self if it is ASCII (`0` and `1` as `o` and `i`, as TR39 reads them), as the
    upper-case letter it reads as if it is not (`с` -> `C`: a letter, but, like anything not ASCII, filler before a
    tag); any `<` as `<`; `\\` as itself; another ASCII digit, `_` or `-` as `0`; any other ASCII as a space.  A
    character that reads as several letters (`ß`) becomes them all.  Anything else is left as it is: read as
    nothing, so filler.  TR39 gives every capital-I lookalike the prototype `l`, and no tag holds an `l`: an `l`
    counts as an `i`, so `SESSΙON` with a Greek capital iota spells the tag.
    """
    table = {}  # type: Dict[int, str]
    for code in range(0x80):
        ch = chr(code)
        table[code] = ch.lower() if ch.isalpha() else "0" if ch.isdigit() or ch in "_-" else " "
    table.update({ord("l"): "i", ord("L"): "i", ord("0"): "o", ord("1"): "i", ord("|"): "I", ord("\\"): "\\"})
    for letter, chars in confusables.READS.items():
        for ch in chars:
            table[ord(ch)] = "I" if letter == "l" else letter.upper()
    for ch, read in confusables_multi.MULTI.items():
        table[ord(ch)] = "".join("I" if c == "l" else c.upper() if "a" <= c <= "z" else " " for c in read)
    for ch in OPENERS:
        table[ord(ch)] = "<"
    # Unicode's TAG characters (U+E0020-U+E007E) are invisible, and no confusable of anything, but a model reads them
    # as the ASCII they shadow: the tag's name spelled in them, after a `<`, is the tag.
    for code in range(0x20, 0x7F):
        ch = chr(code)
        if ch.isalpha():
            table[0xE0000 + code] = "I" if ch in "lLiI" else ch.upper()
        elif ch == "<":
            table[0xE0000 + code] = "<"
        elif ch.isdigit() or ch in "_-":
            table[0xE0000 + code] = "0"
    return table


_READING = _reading_table()
_MULTI = frozenset(confusables_multi.MULTI)
_BETWEEN = "[^a-zA-Z]*"  # between a tag's letters: anything that is not a letter (a hyphen, a space, an invisible)
_SPELLED = "|".join(_BETWEEN.join("[%s%s]" % (c, "I" if c == "i" else c.upper()) for c in tag.replace("-", "")) for tag in TAGS)
# A `<` not already followed by a backslash, then filler (no ASCII letter or digit, `_`, `-` or other `<`), then a
# tag's letters.  Run on the text as _READING writes it.
_OPENS_TAG = re.compile(r"<(?!\\)(?=[^a-z0<]*?(?:%s))" % _SPELLED)


def _index_map(body: str) -> List[int]:
    """Where each symbol of the reading came from in body (a character that reads as several letters is several)."""
    out = []  # type: List[int]
    for i, ch in enumerate(body):
        out.extend([i] * (len(_READING[ord(ch)]) if ch in _MULTI else 1))
    return out


def escape_tags(body: str) -> str:
    """Disarm every opening or closing tag of TAGS in the body, and every lookalike of one, with a `\\` after its `<`.

    Whether a `<` opens a tag is decided on how the text reads, not on a list of tricks: every character reads as
    the letters Unicode's confusables data and normalisation (NFKD without marks, NFKC, case folding) make of it
    (drover/remote/confusables.py, generated from the data), default-ignorable characters read as nothing, and a
    `<` is any character that reads or is named as one.  A `<` (not already followed by a backslash) is disarmed
    when, after nothing but filler (no ASCII letter, digit, `_`, `-` or other `<`: so `/`, spaces, lookalike
    letters and invisible characters), the letters that follow -- whatever non-letters stand between them -- spell
    a tag.

    That is a superset of what Claude Code disarms in a peer message (its closing-tag escape, which its envelope
    round trip re-renders, and its scrub of lookalike tags in the body, which costs the body its place in the
    transcript): so Claude leaves drover's body alone, the round trip holds and the transcript keeps the body.  On
    the tmux lane no forged opening or closing tag reaches the model.  Over-escaping costs a backslash.
    """
    if OPENERS.isdisjoint(body):
        return body
    reading = body.translate(_READING)
    hits = [m.start() for m in _OPENS_TAG.finditer(reading)]
    if not hits:
        return body
    if len(reading) != len(body):
        where = _index_map(body)
        hits = [where[h] for h in hits]
    out = []
    done = 0
    for i in hits:
        out.append(body[done : i + 1] + "\\")
        done = i + 1
    out.append(body[done:])
    return "".join(out)


def sanitise_name(name: str) -> str:
    """from-name as Claude Code renders it: no quotes or angle brackets, no control, format, surrogate or
    line/paragraph-separator characters, trimmed, at most 64 characters (so its round trip holds).  No lookalike of
    `<` either: the name stands inside the envelope, where a forged tag would cost the body (see escape_tags)."""
    drop = ("Cc", "Cf", "Cs", "Zl", "Zp")
    kept = [ch for ch in name if ch not in '"<>' and ch not in OPENERS and unicodedata.category(ch) not in drop]
    return "".join(kept).strip()[:64].strip()


NAME_MAX = 64  # what Claude Code keeps of a from-name
ADDRESS = re.compile(r"[^A-Za-z0-9._%/:-]")
SESSION_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
ACTOR_ROOM = 16  # what of the actor's name is worth shortening a session id for


def actor_part(actor: str) -> str:
    """The actor as from-name shows it, unable to imitate the sender's address after it.

    The name reads `drover (ACTOR) @ HOST:SESSION`, and only drover writes the `) @ `: the actor is read as NFKC
    reads it (a fullwidth `）` or `＠` is its ASCII self), loses every bracket and parenthesis (Unicode's open and
    close punctuation, so no lookalike survives either), and an `@` in it keeps no space around it.  So `x) @ box:evil`
    shows as `drover (x@box:evil)`: a name, not an address; `user@host` stays as it is."""
    text = unicodedata.normalize("NFKC", actor)
    text = "".join(ch for ch in text if unicodedata.category(ch) not in ("Ps", "Pe") and ch not in "()")
    return re.sub(r"\s*@\s*", "@", text)


def from_name(actor: str, sender: str = "") -> str:
    """`drover (ACTOR)`, and ` @ HOST:SESSION` when the message was sent from inside a session: the address kept
    whole (it is what the receiver answers to), the actor cut to leave it room within NAME_MAX."""
    address = ADDRESS.sub("", sender)[: NAME_MAX - len("drover (x) @ ")]
    shown = sanitise_name(actor_part(actor))
    if not address:
        return sanitise_name("drover (%s)" % shown)
    room = NAME_MAX - len("drover () @ ") - len(address)
    host, _, ident = address.partition(":")
    if room < min(len(shown), ACTOR_ROOM) and SESSION_UUID.match(ident):
        # A Claude session id leaves the actor a few letters: its first 8 characters name it as well (drover resolves
        # an id by a unique prefix of 8+; an ambiguous one is an error listing both, never a wrong delivery).
        address = "%s:%s" % (host, ident[:8])
        room = NAME_MAX - len("drover () @ ") - len(address)
    return "drover (%s) @ %s" % (shown[:room].strip(), address)


def envelope(body: str, actor: str, mode: str = "prompting", from_addr: str = "", session: str = "", sender: str = "") -> str:
    """The <cross-session-message> wrapping Claude Code's own sender writes, with a fixed attribute order.
    `sender`: the HOST:SESSION the message was sent from, named in from-name so the receiver can answer."""
    if mode not in ("prompting", "bypass"):
        raise HelperError(BAD_REQUEST, "from-mode must be 'prompting' or 'bypass', not %r" % mode)
    attrs = []
    if from_addr:
        attrs.append('from="%s"' % from_addr)
    if session:
        attrs.append('from-session="%s"' % session)
    attrs.append('from-name="%s"' % from_name(actor, sender))
    attrs.append('from-mode="%s"' % mode)
    return "<%s %s>\n%s\n</%s>" % (TAG, " ".join(attrs), escape_tags(body), TAG)
