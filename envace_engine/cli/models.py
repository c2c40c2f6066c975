"""``envace models``: list the registry, and smoke-test a model with a short generation."""

from __future__ import annotations

import time
from typing import Annotated, cast

import typer

from envace_engine.config import SamplerDtype
from envace_engine.models import (
    ModelError,
    cache_dir,
    load_model,
    load_tokenizer,
    registry,
    resolve,
)

# ``--dtype`` of the commands that sample (eval, sweep, rollout): the embedded sampler's GEMMs.
DtypeOpt = Annotated[
    SamplerDtype,
    typer.Option(
        "--dtype",
        help="embedded sampler's GEMM dtype: auto = bf16 where the CPU has a native bf16 unit",
    ),
]

app = typer.Typer(help="Models: the registry and a smoke test.", no_args_is_help=True)


@app.command("list")
def list_models() -> None:
    """List built-in model names (a local checkpoint dir or sglang+http://HOST:PORT also work)."""

    for name, about in registry().items():
        typer.echo(f"{name:14s} {about}")
    typer.echo(f"\ncache: {cache_dir()}  (override with ENVACE_CACHE)")
    typer.echo("also: a local Hugging Face checkpoint directory, or sglang+http://HOST:PORT")


@app.command("smoke")
def smoke(
    model: str = typer.Argument(..., help="model name, checkpoint dir or sglang+http://HOST:PORT"),
    prompt: str = typer.Option("What is the capital of France?", help="user message"),
    max_new_tokens: int = typer.Option(48, min=1, help="tokens to generate"),
) -> None:
    """Generate a short greedy completion; print the text and tokens/s."""
    import torch
    from transformers import BatchEncoding, GenerationMixin

    try:
        spec = resolve(model)
        t0 = time.perf_counter()
        tokenizer = load_tokenizer(spec)
        net = load_model(spec)
    except ModelError as err:
        raise typer.BadParameter(str(err), param_hint="MODEL") from err
    load_s = time.perf_counter() - t0
    # transformers types the result as any of the forms it can take; return_dict=True gives this.
    encoded = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, return_dict=True
    )
    ids = cast(BatchEncoding, encoded)["input_ids"]
    assert isinstance(net, GenerationMixin)  # a causal LM; load_model returns its base class
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = net.generate(
            torch.tensor([ids]),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
        )
    gen_s = time.perf_counter() - t0
    new = out[0, len(ids) :].tolist()
    typer.echo(f"model:      {spec.name} ({spec.path})")
    typer.echo(f"prompt:     {prompt}")
    typer.echo(f"completion: {tokenizer.decode(new, skip_special_tokens=True)}")
    typer.echo(
        f"tokens:     {len(new)} in {gen_s:.2f} s = {len(new) / gen_s:.1f} tok/s "
        f"(load {load_s:.2f} s, {torch.get_num_threads()} threads)"
    )
