"""SFT examples in which the world role rules a call invalid (docs/training.md, *Invalid calls*).

Reference trajectories hold only valid calls, so a world role trained on them alone never writes
an error, and an act role trained in its world meets no cost for a call the real tools reject
(recipes/study/RESULTS.md). With ``invalid_fraction`` > 0, a seeded share of a task's reference
calls each also gets one invalid variant, rendered in the same rehearse prompt, whose target is
the error the task's real environment returns for it:

* ``extra`` — an argument the tool's schema lacks, named after another tool's argument (the slip
  the study's policies make: ``get_balance`` with an ``amount``);
* ``missing`` — a required argument dropped;
* ``type`` — an argument of the wrong JSON type.

The target is computed, never written here: the environment validates a call before it runs
anything, so a fresh environment of the task gives the error the live one would.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from envace_engine.environments.base import Suite, close_env
from envace_engine.rollout.parsing import INVALID_CALL_CODES, result_to_json
from envace_engine.rollout.prompts import (
    ChatSample,
    ReferenceCall,
    RehearseContext,
    assistant_text,
    reference_calls,
    rehearse_messages,
    rehearse_target,
)
from envace_engine.seeds import derive_seed
from envace_engine.types import ToolCall

KINDS = ("extra", "missing", "type")


def _params(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool's JSON-schema ``parameters`` (tools come as OpenAI function specs or bare)."""
    return dict(tool.get("function", tool).get("parameters") or {})


def _schema(tools: Sequence[dict[str, Any]], name: str) -> dict[str, Any]:
    named = (t for t in tools if t.get("function", t).get("name") == name)
    return next((_params(t) for t in named), {})


def _extra(call: ToolCall, tools: Sequence[dict[str, Any]], rng: random.Random) -> dict | None:
    names = {k for t in tools for k in _params(t).get("properties") or {}}
    own = set(_schema(tools, call.name).get("properties") or {})
    others = sorted(names - own - set(call.arguments))
    name = rng.choice(others) if others else "note"
    return {**call.arguments, name: rng.choice([1, 5, 19, "x"])}


def _missing(call: ToolCall, tools: Sequence[dict[str, Any]], rng: random.Random) -> dict | None:
    required = [k for k in _schema(tools, call.name).get("required") or [] if k in call.arguments]
    if not required:
        return None
    drop = rng.choice(required)
    return {k: v for k, v in call.arguments.items() if k != drop}


def _retyped(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    if isinstance(value, str):
        return len(value)  # a number where the schema wants a string
    return str(value)  # a string where the schema wants a number


def _type(call: ToolCall, tools: Sequence[dict[str, Any]], rng: random.Random) -> dict | None:
    keys = sorted(k for k, v in call.arguments.items() if _retyped(v) is not None)
    if not keys:
        return None
    key = rng.choice(keys)
    return {**call.arguments, key: _retyped(call.arguments[key])}


MAKERS = {"extra": _extra, "missing": _missing, "type": _type}


def invalid_variant(
    call: ToolCall, tools: Sequence[dict[str, Any]], rng: random.Random
) -> ToolCall | None:
    """One invalid variant of a valid call (a kind drawn from those that apply), or None."""
    kinds = list(KINDS)
    rng.shuffle(kinds)
    for kind in kinds:
        arguments = MAKERS[kind](call, tools, rng)
        if arguments is not None:
            return ToolCall(call.name, arguments)
    return None


def invalid_samples(
    ctx: RehearseContext, suite: Suite, fraction: float, seed: int
) -> list[ChatSample]:
    """Rehearse samples of invalid variants of a seeded ``fraction`` of the task's reference
    calls, each targeting the error the real environment returns for the variant."""
    samples: list[ChatSample] = []
    for index, ref in enumerate(reference_calls(ctx)):
        rng = random.Random(derive_seed(seed, "sft-invalid", ctx.task.id, index))
        if rng.random() >= fraction:
            continue
        sample = _sample(ctx, suite, ref, rng)
        if sample is not None:
            samples.append(sample)
    return samples


def _sample(
    ctx: RehearseContext, suite: Suite, ref: ReferenceCall, rng: random.Random
) -> ChatSample | None:
    variant = invalid_variant(ref.call, ctx.tools, rng)
    if variant is None:
        return None
    env = suite.make_env(ctx.task)
    try:
        result = env.execute(variant)
    finally:
        close_env(env)  # an environment may hold a server process (environments/mcp)
    if result.error is None or result.error.code not in INVALID_CALL_CODES:
        return None  # the schema accepts it after all (a loose schema): nothing to teach
    prompt = rehearse_messages(ctx, ref.history, assistant_text([variant]), variant)
    return ChatSample(tuple(prompt), rehearse_target(result_to_json(result)), "rehearse")
