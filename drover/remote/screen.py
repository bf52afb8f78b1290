"""Reading a captured screen: idle, busy, dialog or unknown, what the input box holds, and the line that decided it.

An agent's screen is history above and a live region at the bottom: the input box (found by the profile's
`input` pattern, the last line that matches with `input_above` right above it), a few status lines above it
(`live_above`) and the footer below.  Busy, idle and dialog are read from the live region only, never from
history: an old message quoting "esc to interrupt", or a prompt `› 1. fix the flaky test` in the scrollback, says
nothing about now -- unless the profile's `dialog_scope` is "screen": then a dialog marker anywhere on the visible
screen outside the box counts (a program drawing its dialogs at the top).  A screen with no input box at all is a
dialog if it shows one anywhere, else unknown.
Profiles without an `input` pattern (the shell, a user's own engine) are read the simpler way: dialog, busy,
idle patterns over the scope the profile names.
"""

import re
from typing import Any, Dict, List, Optional, Tuple

Profile = Dict[str, Any]


def lines_of(screen: str) -> List[str]:
    return [line.rstrip() for line in screen.replace("\r\n", "\n").split("\n")]


def _search(patterns: List[str], lines: List[str]) -> Optional[str]:
    """The first line that matches any pattern."""
    for line in lines:
        for pattern in patterns:
            if re.search(pattern, line):
                return line
    return None


def find_input(lines: List[str], profile: Profile) -> Optional[Tuple[int, int, str]]:
    """(first line, end line, text) of the input box: the last line matching `input` whose line above matches
    `input_above`, and the lines after it up to `input_end` (exclusive).  None when the screen shows no input box."""
    pattern = profile.get("input")
    if not pattern:
        return None
    above = profile.get("input_above")
    for i in range(len(lines) - 1, -1, -1):
        m = re.match(pattern, lines[i])
        if m is None:
            continue
        if above and (i == 0 or not re.search(above, lines[i - 1])):
            continue
        end = i + 1
        closing = profile.get("input_end")
        if closing:
            # The box ends at the last closing line below it, not the first: a line of the text itself may look
            # like the box's edge (a pasted `─────`), the footer below the box never does.
            ends = [j for j in range(i + 1, len(lines)) if re.search(closing, lines[j])]
            end = ends[-1] if ends and profile.get("input_end_last") else (ends[0] if ends else len(lines))
        text = [(m.group(1) or "").strip()] + [line.strip() for line in lines[i + 1 : end]]
        return i, end, "\n".join(t for t in text if t)
    return None


def is_placeholder(text: str, profile: Profile) -> bool:
    return any(re.match(p, text) for p in profile.get("placeholder", []))


# Select Graphic Rendition, the only escape `capture-pane -e` writes (tmux 3.3).
SGR = re.compile(r"\x1b\[([0-9;:]*)m")


def plain(screen: str) -> str:
    return SGR.sub("", screen)


def drawn_normal(line: str) -> str:
    """The characters of a styled line (`capture-pane -e`) drawn in normal intensity: an engine draws its
    placeholder faint, a person's typing comes out in normal intensity.  Cells in reverse video are the cursor
    (Claude draws it on the placeholder's first letter): neither."""
    out = []
    faint = inverse = False
    pos = 0
    for m in SGR.finditer(line + "\x1b[m"):
        if not (faint or inverse):
            out.append(line[pos : m.start()])
        pos = m.end()
        codes = [c.split(":")[0] for c in m.group(1).split(";")] if m.group(1) else ["0"]
        k = 0
        while k < len(codes):
            code = codes[k]
            if code in ("38", "48", "58"):  # a colour's own numbers (5;N or 2;R;G;B) are no attributes
                k += 3 if codes[k + 1 : k + 2] == ["5"] else 5
                continue
            if code in ("0", ""):
                faint = inverse = False
            elif code == "2":
                faint = True
            elif code == "22":
                faint = False
            elif code == "7":
                inverse = True
            elif code == "27":
                inverse = False
            k += 1
    return "".join(out)


def _live_above(lines: List[str], start: int, profile: Profile) -> List[str]:
    """The live region's lines above the input box: `live_above` non-empty lines, not counting a block the engine
    draws between its status line and the box (`live_skip_block`: the block's first and last line, as Codex lists
    the messages queued behind its turn -- its lines are the queued texts, not the engine's state, and are left out).
    """
    above = int(profile.get("live_above", 0))
    block = profile.get("live_skip_block") or []
    live = []  # type: List[str]
    i = start
    while above > 0 and i > 0:
        i -= 1
        if len(block) == 2 and re.search(block[1], lines[i]):
            head = [j for j in range(i - 1, -1, -1) if re.search(block[0], lines[j])][:1]
            if head:
                i = head[0]
                continue
        if lines[i].strip():
            above -= 1
        live.insert(0, lines[i])
    return live


# drover's own envelope, as an input box shows it with the whitespace squeezed out: an earlier send of drover's
# that was pasted and never submitted (refused after its paste, or cut short), not a person's draft.
OWN = re.compile(r'^<cross-session-message(?:from="[^"]*")?from-session="(msg_[0-9a-f]+)"from-name="drover\(')


def drovers_own(text: str) -> Optional[str]:
    """The message id of drover's own envelope that the box holds, or None."""
    m = OWN.match(squeeze(text))
    return m.group(1) if m else None


def _typed(box: List[str], profile: Profile) -> str:
    """What the input box's lines show in normal intensity, past the box's own prompt: text a person typed (a
    placeholder is drawn faint), whatever its words."""
    normal = [drawn_normal(line).rstrip() for line in box]
    m = re.match(profile["input"], normal[0]) if normal else None
    first = (m.group(1) or "") if m else (normal[0] if normal else "")
    return squeeze(first + "".join(normal[1:]))


def classify(screen: str, profile: Profile, pasted: str = "") -> Dict[str, Any]:
    """What the screen says now: state (idle, busy, dialog, unknown), reason, and the input box's content.

    A screen captured with attributes (`capture-pane -e`) is read for what it says as plain text, and its input box
    for how it is drawn: text in normal intensity is a person's draft even when it reads like the placeholder.
    With `pasted` (the text drover just pasted), the input box is expected to hold it: `shows_paste` says whether
    it does, and what is in the box never counts as a dialog or a draft (the text may quote dialog words).
    """
    styled = lines_of(screen) if "\x1b[" in screen else None
    lines = lines_of(plain(screen)) if styled is not None else lines_of(screen)
    box = find_input(lines, profile)
    if profile.get("input") and box is None:
        hit = _search(profile.get("dialog", []), lines)
        if hit is not None:
            return {"state": "dialog", "reason": "dialog on screen: %r" % hit.strip()[:120], "input": None}
        return {"state": "unknown", "reason": "no input box on screen (a menu, a login, or not started yet)", "input": None}
    if box is None:
        return _classify_flat(lines, profile)
    start, end, text = box
    live = _live_above(lines, start, profile) + lines[end:]
    result: Dict[str, Any] = {"input": text}
    typed = bool(styled and profile.get("placeholder_faint") and _typed(styled[start:end], profile))
    empty = not text or (is_placeholder(text, profile) and not typed)
    if empty and profile.get("empty_footer") and _search([profile["empty_footer"]], lines[end:]) is None:
        empty = False  # the engine says its input holds something, whatever the box shows
    result["draft"] = not empty and not pasted
    if result["draft"] and drovers_own(text):
        result["unsent"] = drovers_own(text)
    if pasted:
        result["shows_paste"] = shows_paste(text, pasted, profile)
    # "screen": a dialog anywhere on the visible screen counts (a program may draw one at the top, far from its
    # box); "live" (the built-in engines, whose dialogs are measured to come up in place of the box or right above
    # it) reads the live region only, so a quoted dialog word in the history refuses nothing.  The box's own text
    # never counts: it may quote dialog words.
    scope = lines[:start] + lines[end:] if profile.get("dialog_scope") == "screen" else live
    hit = _search(profile.get("dialog", []), scope)
    if hit is not None:
        result.update(state="dialog", reason="dialog on screen: %r" % hit.strip()[:120])
        return result
    hit = _search(profile.get("busy", []), live)
    if hit is not None:
        result.update(state="busy", reason="busy: %r" % hit.strip()[:120])
        return result
    result.update(state="idle", reason="idle: the input box is %s" % ("empty" if empty else "not empty"))
    return result


def _classify_flat(lines: List[str], profile: Profile) -> Dict[str, Any]:
    nonempty = [line for line in lines if line.strip()]
    scope = nonempty[-1:] if profile.get("dialog_scope") == "last_line" else lines
    hit = _search(profile.get("dialog", []), scope)
    if hit is not None:
        return {"state": "dialog", "reason": "dialog on screen: %r" % hit.strip()[:120], "input": None}
    hit = _search(profile.get("busy", []), lines)
    if hit is not None:
        return {"state": "busy", "reason": "busy: %r" % hit.strip()[:120], "input": None}
    hit = _search(profile.get("idle", []), scope)
    if hit is not None:
        return {"state": "idle", "reason": "idle: input prompt %r" % hit.strip()[:120], "input": None}
    if profile.get("default_state", "unknown") == "idle":
        return {"state": "idle", "reason": "no prompt asking for input", "input": None}
    return {"state": "unknown", "reason": "screen not recognised: no idle prompt, no busy or dialog marker", "input": None}


def squeeze(text: str) -> str:
    """Text as an input box may show it: wrapped, newlines drawn as ⏎, long middles elided with …"""
    return re.sub(r"[\s⏎]+", "", text)


def shows_paste(text: str, pasted: str, profile: Profile) -> bool:
    """Does the input box hold exactly what was pasted, and nothing else?  All of it, as the box wraps it; or, when
    the program elides a long text's middle ("…"), its first and last 60 characters (drover's id is in the first,
    the end of the body in the last: a person's edit or another message does not pass); or -- all of the box --
    the engine's own marker for a long paste ("[Pasted text #1 +50 lines]")."""
    if any(re.fullmatch(p, text.strip()) for p in profile.get("paste_marker", [])):
        return True
    box, want = squeeze(text), squeeze(pasted)
    if not want:
        return False
    if box == want:
        return True
    if "…" not in text:
        return False
    # The program shows the start and the end: each must be ours, and long enough to tell messages apart.
    head, _, tail = text.partition("…")
    head, tail = squeeze(head), squeeze(tail)
    return len(head) >= 40 and len(tail) >= 20 and want.startswith(head) and want.endswith(tail)


def paste_allowed(seen: Dict[str, Any], profile: Profile) -> bool:
    """Would the guard let a paste go to a pane classified as `seen`?  (The one rule, for the lane and guard check.)
    Never over a draft, never into a dialog or a screen it does not recognise, into a busy engine only if it
    queues typed input."""
    if seen.get("draft"):
        return False
    return seen["state"] == "idle" or (seen["state"] == "busy" and bool(profile.get("queues_when_busy")))


def last_line(screen: str) -> str:
    """The last line that says something (rules and box drawing skipped)."""
    for line in reversed(lines_of(screen)):
        text = line.strip()
        if text and not re.match(r"^[\u2500-\u259f\s]+$", text):
            return text[:200]
    return ""
