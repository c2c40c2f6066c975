"""SFT optimizer steps on smollm2-135m: ``envace sft``'s loop (ours) vs TRL's ``SFTTrainer``.

Both variants train on the *same* examples: the toy suite's SFT examples of both roles (all
three worlds, the study recipe's prompt settings), ``--steps`` batches of ``--batch`` examples
drawn once with a fixed seed. Ours gets them as token ids (prompt as the rollout renders it,
completion + end-of-turn) in our length- and prefix-bucketed batches; TRL gets the same samples
in its conversational prompt-completion form (``completion_only_loss``, bf16, AdamW, constant
lr). bf16 means bf16 autocast where the CPU runs it natively for both (``training.precision``:
fp32 on a CPU without AMX-BF16 / AVX512-BF16; ``bf16`` in the JSON says which ran). Each
variant runs in its own fresh subprocess (so its peak RSS, ``ru_maxrss`` of the child, is its
own), with the first ``--warmup`` steps left out of the timing.

A third variant, ``packed``, is our loop as the study recipe runs it (``pack_turns``): batches of
``--batch`` *sequences*, a task's nested act turns packed into one (``sft.chains``), the first
``--steps`` batches of one epoch over every example. It trains other (and more) examples per
step than the two above, so it is compared by completion tokens trained per second: TRL has no
counterpart (its assistant-only loss over a whole conversation needs generation markers in the
chat template, which SmolLM2's lacks).

Prints one JSON object as the last line: median seconds per optimizer step of each variant
(wall and process CPU), ``ratio`` = TRL / ours median wall time per step (> 1: ours is faster),
``cpu_ratio`` the same for CPU time (meaningful when other jobs share the cores), peak RSS of
each, the completion tokens per step, and ``pack_ratio`` = packed / ours completion tokens per
second. ``--quick`` runs 4 steps of batch 4 each.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.record import add_record_flag, record

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

if TYPE_CHECKING:
    from envace_engine.config import SFTConfig

VARIANTS = ("ours", "packed", "trl")
STUDY_PROMPTS = {"n_examples": 0, "grounded_rehearsal": False, "rehearse_history": True}


def _config(batch: int, steps: int) -> SFTConfig:
    from envace_engine.config import SFTConfig, build

    return build(
        SFTConfig,
        {
            "n_tasks": 512,
            "roles": ["act", "rehearse"],
            "batch_size": batch,
            "max_steps": steps,
            "lr": 1e-4,
            "eval_split": None,
            "rollout": STUDY_PROMPTS,
        },
    )


def _samples(batch: int, steps: int) -> list:
    """``steps * batch`` SFT samples, the same for both variants (seeded)."""
    from envace_engine.training.sft import all_samples

    return all_samples(_config(batch, steps))[: batch * steps]


def _ours(batch: int, steps: int, warmup: int, pack: bool = False) -> dict:
    """Our loop; ``pack`` draws ``steps`` batches of ``batch`` sequences from every example's
    chains (``pack_turns``: a task's nested act turns as one sequence) instead."""
    import torch

    from envace_engine.models import load_model, load_tokenizer, resolve
    from envace_engine.rollout.tokens import ChatTokenizer
    from envace_engine.training.sft import sft_loss
    from envace_engine.training.sft.data import (
        all_samples,
        bucketed_batches,
        chain_batch,
        chains,
        tokenize,
    )

    spec = resolve("smollm2-135m")
    model, tokenizer = load_model(spec), load_tokenizer(spec)
    samples = all_samples(_config(batch, steps)) if pack else _samples(batch, steps)
    examples = tokenize(samples, ChatTokenizer(tokenizer))
    found = chains(examples, pack)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.train()
    walls, cpus, tokens, rows = [], [], [], []
    batches = bucketed_batches(found, batch, seed=0)
    for picked in batches[:steps] if pack else batches:
        wall, cpu = time.perf_counter(), time.process_time()
        b = chain_batch(examples, found, picked, tokenizer.pad_token_id)
        loss = sft_loss(model, b, bf16=True)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
        tokens.append(b.num_tokens)
        rows.append(b.num_rows)
    return {"wall": walls[warmup:], "cpu": cpus[warmup:], "tokens": tokens[warmup:], "rows": rows}


def _native_bf16() -> bool:
    """bf16 where the trainer would take it (``precision.bf16_autocast``): TRL gets the same."""
    import torch

    from envace_engine.training.precision import bf16_autocast

    return bf16_autocast(True, torch.device("cuda" if torch.cuda.is_available() else "cpu"))


def _trl(batch: int, steps: int, warmup: int) -> dict:
    import tempfile

    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from envace_engine.models import load_model, load_tokenizer, resolve
    from envace_engine.training.sft import to_record

    spec = resolve("smollm2-135m")
    model, tokenizer = load_model(spec), load_tokenizer(spec)
    records = [to_record(s) for s in _samples(batch, steps)]
    data = Dataset.from_list(
        [{"prompt": r["prompt"], "completion": r["completion"]} for r in records]
    )
    walls: list[float] = []
    cpus: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.wall, self.cpu = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kw):
            walls.append(time.perf_counter() - self.wall)
            cpus.append(time.process_time() - self.cpu)

    with tempfile.TemporaryDirectory() as out:
        args = SFTConfig(
            output_dir=out,
            max_steps=steps,
            per_device_train_batch_size=batch,
            learning_rate=1e-4,
            lr_scheduler_type="constant",
            bf16=_native_bf16(),
            use_cpu=not torch.cuda.is_available(),
            max_length=8192,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            seed=0,
            dataloader_num_workers=0,
            disable_tqdm=True,
        )
        trainer = SFTTrainer(
            model=model,
            args=args,
            train_dataset=data,
            processing_class=tokenizer,
            callbacks=[Timer()],
        )
        trainer.train()
    return {"wall": walls[warmup:], "cpu": cpus[warmup:], "tokens": []}


def _child(variant: str, batch: int, steps: int, warmup: int) -> None:
    torch_threads = os.environ.get("ENVACE_BENCH_THREADS")
    if torch_threads:
        import torch

        torch.set_num_threads(int(torch_threads))
    if variant == "trl":
        out = _trl(batch, steps, warmup)
    else:
        out = _ours(batch, steps, warmup, pack=variant == "packed")
    out["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(json.dumps(out))


def _run(variant: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--child", variant, "--batch", str(args.batch)]
    cmd += ["--steps", str(args.steps), "--warmup", str(args.warmup)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{variant} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 steps of batch 4 per variant")
    parser.add_argument("--batch", type=int, default=8, help="examples per optimizer step")
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps per variant")
    parser.add_argument("--warmup", type=int, default=2, help="first steps left out of timing")
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    add_record_flag(parser)
    args = parser.parse_args()
    if args.quick:
        args.batch, args.steps, args.warmup = 4, 4, 1
    if args.child:
        _child(args.child, args.batch, args.steps, args.warmup)
        return
    runs = {v: _run(v, args) for v in VARIANTS}
    result: dict = {"batch": args.batch, "steps": args.steps, "warmup": args.warmup}
    for v, r in runs.items():
        result[f"{v}_step_s"] = statistics.median(r["wall"])
        result[f"{v}_cpu_step_s"] = statistics.median(r["cpu"])
        result[f"{v}_peak_rss_gb"] = r["peak_rss_gb"]
    result["completion_tokens_per_step"] = statistics.mean(runs["ours"]["tokens"])
    for v in ("ours", "packed"):  # completion tokens trained per second of the timed steps
        result[f"{v}_completion_tok_s"] = sum(runs[v]["tokens"]) / sum(runs[v]["wall"])
    result["packed_completion_tokens_per_step"] = statistics.mean(runs["packed"]["tokens"])
    result["packed_examples_per_step"] = statistics.mean(runs["packed"]["rows"])
    result["pack_ratio"] = result["packed_completion_tok_s"] / result["ours_completion_tok_s"]
    result["bf16"] = _native_bf16()
    result["ratio"] = result["trl_step_s"] / result["ours_step_s"]
    result["cpu_ratio"] = result["trl_cpu_step_s"] / result["ours_cpu_step_s"]
    print(json.dumps(result))
    if args.record:
        record(__file__, result)


if __name__ == "__main__":
    main()
