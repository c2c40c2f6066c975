"""Progress bars of long commands: done / total with tok/s from a token-counting sampler."""

from __future__ import annotations

import io
from dataclasses import dataclass

from envace_engine.cli.train import ProgressSink
from envace_engine.samplers.base import TokenCounting
from envace_engine.sink import FanoutSink, JsonlSink


@dataclass
class Counter:
    generated: int = 0


def test_the_bar_moves_and_shows_tokens_per_second(tmp_path, monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr("sys.stderr", out)
    meter = Counter()
    assert isinstance(meter, TokenCounting)
    inner = JsonlSink(tmp_path)
    sink = ProgressSink(FanoutSink((inner,)), "eval toy", "episode", meter)
    sink.progress(0, 4, "starting")
    meter.generated += 500
    sink.progress(3, 4, "real episodes ended")
    sink.close()
    text = out.getvalue()
    assert "3/4" in text and "real episodes ended" in text
    rate = float(text.rsplit("eval toy · ", 1)[1].split(" tok/s")[0])
    assert rate > 0
    assert inner.last_progress == (3, 4, "real episodes ended")  # forwarded


def test_the_tokens_counted_by_the_embedded_sampler(tiny_path, tokenizer):
    from envace_engine.models import load_model, resolve
    from envace_engine.samplers.base import SamplingParams
    from envace_engine.samplers.embedded.sampler import HFSampler

    sampler = HFSampler(load_model(resolve("tiny")), tokenizer)
    assert isinstance(sampler, TokenCounting) and sampler.generated == 0
    gens = sampler.generate([[1, 2, 3], [4, 5]], SamplingParams(max_new_tokens=5, seed=0))
    assert sampler.generated == sum(len(g.token_ids) for g in gens) > 0


def test_train_and_sft_bars_take_their_rate_from_the_metrics(tmp_path, monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr("sys.stderr", out)
    train = ProgressSink(JsonlSink(tmp_path / "t"), "train r")
    train.progress(1, 40)
    train.metrics(0, {"perf/tokens_per_s": 83.5, "reward/mean": 0.5})
    train.progress(2, 40)
    train.close()
    assert "train r · 83.5 tok/s" in out.getvalue() and "2/40" in out.getvalue()
    sft = ProgressSink(JsonlSink(tmp_path / "s"), "sft")
    sft.metrics(0, {"sft/padded_tokens": 4000.0, "sft/loss": 1.0})
    sft.progress(1, 110)
    sft.close()
    rate = float(out.getvalue().rsplit("sft · ", 1)[1].split(" tok/s")[0])
    assert rate > 0


def test_a_sweep_counts_the_tokens_of_every_checkpoint():
    from types import SimpleNamespace

    from envace_engine.cli.eval import CheckpointMeter

    meter = CheckpointMeter()
    assert isinstance(meter, TokenCounting) and meter.generated == 0
    first, second = Counter(), Counter()
    models = [SimpleNamespace(sampler=first), SimpleNamespace(sampler=object())]
    models.append(SimpleNamespace(sampler=second))
    seen = meter.follow(iter(models))
    next(seen)
    first.generated = 40
    assert meter.generated == 40
    next(seen)  # a sampler that does not count adds nothing
    assert meter.generated == 40
    next(seen)
    second.generated = 2
    assert meter.generated == 42
