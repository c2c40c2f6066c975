"""The ``--user``, ``--basis`` and ``--judge-url`` options of ``envace eval``: parsing and wiring.

``--user`` names the simulated user of a τ² evaluation: a model name or checkpoint directory
(the embedded engine; the agent's own sampler is reused when it is the same model), an SGLang
spec (``sglang+http://HOST:PORT``), or an OpenAI-compatible endpoint
(``openai+http://HOST:PORT[?model=NAME]``). The user is never trained and samples greedily,
as τ²'s does.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any

import typer

UserOpt = Annotated[
    str | None,
    typer.Option(
        "--user",
        help="simulated user (tau2): model name, checkpoint dir, sglang+http://HOST:PORT or "
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
    typer.Option("--judge-url", help="OpenAI-compatible judge for tau2 NL assertions"),
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
    if spec == model:  # one model plays both sides: share its weights and sampler
        sampler, tokenizer = checkpoint.sampler, checkpoint.tokenizer
    else:
        from envace_engine.models import load_tokenizer, resolve
        from envace_engine.samplers import make_sampler

        resolved = resolve(spec)
        tokenizer = load_tokenizer(resolved)
        sampler = make_sampler(resolved, tokenizer=tokenizer, batch_size=batch_size)
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


def judge_config(url: str | None) -> Any:
    """The judge endpoint for τ²'s NL assertions (None: NL-gated tasks stay unscored)."""
    from envace_engine.rollout.rewards import JudgeConfig

    return JudgeConfig(url=url) if url else None
