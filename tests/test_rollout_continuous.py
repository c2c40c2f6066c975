"""The continuous-batching rollout (HFSampler sessions) against the micro-step loop."""

from __future__ import annotations

from envace_engine.rollout.loop import RolloutConfig, rollout
from envace_engine.samplers.base import Generation, SamplingParams
from envace_engine.samplers.embedded.sampler import HFSampler
from envace_engine.samplers.sglang import SGLangSampler
from tests.kv_world import KVSuite
from tests.sglang_server import running_server

SUITE = KVSuite()


class BatchOnly:
    """The same HFSampler seen through ``generate`` only, so the rollout uses micro-steps."""

    def __init__(self, inner: HFSampler) -> None:
        self.inner = inner

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        return self.inner.generate(prompts, params)


def _episodes(sampler, tokenizer):
    config = RolloutConfig(
        seed=0, temperature=0.0, max_new_tokens_act=12, max_new_tokens_rehearse=12
    )
    return rollout(SUITE.tasks()[:3], SUITE, sampler, tokenizer, config, 2, run_id="c")


def test_continuous_and_micro_step_rollouts_give_the_same_greedy_episodes(tiny_model, tokenizer):
    continuous = _episodes(HFSampler(tiny_model, tokenizer, batch_size=4), tokenizer)
    stepped = _episodes(BatchOnly(HFSampler(tiny_model, tokenizer)), tokenizer)
    assert len(continuous) == len(stepped) == 6
    for a, b in zip(continuous, stepped, strict=True):
        assert a.id == b.id and a.stop_reason == b.stop_reason and a.drift == 0
        assert [s.token_ids for s in a.segments] == [s.token_ids for s in b.segments]
        for sa, sb in zip(a.segments, b.segments, strict=True):
            if sa.logprobs is not None:
                assert max(abs(x - y) for x, y in zip(sa.logprobs, sb.logprobs, strict=True)) < 1e-4


def test_progress_reports_endings_up_to_all_episodes(tiny_model, tokenizer):
    seen: list[tuple[int, int]] = []
    config = RolloutConfig(seed=1, max_new_tokens_act=6)
    sampler = HFSampler(tiny_model, tokenizer, batch_size=3)
    progress = lambda ended, total: seen.append((ended, total))  # noqa: E731
    rollout(SUITE.tasks()[:2], SUITE, sampler, tokenizer, config, 2, progress=progress)
    assert seen[0] == (0, 4) and seen[-1] == (4, 4)
    assert [e for e, _ in seen] == sorted(e for e, _ in seen)


def test_a_rollout_over_sglang_submits_requests_continuously_and_matches_hf(
    tiny_path, tiny_model, tokenizer
):
    local = _episodes(HFSampler(tiny_model, tokenizer, batch_size=4), tokenizer)
    with running_server(tiny_path) as one, running_server(tiny_path) as two:
        sampler = SGLangSampler([one.url, two.url], timeout_s=120.0)
        remote = _episodes(sampler, tokenizer)
        bodies = one.requests + two.requests
    assert all(len(b["input_ids"]) == 1 for b in bodies)  # a session: one request per call
    assert one.requests and two.requests  # the GRPO groups spread over both servers
    for a, b in zip(remote, local, strict=True):
        assert a.id == b.id and a.stop_reason == b.stop_reason and a.drift == 0
        assert [s.token_ids for s in a.segments] == [s.token_ids for s in b.segments]
