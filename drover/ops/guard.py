"""guard.check: classify a saved screen with an engine profile, as the tmux guard would right before a paste."""

from __future__ import annotations

from pydantic import Field

from drover.errors import ExitCode, InvalidRequest
from drover.ops.core import Context, Request, Result, op
from drover.remote import helper


class CheckRequest(Request):
    engine: str = Field(..., description="claude, codex, gemini, demo, shell, or an engine of fleet.toml")
    screen: str = Field(..., description="the captured screen text (tmux capture-pane -p)")


@op("guard.check", CheckRequest, "would the guarded paste go ahead on this screen? (state and reason)", "drover guard check")
async def guard_check(ctx: Context, req: CheckRequest) -> Result:
    try:
        profiles = helper.merge_profiles(ctx.fleet.profile_overrides())
    except helper.HelperError as exc:
        raise InvalidRequest(exc.message) from None
    if req.engine not in profiles:
        raise InvalidRequest(f"no profile for engine {req.engine!r}", hint="known: " + ", ".join(sorted(profiles)))
    profile = profiles[req.engine]
    seen = helper.classify(req.screen, profile)
    state = seen["state"]
    go = state == "idle" or (state == "busy" and bool(profile.get("queues_when_busy")))
    verdict = "paste would go ahead" if go else "paste would be refused"
    data = {"engine": req.engine, "state": state, "reason": seen["reason"], "paste": go, "verdict": verdict}
    # `guard check` is a yes/no question: 0 = go ahead, 1 = refused (not an error).
    return Result(data, [], ExitCode.OK if go else 1)
