"""The ``--user``, ``--basis`` and ``--judge`` options of ``envace eval``: parsing and wiring.

``--user`` names the simulated user of a τ² or VitaBench evaluation: a model name or checkpoint
directory (the embedded engine; the agent's own sampler is reused when it is the same model), an
SGLang spec (``sglang+http://HOST:PORT``), or an OpenAI-compatible endpoint
(``openai+http://HOST:PORT[?model=NAME]``). The user is never trained and samples greedily, as
τ²'s and VitaBench's do. ``--judge`` (alias ``--judge-url``) is the judge both suites' scores
need (VitaBench: all of them), an endpoint or an embedded model named the same ways; without
one those episodes are stored unscored.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any

import typer

UserOpt = Annotated[
    str | None,
    typer.Option(
        "--user",
        help="simulated user (tau2, vita): model name, checkpoint dir, sglang+http://HOST:PORT or "
        "openai+http://HOST:PORT[?model=NAME]; default: replay the task's scripted opening",
    ),
]
BasisOpt = Annotated[
    str | None,
    typer.Option(
        "--basis", help="scoring basis: bfcl official|strict, tau2 official|legacy (default first)"
    ),
]
JudgeOpt = Annotated[
    str | None,
    typer.Option(
        "--judge",
        "--judge-url",
        help="judge of tau2 NL assertions and of every vita score (none: those stay unscored): "
        "http://HOST:PORT or openai+http://HOST:PORT[?model=NAME] (OpenAI-compatible), "
        "or a model name or checkpoint dir (the embedded engine)",
    ),
]
JudgeTokensOpt = Annotated[
    int, typer.Option("--judge-max-new-tokens", min=1, help="tokens per embedded-judge reply")
]
StepsOpt = Annotated[
    int, typer.Option("--max-steps", min=1, help="messages per simulated-user conversation")
]
UserTokensOpt = Annotated[
    int, typer.Option("--user-max-new-tokens", min=1, help="tokens per simulated-user message")
]
UserTempOpt = Annotated[
    float, typer.Option("--user-temperature", min=0.0, help="simulated user's temperature (τ²: 0)")
]


def _embedded(spec: str, model: str, checkpoint: Any, batch_size: int) -> tuple[Any, Any]:
    """The sampler and tokenizer of model ``spec`` (the agent's own when it is the same)."""
    if spec == model:  # one model plays several parts: share its weights and sampler
        return checkpoint.sampler, checkpoint.tokenizer
    from envace_engine.models import load_tokenizer, resolve
    from envace_engine.samplers import make_sampler

    resolved = resolve(spec)
    tokenizer = load_tokenizer(resolved)
    return make_sampler(resolved, tokenizer=tokenizer, batch_size=batch_size), tokenizer


def make_user(spec: str, model: str, checkpoint: Any, batch_size: int, opts: dict[str, Any]) -> Any:
    """The ``UserSimulator`` named by ``spec`` (``checkpoint``: the agent's loaded policy;
    ``opts``: the command's ``user_max_new_tokens``, ``user_temperature`` and ``seed``)."""
    max_new_tokens, temperature = opts["user_max_new_tokens"], opts["user_temperature"]
    from envace_engine.rollout.user import SamplerUser

    if spec.startswith("openai+"):
        from envace_engine.rollout.endpoints import Endpoint, EndpointUser, parse_endpoint

        endpoint: Endpoint = replace(
            parse_endpoint(spec), max_tokens=max_new_tokens, temperature=temperature
        )
        return EndpointUser(endpoint)
    sampler, tokenizer = _embedded(spec, model, checkpoint, batch_size)
    return SamplerUser(sampler, tokenizer, max_new_tokens, temperature, seed=opts["seed"])


def with_user(job: Any, opts: dict[str, Any], model: str, checkpoint: Any, batch: int) -> Any:
    """``job`` whose rollout config carries the simulated user of ``opts["user"]`` (if any)."""
    spec = opts.get("user")
    if not spec:
        return job
    try:
        user = make_user(spec, model, checkpoint, batch, opts)
    except (ValueError, RuntimeError) as err:
        raise typer.BadParameter(str(err), param_hint="--user") from err
    return replace(job, rollout=replace(job.rollout, user=user))


def make_judge(
    spec: str | None, model: str, checkpoint: Any, batch_size: int, opts: dict[str, Any]
) -> Any:
    """The judge named by ``--judge`` (None: none; episodes that need one stay unscored)."""
    if not spec:
        return None
    if spec.startswith(("http://", "https://", "openai+")):
        from envace_engine.rollout.endpoints import NlJudge, parse_endpoint
        from envace_engine.rollout.rewards import JudgeConfig, judge_endpoint

        plain = spec.startswith("http")
        try:
            endpoint = judge_endpoint(JudgeConfig(spec)) if plain else parse_endpoint(spec)
        except ValueError as err:
            raise typer.BadParameter(str(err), param_hint="--judge") from err
        tokens = JudgeConfig(spec).max_tokens
        return NlJudge(replace(endpoint, max_tokens=tokens, temperature=0.0))
    from envace_engine.rollout.judges import SamplerJudge

    try:
        sampler, tokenizer = _embedded(spec, model, checkpoint, batch_size)
    except (ValueError, RuntimeError) as err:
        raise typer.BadParameter(str(err), param_hint="--judge") from err
    return SamplerJudge(sampler, tokenizer, opts["judge_max_new_tokens"], seed=opts["seed"])
