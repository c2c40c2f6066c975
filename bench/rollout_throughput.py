"""Rollout throughput: the batched rollout engine vs one ``model.generate`` call per generation.

Workload (GRPO-shaped): smollm2-135m, toy suite, rehearsal mode, 8 tasks x group 4 (32
episodes), multi-turn, worked examples on (the embedded default). ``--quick``: 2 tasks x group
2, one reply per user turn, shorter generations.

* engine: ``rollout()`` with ``HFSampler`` — continuous batching (an episode's next act or
  rehearse request joins the running decode batch as soon as its last one finishes), the
  prefix K/V cache (each request prefills only tokens no earlier request computed), shared
  prompt slots with cascade attention (a GRPO group's prompt K/V is held and read once), and
  oneDNN-packed linear weights (``--no-packed`` turns those off). A recording wrapper keeps
  each generation's prompt and length.
* naive: the same prompts replayed one at a time with ``model.generate`` (batch 1), each
  forced to produce exactly as many tokens as the engine's generation did (min = max new
  tokens), so both do the same work. The full run replays every generation (a few minutes;
  a sample's naive rate varies widely, since prompt and generation lengths do); ``--quick``
  and ``--naive-sample N`` replay N at random.

The engine runs ``--repeats`` times (3; 1 with ``--quick``) and its rate is the median. The
naive replay is split into as many chunks, each run right after an engine run, so that a slow
spell of a noisy machine hits both sides; its rate is total tokens over total seconds. Prints
one JSON line per engine run, then one JSON object as the last line: engine and naive
tokens/s, ``ratio`` = engine / naive tokens/s. ``--naive-packed`` also replays each chunk with
the engine's packed linear weights and adds ``naive_packed_tok_s`` and
``ratio_vs_naive_packed``: how much of the ratio is batching and caching rather than the
faster GEMM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.record import add_record_flag, record
from envace_engine.samplers.base import Generation, SamplingParams

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@dataclass
class RecordingSampler:
    """Wraps a sampler; keeps (prompt, params, generated length) of every generation."""

    inner: Any
    calls: list[tuple[list[int], SamplingParams, int]] = field(default_factory=list)
    batches: int = 0  # generate() calls, or decode steps of a session

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """Delegate, then record each prompt and how many tokens it got."""
        self.batches += 1
        gens = self.inner.generate(prompts, params)
        self.calls += [
            (list(p), params, len(g.token_ids)) for p, g in zip(prompts, gens, strict=True)
        ]
        return gens

    @contextlib.contextmanager
    def session(self, params: SamplingParams) -> Iterator[RecordingSession]:
        """The inner sampler's continuous-batching session, recorded."""
        with self.inner.session(params) as inner:
            yield RecordingSession(inner, params, self)


@dataclass
class RecordingSession:
    """Records what a ``DecodeSession`` generates, per request."""

    inner: Any
    params: SamplingParams
    recorder: RecordingSampler
    asked: dict[Any, tuple[list[int], int]] = field(default_factory=dict)

    @property
    def busy(self) -> bool:
        """Whether the inner session has work."""
        return self.inner.busy

    def submit(self, key: Any, prompt: list[int], cap: int, stops: frozenset[int]) -> None:
        """Delegate; remember the request."""
        self.asked[key] = (list(prompt), cap)
        self.inner.submit(key, prompt, cap, stops)

    def step(self) -> list[tuple[Any, Generation]]:
        """One decode step; record the generations it finished."""
        self.recorder.batches += 1
        done = self.inner.step()
        for key, gen in done:
            prompt, cap = self.asked.pop(key)
            params = replace(self.params, max_new_tokens=cap)
            self.recorder.calls.append((prompt, params, len(gen.token_ids)))
        return done


def run_engine(
    model: Any, tokenizer: Any, args: argparse.Namespace
) -> tuple[float, list[tuple[list[int], SamplingParams, int]], dict[str, Any]]:
    """One batched rollout; returns (seconds, generations as (prompt, params, length), stats).

    The sampler (its prefix cache, packed weights) is dropped on return, so the next run
    starts as a trainer's next step would: with that memory freed for reuse.
    """
    from envace_engine.environments import get_suite
    from envace_engine.rollout.loop import RolloutConfig, rollout, rollout_metrics
    from envace_engine.samplers.embedded.sampler import HFSampler

    suite = get_suite("toy")
    pool = suite.tasks("train")
    tasks = random.Random(args.seed).sample(pool, args.tasks)
    config = RolloutConfig(
        mode="rehearsal",
        max_turns=args.max_turns,
        max_new_tokens_act=args.max_new_tokens,
        max_new_tokens_rehearse=args.max_new_tokens,
        temperature=1.0,
        seed=args.seed,
        n_examples=2,
    )
    sampler = HFSampler(
        model, tokenizer, batch_size=args.batch_size, packed_weights=not args.no_packed
    )
    recorder = RecordingSampler(sampler)
    start = time.perf_counter()
    episodes = rollout(tasks, suite, recorder, tokenizer, config, args.group, example_pool=pool)
    seconds = time.perf_counter() - start
    metrics = rollout_metrics(episodes)
    stats = {
        "episodes": len(episodes),
        "generations": len(recorder.calls),
        "sampler_steps": recorder.batches,
        # prompt tokens the engine ran through the model (the rest came from its prefix cache)
        # against the prompt tokens the naive baseline prefills for the same generations
        "engine_prefilled_tokens": recorder.inner.prefilled,
        "naive_prefill_tokens": sum(len(c[0]) for c in recorder.calls),
        "drift": metrics["rollout/drift"],
        "stop_reasons": {
            k.removeprefix("rollout/stop/"): v
            for k, v in metrics.items()
            if k.startswith("rollout/stop/") and v
        },
    }
    return seconds, recorder.calls, stats


@dataclass
class Replay:
    """Running totals of the naive replay over its chunks."""

    tokens: int = 0
    seconds: float = 0.0
    rates: list[float] = field(default_factory=list)  # tokens/s of each generation

    def add(self, tokens: int, seconds: float, rates: list[float]) -> None:
        """Count one chunk."""
        self.tokens, self.seconds = self.tokens + tokens, self.seconds + seconds
        self.rates += rates

    @property
    def tok_s(self) -> float:
        """Tokens per second over every chunk so far."""
        return self.tokens / self.seconds


def replay_naive(
    model: Any,
    tokenizer: Any,
    calls: list[tuple[list[int], SamplingParams, int]],
    packed: bool = False,
) -> tuple[int, float, list[float]]:
    """Replay generations one at a time with ``model.generate``; (tokens, seconds, rates).

    ``packed``: with the engine's oneDNN-packed linear weights (``samplers/packed.py``), to
    separate what batching and caching gain from what the faster GEMM gains.
    """
    import torch

    from envace_engine.samplers.embedded.packed import PackedLinears

    kernels = PackedLinears(model, enabled=packed)
    tokens, seconds, rates = 0, 0.0, []
    for prompt, params, length in calls:
        start = time.perf_counter()
        with torch.inference_mode(), kernels.active():
            out = model.generate(
                torch.tensor([prompt]),
                max_new_tokens=length,
                min_new_tokens=length,
                do_sample=True,
                temperature=params.temperature,
                top_k=0,
                pad_token_id=tokenizer.pad_token_id,
            )
        took = time.perf_counter() - start
        made = out.shape[1] - len(prompt)
        tokens, seconds = tokens + made, seconds + took
        rates.append(made / took)
    return tokens, seconds, rates


def naive_chunks(calls: list[Any], args: argparse.Namespace) -> list[list[Any]]:
    """The generations the naive baseline replays, in ``args.repeats`` interleaved chunks."""
    calls = [c for c in calls if c[2] > 0]
    sample = random.Random(args.seed).sample(calls, min(args.naive_sample, len(calls)))
    return [sample[i :: args.repeats] for i in range(args.repeats)]


def parse_args() -> argparse.Namespace:
    """Command line; workload sizes follow ``--quick``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small workload, under a minute")
    parser.add_argument(
        "--repeats", type=int, default=0, help="engine runs, median (default 3; 1 quick)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--batch-size", type=int, default=32, help="HFSampler decode slots")
    parser.add_argument(
        "--naive-sample", type=int, default=0, help="generations replayed (default: all; 3 quick)"
    )
    parser.add_argument(
        "--no-packed", action="store_true", help="engine without oneDNN-packed linear weights"
    )
    parser.add_argument(
        "--naive-packed",
        action="store_true",
        help="also replay the naive baseline with the engine's packed linear weights",
    )
    add_record_flag(parser)
    args = parser.parse_args()
    args.tasks, args.group = (2, 2) if args.quick else (8, 4)
    args.max_turns = 1 if args.quick else 3
    args.max_new_tokens = 24 if args.quick else 64
    args.naive_sample = args.naive_sample or (3 if args.quick else 10_000)
    args.repeats = args.repeats or (1 if args.quick else 3)
    return args


def main() -> None:
    """Engine runs interleaved with chunks of the naive replay; print the JSON summary.

    The machines are noisy (a slow spell can last tens of seconds), so the naive replay is
    split into one chunk per engine run and each chunk runs right after its engine run: a
    slow spell then hits both sides rather than only the short engine run.
    """
    args = parse_args()

    import torch

    from envace_engine.models import load_model, load_tokenizer, resolve

    torch.set_num_threads(args.threads)
    spec = resolve("smollm2-135m")
    tokenizer, model = load_tokenizer(spec), load_model(spec)
    engine_rates, runs, chunks = [], [], None
    naive = {False: Replay(), True: Replay()}  # by packed weights or not
    for i in range(args.repeats):
        seconds, calls, stats = run_engine(model, tokenizer, args)
        generated = sum(c[2] for c in calls)
        engine_rates.append(generated / seconds)
        chunks = chunks or naive_chunks(calls, args)
        run = {"engine_tokens": generated, "engine_s": round(seconds, 2), **stats}
        for packed in (False, True) if args.naive_packed else (False,):
            tokens, naive_s, rates = replay_naive(model, tokenizer, chunks[i], packed)
            naive[packed].add(tokens, naive_s, rates)
            run["naive_packed_s" if packed else "naive_chunk_s"] = round(naive_s, 2)
        runs.append(run)
        print(json.dumps(run), flush=True)
    result = summary(args, engine_rates, naive, runs)
    print(json.dumps(result))
    if args.record:
        record(__file__, result)


def summary(
    args: argparse.Namespace, engine_rates: list[float], naive: dict[bool, Replay], runs: list
) -> dict[str, Any]:
    """The last line: median engine tokens/s against the naive replay's tokens/s."""
    engine = statistics.median(engine_rates)
    plain = naive[False]
    result = {
        "bench": "rollout_throughput",
        "quick": args.quick,
        "workload": f"{args.tasks} tasks x group {args.group}, toy, rehearsal, "
        f"max_turns {args.max_turns}, max_new_tokens {args.max_new_tokens}",
        "threads": args.threads,
        "packed_weights": not args.no_packed,
        "engine_runs_tok_s": [round(r, 2) for r in engine_rates],
        "engine_tok_s": round(engine, 2),
        "naive_tokens": plain.tokens,
        "naive_s": round(plain.seconds, 2),
        "naive_median_gen_tok_s": round(statistics.median(plain.rates), 2),
        "naive_tok_s": round(plain.tok_s, 2),
        "ratio": round(engine / plain.tok_s, 2),
        "runs": runs,
    }
    if args.naive_packed:
        result["naive_packed_tok_s"] = round(naive[True].tok_s, 2)
        result["ratio_vs_naive_packed"] = round(engine / naive[True].tok_s, 2)
    return result


if __name__ == "__main__":
    main()
