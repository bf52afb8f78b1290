"""guard.check: classify a saved screen with an engine profile, as the tmux guard would right before a paste."""

from __future__ import annotations

from pydantic import Field

from drover.errors import ExitCode, InvalidRequest
from drover.ops.core import Context, Request, Result, op
from drover.remote.profiles import merge_profiles
from drover.remote.protocol import HelperError
from drover.remote.screen import classify, paste_allowed


class CheckRequest(Request):
    engine: str = Field(..., description="claude, codex, gemini, demo, shell, or an engine of fleet.toml")
    screen: str = Field(..., description="the captured screen text (tmux capture-pane -p)")


@op("guard.check", CheckRequest, "would the guarded paste go ahead on this screen? (state and reason)", "drover guard check")
async def guard_check(ctx: Context, req: CheckRequest) -> Result:
    try:
        profiles = merge_profiles(ctx.fleet.profile_overrides())
    except HelperError as exc:
        raise InvalidRequest(exc.message) from None
    if req.engine not in profiles:
        raise InvalidRequest(f"no profile for engine {req.engine!r}", hint="known: " + ", ".join(sorted(profiles)))
    profile = profiles[req.engine]
    seen = classify(req.screen, profile)
    go = paste_allowed(seen, profile)
    verdict = "paste would go ahead" if go else "paste would be refused"
    if seen.get("draft"):
        verdict += ": the input box holds a draft"
    data = {
        "engine": req.engine,
        "state": seen["state"],
        "reason": seen["reason"],
        "input": seen.get("input"),
        "draft": bool(seen.get("draft")),
        "paste": go,
        "verdict": verdict,
    }
    # `guard check` is a yes/no question: 0 = go ahead, 4 = the guard would refuse (as `send` exits when it does).
    return Result(data, [], ExitCode.OK if go else ExitCode.REFUSED)
