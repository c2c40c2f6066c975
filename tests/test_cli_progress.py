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
