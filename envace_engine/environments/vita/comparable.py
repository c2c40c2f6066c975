"""What a VitaBench run's scores can be compared with, said with the run (CLI and studio).

Every VitaBench reward is a judge's, in a conversation with a simulated user: a score means
what its user and judge models make it mean. The note names both (from the run's recorded
options) and says plainly when the run cannot be set beside the leaderboard's numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

UPSTREAM = "gpt-4.1 as the user and claude-3.7-sonnet as the judge"
ENDPOINTS = ("http://", "https://", "openai+", "sglang+")


def comparability(suite: str, options: Mapping[str, Any]) -> str:
    """One line for a run of ``suite`` with recorded ``options`` ('' for other suites)."""
    if not suite.startswith("vita-"):
        return ""
    # ``judge_url``: the key runs recorded before the eval spec named it ``judge``
    user = options.get("user") or ""
    judge = options.get("judge") or options.get("judge_url") or ""
    said_user = user or "none (the instructions replayed as one message)"
    said_judge = judge or "none (episodes stored unscored)"
    local = not user or not judge or not all(v.startswith(ENDPOINTS) for v in (user, judge))
    verdict = (
        "**local models, not leaderboard-comparable**"
        if local
        else f"comparable with the leaderboard only if these serve upstream's models ({UPSTREAM})"
    )
    return f"VitaBench `{suite}`: user `{said_user}`, judge `{said_judge}` — {verdict}."
