"""Answering requests: one JSON line in, one framed JSON answer out, until stdin ends.

Request:  {"helper": PROTOCOL, "op": "hello" | "list" | "status" | "deliver" | "wait" | "wait_many" | "read" | ...,
           "args": {...}, "profiles": {ENGINE: {...overrides}}}
Answer:   {"helper": PROTOCOL, "bundle": HASH, "ok": true, "data": ...}
          {"helper": PROTOCOL, "bundle": HASH, "ok": false, "error": {"code": "...", "message": "...", ...}}

Each answer is written as ANSWER_MARK + its length + newline + the JSON, so whatever a login shell printed
before the helper started cannot be mistaken for it.
"""

import importlib
import json
import os
import sys
import time
from typing import Any, BinaryIO, Callable, Dict, List, Optional

from . import caller
from . import protocol as P
from .profiles import merge_profiles
from .protocol import HelperError

Profiles = Dict[str, Dict[str, Any]]


def op_hello(args: Dict[str, Any], profiles: Profiles) -> Dict[str, Any]:
    from . import claude, discovery, mcp_state, tmux

    warnings: List[str] = []
    sessions = discovery.discover(profiles, warnings)
    engines: Dict[str, int] = {}
    for s in sessions:
        engines[s["engine"]] = engines.get(s["engine"], 0) + 1
    _live, stale = claude.records(warnings)
    mcp = mcp_state.registered(engines, warnings)
    return {
        "protocol": P.PROTOCOL,
        "python": "%d.%d.%d" % sys.version_info[:3],
        "platform": sys.platform,
        "user": os.environ.get("USER") or str(os.getuid()),
        "tmux": tmux.version(),
        # What the SSH session handed the helper: drover never asks for either, so both should be false.
        "forwarded": {"agent": bool(os.environ.get("SSH_AUTH_SOCK")), "x11": bool(os.environ.get("DISPLAY"))},
        "engines": engines,
        # Per engine found here: is drover's MCP server registered with it (`drover mcp install`)?
        "mcp": mcp,
        "stale_claude_sessions": stale,
        "warnings": warnings,
    }


def op_list(args: Dict[str, Any], profiles: Profiles) -> Dict[str, Any]:
    from . import discovery

    warnings: List[str] = []
    sessions = discovery.discover(profiles, warnings)
    if args.get("state", True):
        sessions = [discovery.with_state(s, profiles) for s in sessions]
    out = {"sessions": [_facts(s, bool(args.get("state", True))) for s in sessions], "warnings": warnings}
    if args.get("lifecycle") or args.get("lifecycle_of"):
        _lifecycle(out, args, warnings)
    return out


def _lifecycle(out: Dict[str, Any], args: Dict[str, Any], warnings: List[str]) -> None:
    """The newest done/failed in this host's own record about each session answered (`lifecycle` on it), and about
    the identities in `lifecycle_of` (sessions that may be gone: `lifecycle` of the answer), in the same request:
    one read of the record's end for all of them (drover/remote/own_record.py)."""
    from . import own_record

    rows = out["sessions"] if "sessions" in out else [out["session"]]
    given = args.get("lifecycle_of")
    asked = given if isinstance(given, list) else []  # type: List[Any]
    wanted = [r["identity"] for r in rows if r.get("identity")] if args.get("lifecycle") else []
    wanted += [i for i in asked if isinstance(i, str)]
    by, got = own_record.newest_by_identity(wanted)
    warnings.extend(got["warnings"])
    if args.get("lifecycle"):
        for row in rows:
            row["lifecycle"] = by.get(row.get("identity") or "")
    if asked:
        out["lifecycle"] = {i: by[i] for i in asked if i in by}
    out["record"] = {"path": got["record"], "read_bytes": got["read_bytes"], "complete": got["complete"]}


def _facts(session: Dict[str, Any], progress: bool = True) -> Dict[str, Any]:
    """A session as list and status answer it: its public fields, its identity (what the record's spawns and
    lifecycle events are matched by), and, with its state, its last progress (drover/remote/progress.py)."""
    from . import discovery

    out = discovery.public(session)
    out["identity"] = discovery.identity(session)
    if progress:
        from . import progress as prog

        try:
            out["progress"] = prog.of(session)
        except OSError as exc:  # a record that vanished or cannot be read mid-look: no evidence, never a failure
            out["progress"] = {"source": None, "last_progress": None, "error": str(exc)}
    return out


def op_status(args: Dict[str, Any], profiles: Profiles) -> Dict[str, Any]:
    from . import attention, discovery
    from .screen import lines_of

    warnings: List[str] = []
    session = discovery.with_state(discovery.find(args, profiles, warnings), profiles)
    screen = session.get("_screen", "")
    tail = [line for line in lines_of(screen) if line.strip()][-int(args.get("tail", 8)) :]
    out = _facts(session)
    out["tail"] = tail
    # Whether it waits on a person, by the same look `drover board` and a broadcast take (attention.py): a nudge
    # refuses such a session, and must not disagree with them about who is waiting.
    kind, reason, since, source = attention.waiting_on_human(session, profiles)
    out["human"] = {"kind": kind, "reason": reason, "since": since, "since_source": source} if kind else None
    answer = {"session": out, "warnings": warnings}  # type: Dict[str, Any]
    if args.get("lifecycle"):
        _lifecycle(answer, args, warnings)
    return answer


def op_read(args: Dict[str, Any], profiles: Profiles) -> Dict[str, Any]:
    from . import discovery, transcripts

    target = args.get("target", "")
    missing = None  # type: Optional[HelperError]
    try:
        session: Optional[Dict[str, Any]] = discovery.find(args, profiles, [])
    except HelperError as exc:
        if exc.code != P.SESSION_NOT_FOUND:
            raise
        session, missing = None, exc  # a Codex rollout id, or an ended Claude session, may still have a transcript
    try:
        path, engine = transcripts.transcript_for(session, target)
    except HelperError as exc:
        if missing is not None and exc.code == P.NO_TRANSCRIPT:
            raise missing from None  # no session and no transcript by that id: what finding the session said (names, hints)
        raise
    out = transcripts.read(path, engine, args)
    out["session"] = discovery.public(session) if session else None
    return out


def op_classify(args: Dict[str, Any], profiles: Profiles) -> Dict[str, Any]:
    from .screen import classify

    engine = args.get("engine", "shell")
    if engine not in profiles:
        known = ", ".join(sorted(profiles))
        raise HelperError(P.UNKNOWN_ENGINE, "no profile for engine %r (known: %s)" % (engine, known))
    return classify(args.get("screen", ""), profiles[engine])


def op_resolve(args: Dict[str, Any], profiles: Profiles) -> Dict[str, Any]:
    """Which session the target names, and its identity: what limits count by and what a send is pinned to."""
    from . import discovery

    session = discovery.find(args, profiles, [])
    out: Dict[str, Any] = {"session": discovery.public(session), "identity": discovery.identity(session)}
    out["pin"] = discovery.pin(session)
    out["matched"] = session.get("_matched")
    out["redirected_from"] = session.get("redirected_from")
    return out


def op_verify(args: Dict[str, Any], profiles: Profiles) -> Dict[str, Any]:
    """Is the message in the receiver's record, or sitting in its input box?  (for drover verify and retry)"""
    from . import claude, discovery, verify

    session = discovery.find(args, profiles, [])
    seen = verify.find(session, args, args.get("lane") or "tmux")
    seen["in_input"] = verify.in_input(session, args, profiles)
    seen["session"] = discovery.public(session)
    seen["identity"] = discovery.identity(session)
    rec = session.get("_record")
    if rec is not None:
        now = claude.record_now(rec) or rec
        seen["status"], seen["status_since"] = now.get("status"), now.get("statusUpdatedAt")
    else:
        seen["status"] = discovery.with_state(session, profiles).get("state")
    if seen.get("in_queue"):
        seen["status"] = "queued"  # on its way in Codex's own queue, however idle the thread looks: never resent
    return seen


def op_spawn(args: Dict[str, Any], profiles: Profiles) -> Dict[str, Any]:
    """A session in a tmux session of its own (spawn.py), or a headless one held on this host (headless_spawn.py)."""
    if args.get("headless") or args.get("resume"):
        from . import headless_spawn

        return headless_spawn.spawn(args, profiles)
    from . import spawn

    return spawn.spawn(args, profiles)


def _in(module: str, name: str) -> Callable[[Dict[str, Any], Profiles], Any]:
    """An op whose module is imported only when a request needs it: a cold start pays for what it uses."""

    def run(args: Dict[str, Any], profiles: Profiles) -> Any:
        return getattr(importlib.import_module("." + module, __package__), name)(args, profiles)

    return run


OPS: Dict[str, Callable[[Dict[str, Any], Profiles], Any]] = {
    "hello": op_hello,
    "list": op_list,
    "status": op_status,
    "deliver": _in("delivery", "deliver"),
    "wait": _in("wait", "wait"),
    "wait_many": _in("wait_many", "wait_many"),
    "read": op_read,
    "classify": op_classify,
    "resolve": op_resolve,
    "verify": op_verify,
    "attention": _in("attention", "sessions"),
    "wait_file": _in("files", "wait_file"),
    "spawn": op_spawn,
    "last_words": _in("gone", "last_words"),
    "lifecycle": _in("own_record", "lifecycle"),
}


def bundle_hash() -> Optional[str]:
    """The hash of the bundle this helper was loaded from (set by the loader), or None when imported locally."""
    package = sys.modules.get(__name__.rpartition(".")[0])
    return getattr(package, "BUNDLE", None)


def handle(request: Any) -> Dict[str, Any]:
    """Answer one request; every failure becomes an error answer, never an exception."""
    answer: Dict[str, Any] = {"helper": P.PROTOCOL, "bundle": bundle_hash()}
    try:
        if not isinstance(request, dict):
            raise HelperError(P.BAD_REQUEST, "the request must be a JSON object")
        if request.get("helper") != P.PROTOCOL:
            raise HelperError(
                P.PROTOCOL_MISMATCH, "helper protocol %r requested, this helper speaks %d" % (request.get("helper"), P.PROTOCOL)
            )
        op = OPS.get(request.get("op", ""))
        if op is None:
            raise HelperError(P.BAD_REQUEST, "unknown helper op %r" % request.get("op"))
        profiles = merge_profiles(request.get("profiles"))
        answer.update(ok=True, data=op(request.get("args") or {}, profiles))
    except caller.CallerGone:
        raise  # nobody to answer: serve() stops
    except HelperError as exc:
        error: Dict[str, Any] = {"code": exc.code, "message": exc.message}
        error.update(exc.extra)
        answer.update(ok=False, error=error)
    except Exception as exc:  # noqa: BLE001 - the answer must be JSON whatever happened
        answer.update(ok=False, error={"code": P.HELPER_CRASH, "message": "%s: %s" % (type(exc).__name__, exc)})
    return answer


def frame(answer: Dict[str, Any]) -> bytes:
    body = json.dumps(answer).encode("utf-8")
    return P.ANSWER_MARK + str(len(body)).encode() + b"\n" + body + b"\n"


def serve(stdin: BinaryIO, stdout: BinaryIO) -> int:
    """Answer each request line until stdin ends (or a wait finds its caller gone)."""
    try:
        caller.watch(stdout.fileno())
    except (AttributeError, OSError, ValueError):
        pass  # not a real descriptor (a test's buffer): nothing to watch
    while True:
        line = stdin.readline()
        if not line:
            return 0
        if not line.strip():
            continue
        started = time.monotonic()
        try:
            request = json.loads(line.decode("utf-8"))
        except ValueError as exc:
            answer: Dict[str, Any] = {"helper": P.PROTOCOL, "bundle": bundle_hash(), "ok": False}
            answer["error"] = {"code": P.BAD_REQUEST, "message": "bad JSON: %s" % exc}
        else:
            try:
                answer = handle(request)
            except caller.CallerGone:
                return 0
        answer["took_ms"] = round((time.monotonic() - started) * 1000, 1)
        stdout.write(frame(answer))
        stdout.flush()


def main() -> int:
    return serve(sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    sys.exit(main())
