"""The simulated user and the judge of ``envace eval`` and ``sweep``, built from their spec.

``--user`` names the simulated user of a τ² or VitaBench evaluation: a model name or checkpoint
directory (the embedded engine; the agent's own sampler is reused when it is the same model), an
SGLang spec (``sglang+http://HOST:PORT``), or an OpenAI-compatible endpoint
(``openai+http://HOST:PORT[?model=NAME]``). The user is never trained and samples greedily, as
τ²'s and VitaBench's do. ``--judge`` is the judge both suites' scores
need (VitaBench: all of them), an endpoint or an embedded model named the same ways; without
one those episodes are stored unscored.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import typer

from envace_engine.cli import compose
from envace_engine.rollout.endpoints import Endpoint, EndpointUser, NlJudge, parse_endpoint
from envace_engine.rollout.judges import SamplerJudge
from envace_engine.rollout.rewards import JudgeConfig, judge_endpoint
from envace_engine.rollout.user import SamplerUser
from envace_engine.specs import EvalSpec, EvaluationSpec


def _embedded(
    spec: str, model: str, checkpoint: Any, batch_size: int, hint: str
) -> tuple[Any, Any]:
    """The sampler and tokenizer of model ``spec`` (the agent's own when it is the same)."""
    if spec == model:  # one model plays several parts: share its weights and sampler
        return checkpoint.sampler, checkpoint.tokenizer
    return compose.load(spec, batch_size=batch_size, hint=hint)


def make_user(spec: EvalSpec, checkpoint: Any) -> Any:
    """The ``UserSimulator`` named by ``spec.user`` (``checkpoint``: the agent's loaded
    policy, shared when the user is the same model)."""

    assert spec.user
    tokens, temperature = spec.user_max_new_tokens, spec.user_temperature
    if spec.user.startswith("openai+"):
        endpoint: Endpoint = replace(
            parse_endpoint(spec.user), max_tokens=tokens, temperature=temperature
        )
        return EndpointUser(endpoint)
    sampler, tokenizer = _embedded(spec.user, spec.model, checkpoint, spec.batch_size, "--user")
    return SamplerUser(sampler, tokenizer, tokens, temperature, seed=spec.seed)


def with_user(job: Any, spec: EvalSpec, checkpoint: Any) -> Any:
    """``job`` whose rollout config carries the simulated user of ``spec.user`` (if any)."""
    if not spec.user:
        return job
    try:
        user = make_user(spec, checkpoint)
    except (ValueError, RuntimeError) as err:
        raise typer.BadParameter(str(err), param_hint="--user") from err
    return replace(job, rollout=replace(job.rollout, user=user))


def make_judge(spec: EvaluationSpec, model: str, checkpoint: Any) -> Any:
    """The judge named by ``spec.judge`` (None: none; episodes that need one stay unscored);
    ``model``/``checkpoint``: the agent's, shared when the judge is the same model."""
    if not spec.judge:
        return None
    if spec.judge.startswith(("http://", "https://", "openai+")):
        plain = spec.judge.startswith("http")
        try:
            config = JudgeConfig(spec.judge)
            endpoint = judge_endpoint(config) if plain else parse_endpoint(spec.judge)
        except ValueError as err:
            raise typer.BadParameter(str(err), param_hint="--judge") from err
        return NlJudge(replace(endpoint, max_tokens=config.max_tokens, temperature=0.0))

    try:
        sampler, tokenizer = _embedded(spec.judge, model, checkpoint, spec.batch_size, "--judge")
    except (ValueError, RuntimeError) as err:
        raise typer.BadParameter(str(err), param_hint="--judge") from err
    return SamplerJudge(sampler, tokenizer, spec.judge_max_new_tokens, seed=spec.seed)
