"""One engine's rollout of the bench workload, in a fresh process: ``child.py SPEC OUT``.

``SPEC`` (JSON) names the engine (``embedded``: our ``HFSampler``; ``library``: transformers'
continuous batching, ``library.py``), the model and the workload; the result goes to ``OUT``
(JSON): seconds, generated tokens, stats and, when asked, every generation's prompt and length
(the naive replay and the roofline use them). ``envace_engine`` is imported from
``$PYTHONPATH`` first, so the parent can point it at a git revision's export; the imports
below accept that revision's module layout too (before the engine moved into packages).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import random
import sys
import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _engine_imports() -> tuple[Any, Any, Any, Any]:
    """(RolloutConfig, rollout, rollout_metrics, HFSampler) from this or an older layout."""
    try:
        from envace_engine.rollout.loop import RolloutConfig, rollout, rollout_metrics
    except ImportError:  # before the engine's packages: envace_engine/rollout.py
        from envace_engine.rollout import RolloutConfig, rollout, rollout_metrics  # type: ignore
    try:
        from envace_engine.samplers.embedded.sampler import HFSampler
    except ImportError:
        from envace_engine.samplers.hf import HFSampler  # type: ignore
    return RolloutConfig, rollout, rollout_metrics, HFSampler


@dataclass
class Recorder:
    """Wraps a ``Session``: records each generation; ``ignore_eos`` drops every stop id."""

    inner: Any
    ignore_eos: bool
    asked: dict[Hashable, list[int]] = field(default_factory=dict)
    calls: list[tuple[Hashable, list[int], list[int]]] = field(default_factory=list)  # ids made
    steps: int = 0

    @property
    def busy(self) -> bool:
        """Whether the inner session has work."""
        return self.inner.busy

    def submit(self, key: Hashable, prompt: list[int], cap: int, stops: frozenset[int]) -> None:
        """Delegate (without stop ids when ignoring EOS); remember the prompt."""
        self.asked[key] = list(prompt)
        self.inner.submit(key, prompt, cap, frozenset() if self.ignore_eos else stops)

    def step(self) -> list[Any]:
        """Delegate; record what finished."""
        self.steps += 1
        done = self.inner.step()
        for key, gen in done:
            prompt = self.asked.pop(key)
            self.calls.append((key, prompt, list(gen.token_ids)))
        return done


@dataclass
class RecordingSampler:
    """A ``SessionSampler`` whose sessions are recorded (one rollout opens one or more)."""

    inner: Any
    ignore_eos: bool
    sessions: list[Recorder] = field(default_factory=list)

    def generate(self, prompts: list[list[int]], params: Any) -> list[Any]:
        """Unused by a session-driven rollout; delegate."""
        return self.inner.generate(prompts, params)

    def session(self, params: Any) -> Any:
        """The inner session, recorded."""
        import contextlib

        @contextlib.contextmanager
        def opened() -> Any:
            with self.inner.session(params) as s:
                rec = Recorder(s, self.ignore_eos)
                self.sessions.append(rec)
                yield rec

        return opened()


def _accepted(fn: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The ``kwargs`` a callable (or dataclass) of this code revision accepts."""
    if dataclasses.is_dataclass(fn):
        names = {f.name for f in dataclasses.fields(fn)}
    else:
        names = set(inspect.signature(fn).parameters)
    return {k: v for k, v in kwargs.items() if k in names}


def run(spec: dict[str, Any], around: Any = None) -> dict[str, Any]:
    """Load, build the sampler, roll the workload out once, time it. ``around``: a context
    manager the timed rollout runs in (the profile bench's profiler; default none)."""
    import contextlib

    import torch

    import envace_engine
    from envace_engine.environments import get_suite
    from envace_engine.models import load_model, load_tokenizer, resolve
    from envace_engine.types import Mode

    torch.set_num_threads(spec["threads"])
    RolloutConfig, rollout, rollout_metrics, HFSampler = _engine_imports()
    model_spec = resolve(spec["model"])
    tokenizer, model = load_tokenizer(model_spec), load_model(model_spec)
    if spec["engine"] == "library":
        from library import LibrarySampler  # type: ignore[import-not-found]

        if spec["dtype"] == "bfloat16":
            model = model.bfloat16()
        sampler: Any = LibrarySampler(model, tokenizer, spec["library_settings"], spec["attn"])
    else:
        options = {"batch_size": spec["batch_size"], "dtype": spec["dtype"]}
        sampler = HFSampler(model, tokenizer, **_accepted(HFSampler.__init__, options))
    suite = get_suite("toy")
    pool = suite.tasks("train")
    tasks = random.Random(spec["seed"]).sample(pool, spec["tasks"])
    config = RolloutConfig(**_accepted(RolloutConfig, {**spec["rollout"], "mode": Mode.REHEARSAL}))
    recorder = RecordingSampler(sampler, spec["ignore_eos"])
    with around if around is not None else contextlib.nullcontext():
        start = time.perf_counter()
        episodes = rollout(
            tasks, suite, recorder, tokenizer, config, spec["group"], example_pool=pool
        )
        seconds = time.perf_counter() - start
    calls = [c for s in recorder.sessions for c in s.calls]
    metrics = rollout_metrics(episodes)
    out: dict[str, Any] = {
        "engine": spec["engine"],
        "code": os.path.dirname(os.path.dirname(envace_engine.__file__)),
        "seconds": seconds,
        "tokens": sum(len(ids) for _, _, ids in calls),
        "generations": len(calls),
        "steps": sum(s.steps for s in recorder.sessions),
        "prefilled": getattr(sampler, "prefilled", None),
        "stop_reasons": {
            k.removeprefix("rollout/stop/"): v
            for k, v in metrics.items()
            if k.startswith("rollout/stop/") and v
        },
    }
    if spec.get("record_calls"):
        out["calls"] = [[_chain(k), p, len(ids)] for k, p, ids in calls]
        out["made"] = [ids for _, _, ids in calls]
    return out


def _chain(key: Hashable) -> str:
    """The episode a generation belongs to (our rollout keys requests ``(episode, role)``)."""
    return str(key[0]) if isinstance(key, tuple) else str(key)


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        result = run(json.load(f))
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(result, f)
