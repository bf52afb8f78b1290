"""The questions `drover log` asks of the truth file -- the newest N matching messages, one message by id -- answered
by reading backwards from the end and stopping at the answer, so their cost follows what they return.

A mixin of `TruthFile` (drover/truth.py), which supplies the backward stream of well-formed events.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, cast

from drover.record import (
    ACCEPTED_PREFIX,
    PLAIN_ID,
    PLAIN_VALUE,
    Message,
    Query,
    ReadStats,
    id_time_range,
    may_have_arrived,
    names_match,
    spellings,
)

ORDER_SLACK_S = 60.0  # how far file order may run ahead of time order (a writer waiting for the lock)
# How much of the file a filtered query scans backwards before it asks the index (drover/truth_index.py): a
# filter whose matches are near the end is answered by the scan and never builds or opens an index.
SCAN_BUDGET = 4 << 20


class OverBudget(Exception):
    """The scan read SCAN_BUDGET bytes without finishing its answer: the index answers instead."""


class Queries(ABC):
    path: Path

    @abstractmethod
    def backward(
        self, stats: ReadStats | None = None, fd: int | None = None, skip: Callable[[bytes], bool] | None = None
    ) -> Iterator[dict[str, Any]]:
        """Well-formed events, newest first."""

    @abstractmethod
    def _reading(self) -> AbstractContextManager[tuple[int, int, bool] | None]:
        """(fd, end, settled) for reading, or None when there is no file."""

    def _fold_backward(
        self,
        stats: ReadStats,
        stop: Callable[[dict[str, Any]], bool] | None = None,
        want: Callable[[dict[str, Any], dict[str, Any] | None], bool] | None = None,
        needle: bytes | None = None,
        reject: Callable[[bytes, dict[str, Any] | None], bool] | None = None,
        budget: int | None = None,
    ) -> Iterator[Message]:
        """Messages, newest first, each with its latest outcome (met first when reading backwards).

        Stops before the first accepted event for which `stop` is true; `want(accepted, outcome)` skips a message
        before it is built.  Two shortcuts spare the JSON parse of lines that cannot be in the answer: with
        `needle`, lines that do not contain those bytes; with `reject(raw, outcome)`, accepted events as drover
        writes them (their id read from the bytes) that it rules out.  With `budget`, raises OverBudget once the
        lines read add up to more than that many bytes.

        What it holds is the outcomes met whose accepted event is not reached yet (an outcome comes a few lines
        after its accepted event): whatever becomes of a message, built, rejected or skipped, its entries go."""
        outcomes: dict[str, dict[str, Any]] = {}  # met, waiting for their accepted event (so: a few)
        # Whether any attempt may have reached the receiver (or the first outcome was not the send's own): a
        # later refusal does not make such a message provably unsent.
        uncertain: dict[str, bool] = {}
        oldest: dict[str, dict[str, Any]] = {}

        def forget(msg_id: str) -> dict[str, Any] | None:
            uncertain.pop(msg_id, None)
            oldest.pop(msg_id, None)
            return outcomes.pop(msg_id, None)

        skip = None
        if needle is not None or reject is not None or budget is not None:
            read = [0]

            def skip(raw: bytes) -> bool:
                if budget is not None:
                    read[0] += len(raw) + 1
                    if read[0] > budget:
                        raise OverBudget
                if needle is not None and needle not in raw:
                    return True
                if reject is None or not raw.startswith(ACCEPTED_PREFIX):
                    return False
                m = PLAIN_ID.match(raw, len(ACCEPTED_PREFIX))
                if m is None:
                    return False
                msg_id = m.group(1).decode()
                if not reject(raw, outcomes.get(msg_id)):
                    return False
                forget(msg_id)
                return True

        for ev in self.backward(stats, skip=skip):
            kind = ev["event"]
            if kind == "outcome":
                outcomes.setdefault(ev["id"], ev)  # the newest outcome wins, as in a forward fold
                uncertain[ev["id"]] = uncertain.get(ev["id"], False) or may_have_arrived(ev)
                oldest[ev["id"]] = ev
            elif kind == "accepted":
                if stop is not None and stop(ev):
                    return
                msg_id = ev["id"]
                if want is not None and not want(ev, outcomes.get(msg_id)):
                    forget(msg_id)
                    continue
                out = outcomes.pop(msg_id, None)
                m = Message.accepted(ev)
                if out is not None:
                    m.apply(out)
                    first = oldest.pop(msg_id, out)
                    m.uncertain = uncertain.pop(msg_id, False) or "attempt" in first
                yield m

    def query(
        self,
        limit: int,
        since_ts: float | None = None,
        *,
        host: str | None = None,
        target: str | None = None,
        actor: str | None = None,
        outcome: str | None = None,
        pending: bool = False,
        host_in: Callable[[str], bool] | None = None,
    ) -> Query:
        """The newest `limit` matching messages (accepted at or after since_ts), oldest first.

        Reads backwards and stops at the limit (plus one, to know whether there are more) or ORDER_SLACK_S before
        since_ts, so the cost follows the answer.  A filter whose matches are not within the last SCAN_BUDGET
        bytes is answered from the index beside the file (drover/truth_index.py), caught up to the file's end;
        where there can be no index, the scan reads on, to the start of the file if it must, holding only the
        outcomes still waiting for their accepted event.  The scan parses only the accepted lines it cannot rule
        out from their bytes (so `stats` counts malformed lines among those it parsed); the index counts those in
        the stretch of the file its answer covers."""
        filters = {"host": host, "target": target, "actor": actor, "outcome": outcome, "pending": pending}
        if any(filters.values()) or host_in is not None:
            try:
                return self._scan(limit, since_ts, filters, host_in, SCAN_BUDGET)
            except OverBudget:
                pass
            from drover import truth_index  # SQLite is imported only by a query that needs it

            cutoff = None if since_ts is None else since_ts - ORDER_SLACK_S
            found = truth_index.query(
                cast(truth_index.Record, self), ReadStats(str(self.path)), limit, since_ts, cutoff, filters, host_in
            )
            if found is not None:
                return found
        return self._scan(limit, since_ts, filters, host_in, None)

    def _scan(
        self,
        limit: int,
        since_ts: float | None,
        filters: dict[str, Any],
        host_in: Callable[[str], bool] | None,
        budget: int | None,
    ) -> Query:
        stats = ReadStats(str(self.path))
        host, target, actor, outcome, pending = (filters[k] for k in ("host", "target", "actor", "outcome", "pending"))

        def want(acc: dict[str, Any], out: dict[str, Any] | None) -> bool:
            return not (
                (since_ts is not None and acc["ts"] < since_ts)
                or (host and (acc.get("host") or "") != host)
                or (host_in is not None and not host_in(acc.get("host") or ""))
                or (target and not names_match(target, *spellings(acc, out)))
                or (actor and (acc.get("actor") or "") != actor)
                or (outcome and (out is None or out["outcome"] != outcome))
                or (pending and out is not None)
            )

        stop = None
        if since_ts is not None:
            cutoff = since_ts - ORDER_SLACK_S

            def stop(ev: dict[str, Any]) -> bool:
                return bool(ev["ts"] < cutoff)

        # A value any JSON encoder writes as it is: an accepted line without it cannot match.
        values = [f'"{v}"'.encode() for v in (host, actor) if v and PLAIN_VALUE.fullmatch(v)]
        # A session's spelling is in its accepted line (the target, options.session: a pid unquoted, an id whole
        # where the query is its prefix) or in the session its outcome names.
        spelled = target.encode() if target and PLAIN_VALUE.fullmatch(target) else None
        reject = None
        if values or spelled or outcome or pending:

            def reject(raw: bytes, out: dict[str, Any] | None) -> bool:
                return (
                    (pending and out is not None)
                    or bool(outcome and (out is None or out["outcome"] != outcome))
                    or any(v not in raw for v in values)
                    or bool(
                        spelled is not None
                        and spelled not in raw
                        and not (out is not None and names_match(target, *spellings({}, out)))
                    )
                )

        found: list[Message] = []
        complete = True
        for m in self._fold_backward(stats, stop, want, reject=reject, budget=budget):
            if len(found) == limit:
                complete = False
                break
            found.append(m)
        found.reverse()
        total = len(found) + (0 if complete else 1)
        return Query(found, total, complete, stats)

    def find(self, ref: str) -> tuple[list[Message], int, ReadStats]:
        """Messages whose id is `ref` (an exact match alone) or starts with it: (up to 5 of them, how many, stats).

        Reads backwards and parses only the lines that contain `ref` (an id is written as it is); an exact id
        stops the scan where it is found, and the clock in an id prefix (`msg_` and hex milliseconds) stops it
        ORDER_SLACK_S before the earliest time that prefix can name.  Malformed lines are counted among those
        parsed."""
        stats = ReadStats(str(self.path))
        span = id_time_range(ref)
        stop = None
        if span is not None:
            cutoff = span[0] - ORDER_SLACK_S

            def stop(ev: dict[str, Any]) -> bool:
                return bool(ev["ts"] < cutoff)

        def want(acc: dict[str, Any], _out: dict[str, Any] | None) -> bool:
            return bool(acc["id"].startswith(ref))

        plain = ref.isascii() and '"' not in ref and "\\" not in ref and ref.isprintable()
        hits: list[Message] = []
        count = 0
        for m in self._fold_backward(stats, stop, want, needle=ref.encode() if plain and ref else None):
            if m.id == ref:
                return [m], 1, stats
            count += 1
            if len(hits) < 5:
                hits.append(m)
        return hits, count, stats
