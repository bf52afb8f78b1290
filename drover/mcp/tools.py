"""The MCP tools: one per op, each with the arguments a model may give, taken from the op's own request model.

A tool's argument model is the op's request model less what no agent may set: `actor` (the caller is named by
drover/mcp/caller.py, not by an argument), `as_owner` (the owner's authority, never an agent's) and a spawn's
`args` (an engine flag such as --dangerously-skip-permissions would start a session in a bypass class).  A session
is named by `target` in the CLI's HOST:ID form in place of the op's `host` and `id`.  Unknown fields are refused,
as the ops refuse them: `actor` passed anyway is an error, never ignored.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from drover.ops import REGISTRY

# Fields of any op no tool offers: who sends, and the owner's authority.
BYPASS = frozenset({"actor", "as_owner"})
TARGET_HELP = "the session as HOST:ID, e.g. local:%3 or box-a:webapp-f8 (an ID alone is on local); drover_list lists them"

NEVER = (
    "It never approves anything, never answers a dialog or permission prompt, and never carries the owner's "
    'authority: every message declares from-mode="prompting" and is from the calling session.'
)


class ToolArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class ToolSpec:
    name: str
    op: str
    description: str
    target: bool = False  # `target` (HOST:ID) stands for the op's host and id
    drop: frozenset[str] = frozenset()  # more op fields this tool does not offer
    fixed: dict[str, Any] = field(default_factory=dict)  # op fields set by the tool itself
    rename: dict[str, str] = field(default_factory=dict)  # tool argument -> op field
    extra: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # arguments of the tool's own (not the op's)

    def model(self) -> type[ToolArgs]:
        return _models[self.name]


SPECS: list[ToolSpec] = [
    ToolSpec(
        "drover_send",
        "sessions.message",
        "Send a message to another agent session (Claude Code, Codex, a program in a tmux pane) on any host of the "
        "fleet, and get its outcome: delivered, queuedBehindTurn, held, refused, dropped or failed. The receiver sees "
        "it as a peer message from you, inside drover's envelope; the message is recorded first, so `drover_log` and "
        "`drover_verify` can follow it. Use it to brief, ask or report to another session. " + NEVER,
        target=True,
    ),
    ToolSpec(
        "drover_tmux_send",
        "sessions.message",
        "Send a message by drover's guarded paste into a tmux pane only (via=tmux): for a program with no native "
        "lane. drover pastes only into an idle pane showing no dialog and no draft, and refuses otherwise. A session "
        "with a native lane (Claude's inbox, a Codex queue) refuses it: use drover_send. " + NEVER,
        target=True,
        drop=frozenset({"via"}),
        fixed={"via": "tmux"},
    ),
    ToolSpec(
        "drover_list",
        "sessions.list",
        "List the agent sessions on every (or the chosen) host: host, id, name, engine, directory, state (working, "
        "idle, waiting_on_human, ...). Use it to find a session's HOST:ID before sending to it. Reads only.",
    ),
    ToolSpec(
        "drover_status",
        "sessions.status",
        "One session's state with its evidence (screen tail, last progress, since when). Reads only.",
        target=True,
    ),
    ToolSpec(
        "drover_read",
        "sessions.read",
        "Read a session's transcript, filtered: the last N events, by role (user, assistant, peer, tool), by a "
        "regex, since a time. Use it to see what another session said or did. Reads only.",
        target=True,
    ),
    ToolSpec(
        "drover_wait",
        "sessions.wait_many",
        "Wait until a session (or any/all of several) is idle, waiting on a human, done or exited. Each call returns "
        "within about 50 seconds: when `reached` is false, call drover_wait again with the `cursor` it returned -- "
        "the record between the calls is read, so nothing is missed. Reads only; it never wakes or prompts a session.",
        drop=frozenset({"timeout_s"}),
        extra={"cursor": (str | None, Field(None, description="the cursor a previous drover_wait call returned"))},
    ),
    ToolSpec(
        "drover_events",
        "events.read",
        "The record's events (messages accepted and their outcomes, spawns, done, failed, exited) from a cursor, each "
        "with its own cursor; wait_s blocks (at most 50 s) for the next. Use it to follow delegated work. Reads only.",
    ),
    ToolSpec(
        "drover_broadcast",
        "sessions.broadcast",
        "Send the same message to every agent session a selector matches (hosts, tags, engine, name or directory "
        "glob, or all), skipping sessions that wait on a human. " + NEVER,
    ),
    ToolSpec(
        "drover_nudge",
        "sessions.nudge",
        "Deliver a message only if it is safe: refused when the session is not live, is generating, waits on a "
        "human, or shares its directory with another live session. Use it for reminders that must never interrupt. " + NEVER,
        target=True,
    ),
    ToolSpec(
        "drover_spawn",
        "sessions.spawn",
        "Start a new agent session (claude, codex, or an engine the fleet defines) in tmux on a host, wait until it is "
        "ready, and brief it; you are recorded as its parent, and its `done` is reported back to you. It starts the "
        "engine in the permission mode the fleet's template gives it, never a bypass one of yours.",
        drop=frozenset({"args"}),
    ),
    ToolSpec(
        "drover_done",
        "sessions.done",
        "Signal that your delegated task is finished (or failed): recorded, and reported to the session that spawned "
        "you (or `to`). Call it once, at the end, with a summary and evidence.",
    ),
    ToolSpec(
        "drover_board",
        "board",
        "Who is waiting on a human across the fleet: dialogs, Claude's waiting, held messages. Reads only; answering "
        "them is for the human, never for a tool.",
    ),
    ToolSpec(
        "drover_log",
        "messages.list",
        "Query drover's record: who sent what to whom, and what became of each message (outcome, verified). Reads only.",
        rename={"sender": "actor"},
    ),
    ToolSpec(
        "drover_verify",
        "messages.verify",
        "Look for sent messages in their receivers' own records (transcript, rollout) and record the ones found: "
        "did it really arrive?",
    ),
]
BY_NAME = {s.name: s for s in SPECS}


def _build(spec: ToolSpec) -> type[ToolArgs]:
    request = REGISTRY[spec.op].request
    fields: dict[str, Any] = {}
    if spec.target:
        fields["target"] = (str, Field(..., description=TARGET_HELP))
    back = {v: k for k, v in spec.rename.items()}
    for name, info in request.model_fields.items():
        if name in BYPASS and name not in back:
            continue
        if name in spec.drop or (spec.target and name in ("host", "id")):
            continue
        fields[back.get(name, name)] = (info.annotation, copy.copy(info))
    if "sender" in spec.rename:
        fields["sender"] = (str | None, Field(None, description="only messages from this actor (NAME@HOST, user@host)"))
    fields.update(spec.extra)
    model = create_model(f"{spec.name}_args", __base__=ToolArgs, **fields)
    model.__doc__ = spec.description
    return model


_models: dict[str, type[ToolArgs]] = {s.name: _build(s) for s in SPECS}


def schema(spec: ToolSpec) -> dict[str, Any]:
    """The tool's inputSchema: its argument model's JSON Schema (additionalProperties false)."""
    out = spec.model().model_json_schema()
    out.pop("title", None)
    out.pop("description", None)  # the tool's description says it
    return out
