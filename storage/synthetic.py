"""Synthetic episodes with the shape of real ones, for storage tests, benchmarks and demos.

Deterministic for a given seed. Each episode is a prompt, then ``calls`` rounds of an ``act``
reply with one tool call, its rehearsal (a ``rehearse`` generation) and the tool message, then a
final ``act`` answer; the shadow real environment's answer is recorded next to every rehearsal,
agreeing exactly, differing in one number, or disagreeing on status, in turn.
"""

from __future__ import annotations

import random

from envace_engine.types import (
    CallRecord,
    Episode,
    Mode,
    Rehearsal,
    Role,
    Segment,
    StopReason,
    ToolCall,
    ToolError,
    ToolResult,
)

TOOLS = ("ls", "cd", "get_balance", "send_message")
STOPS = (StopReason.DONE, StopReason.DONE, StopReason.DONE, StopReason.TURN_LIMIT)


def _tokens(rng: random.Random, n: int) -> tuple[int, ...]:
    return tuple(rng.randrange(49152) for _ in range(n))


def _logprobs(rng: random.Random, n: int) -> tuple[float, ...]:
    return tuple(-rng.random() * 3 for _ in range(n))


def _pair(k: int, amount: int) -> tuple[ToolResult, ToolResult]:
    real = ToolResult(value={"amount": amount, "currency": "EUR", "ok": True})
    if k % 3 == 0:
        return real, real
    if k % 3 == 1:
        return ToolResult(value={"currency": "EUR", "ok": True, "amount": amount * 1.05}), real
    return ToolResult(error=ToolError("INVALID_PARAMETERS", "missing field", "{}")), real


def make_episode(
    seed: int, run_tag: str = "r", calls: int = 3, tokens: int = 16, group_size: int = 4
) -> Episode:
    """One synthetic episode: ``2 * calls + 2`` segments and ``calls`` rehearsals."""
    rng = random.Random(seed)
    segments = [Segment(Role.PROMPT, _tokens(rng, 2 * tokens), "System: tools... User: do it")]
    rehearsals, records = [], []
    for k in range(calls):
        tool = TOOLS[(seed + k) % len(TOOLS)]
        act_ids = _tokens(rng, tokens)
        segments.append(
            Segment(
                Role.ACT,
                act_ids,
                f'<tool_call>{{"name": "{tool}"}}</tool_call>',
                _logprobs(rng, tokens),
            )
        )
        rehearsed, real = _pair(seed + k, 100 + (seed * 37 + k) % 10_000)
        out_ids = _tokens(rng, tokens)
        rehearsals.append(
            Rehearsal(
                k,
                _tokens(rng, 3 * tokens),
                Segment(
                    Role.REHEARSE,
                    out_ids,
                    f"<execution_result>{k}</execution_result>",
                    _logprobs(rng, tokens),
                ),
                grounded=bool(k % 2),
            )
        )
        segments.append(Segment(Role.TOOL, out_ids, f"result of {tool} number {k}"))
        records.append(
            CallRecord(
                turn=0,
                step=k,
                call=ToolCall(tool, {"x": k}, f"call {tool}"),
                shown="rehearsed",
                rehearsed=rehearsed,
                real=real,
            )
        )
    segments.append(
        Segment(Role.ACT, _tokens(rng, tokens), f"final answer {seed}", _logprobs(rng, tokens))
    )
    return Episode(
        id=f"{run_tag}-ep{seed:07d}",
        task_id=f"task-{seed // group_size % 50:03d}",
        suite="toy",
        mode=Mode.REHEARSAL,
        group_id=f"{run_tag}-g{seed // group_size}",
        segments=tuple(segments),
        rehearsals=tuple(rehearsals),
        calls=tuple(records),
        stop_reason=STOPS[seed % len(STOPS)],
        reward=(seed % 5) / 4,
        final_answers=(f"final answer {seed}",),
        meta={"advantages": {"act": (seed % 3) - 1.0, "rehearse": 0.5}},
    )


def make_step(
    step: int, n_episodes: int, run_tag: str = "r", calls: int = 3, tokens: int = 16
) -> list[Episode]:
    """``n_episodes`` synthetic episodes for ``step`` (ids unique across steps)."""
    return [make_episode(step * n_episodes + i, run_tag, calls, tokens) for i in range(n_episodes)]
