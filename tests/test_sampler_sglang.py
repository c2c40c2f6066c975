"""SGLangSampler end to end against a loopback SGLang-protocol server backed by the tiny model."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import pytest
import torch

from envace_engine.samplers.base import SamplingParams
from envace_engine.samplers.embedded.sampler import HFSampler
from envace_engine.samplers.routing import PrefixRouter, prefix_hashes
from envace_engine.samplers.sglang import SamplerError, SGLangSampler
from tests.sglang_server import Faults, LoopbackSGLang, running_server

GREEDY = SamplingParams(max_new_tokens=8, temperature=0.0)


@pytest.fixture(scope="module")
def servers(tiny_path) -> Iterator[tuple[LoopbackSGLang, LoopbackSGLang]]:
    """Two loopback servers on the tiny model, shared by the module (faults reset per test)."""
    with running_server(tiny_path) as one, running_server(tiny_path) as two:
        yield one, two


@pytest.fixture()
def server(servers) -> LoopbackSGLang:
    for s in servers:
        s.faults = Faults()
        s.requests.clear()
        s.aborts.clear()
    return servers[0]


@pytest.fixture(scope="module")
def reference(tiny_model, tokenizer) -> HFSampler:
    return HFSampler(tiny_model, tokenizer)


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    return [tokenizer.encode(t) for t in ["Hi", "Plan a trip to Rome", "ls -la and then cat a.txt"]]


def client(*urls: str, **kwargs) -> SGLangSampler:
    kwargs = {"timeout_s": 120.0, "max_retries": 2, "backoff_s": 0.01, **kwargs}
    return SGLangSampler(list(urls), **kwargs)


def dead_url() -> str:
    """A loopback port with nothing listening (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def assert_matches(remote, local) -> None:
    for r, h in zip(remote, local, strict=True):
        assert r.token_ids == h.token_ids and r.finish_reason == h.finish_reason
        assert r.text == h.text
        assert max(abs(a - b) for a, b in zip(r.logprobs, h.logprobs, strict=True)) < 1e-5


def test_greedy_outputs_equal_hf_sampler_and_request_follows_protocol(server, reference, prompts):
    remote = client(server.url).generate(prompts, GREEDY)
    assert_matches(remote, reference.generate(prompts, GREEDY))
    (body,) = server.requests
    assert body["input_ids"] == prompts and body["return_logprob"] is True
    assert body["logprob_start_len"] == -1
    assert len(set(body["rid"])) == len(prompts)
    assert body["sampling_params"]["max_new_tokens"] == 8


def test_seeded_sampling_is_reproducible_and_varies_across_a_group(server, prompts):
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=5)
    group = [prompts[1]] * 3  # a GRPO group: one shared seed would give identical samples
    first = client(server.url).generate(group, params)
    again = client(server.url).generate(group, params)
    assert [g.token_ids for g in first] == [g.token_ids for g in again]
    assert len({g.token_ids for g in first}) == 3
    seeds = [sp["sampling_seed"] for sp in server.requests[0]["sampling_params"]]
    assert seeds == [5, 6, 7]


def test_stop_token_is_in_ids_not_in_text(server, reference, prompts, tokenizer):
    stop = reference.generate(prompts[:1], GREEDY)[0].token_ids[3]
    params = SamplingParams(max_new_tokens=8, temperature=0.0, stop_token_ids=(stop,))
    (gen,) = client(server.url).generate(prompts[:1], params)
    assert gen.finish_reason == "stop" and gen.token_ids[-1] == stop
    assert gen.text == tokenizer.decode(gen.token_ids[:-1], skip_special_tokens=True)


def test_503_is_retried_with_fresh_rids(server, reference, prompts):
    server.faults.status_503 = 2
    remote = client(server.url, max_retries=3).generate(prompts, GREEDY)
    assert_matches(remote, reference.generate(prompts, GREEDY))
    assert len(server.requests) == 3
    rid_sets = [tuple(body["rid"]) for body in server.requests]
    assert len(set(rid_sets)) == 3  # a retry never reuses an rid (SGLang: duplicate -> 400)


def test_persistent_503_ends_in_error_generations(server, prompts):
    server.faults.status_503 = 10
    gens = client(server.url, max_retries=2).generate(prompts, GREEDY)
    assert [g.finish_reason for g in gens] == ["error"] * 3
    assert "503" in gens[0].error and "gave up after 3 attempts" in gens[0].error
    assert len(server.requests) == 3


def test_slow_answer_is_aborted_then_retried(server, reference, prompts):
    # the injected delay ends early once the rid is aborted; the timeout leaves the retry room
    # to finish on a loaded machine
    server.faults.delay, server.faults.delay_s = 1, 120.0
    short = SamplingParams(max_new_tokens=2, temperature=0.0)
    remote = client(server.url, timeout_s=5.0).generate(prompts, short)
    assert_matches(remote, reference.generate(prompts, short))
    first_rids = server.requests[0]["rid"]
    (abort_prefix,) = server.aborts
    assert all(rid.startswith(abort_prefix) for rid in first_rids)
    assert len(server.requests) == 2


def test_slow_answer_without_retries_is_reported(server, prompts):
    server.faults.delay, server.faults.delay_s = 1, 3.0
    gens = client(server.url, timeout_s=0.3, max_retries=0).generate(prompts, GREEDY)
    assert {g.finish_reason for g in gens} == {"error"}
    assert "no answer within 0.3s" in gens[0].error
    assert len(server.aborts) == 1


def test_malformed_json_is_an_error_generation_not_retried(server, prompts):
    server.faults.malformed = 1
    gens = client(server.url).generate(prompts, GREEDY)
    assert {g.finish_reason for g in gens} == {"error"}
    assert "malformed JSON" in gens[0].error
    assert len(server.requests) == 1


def test_abort_finish_is_returned_with_partial_tokens(server, reference, prompts):
    server.faults.abort = 1
    gens = client(server.url).generate(prompts, GREEDY)
    full = reference.generate(prompts, GREEDY)
    for gen, ref in zip(gens, full, strict=True):
        assert gen.finish_reason == "abort" and gen.error
        assert gen.token_ids == ref.token_ids[: len(gen.token_ids)]
        assert len(gen.logprobs) == len(gen.token_ids)


def test_400_is_not_retried_and_carries_the_server_message(server, prompts):
    gens = client(server.url).generate(prompts, SamplingParams(max_new_tokens=5000))
    assert {g.finish_reason for g in gens} == {"error"}
    assert "HTTP 400" in gens[0].error and "maximum context length" in gens[0].error
    assert len(server.requests) == 1


def test_connection_errors_fail_over_to_the_next_url(server, reference, prompts):
    remote = client(dead_url(), server.url).generate([prompts[0]] * 2, GREEDY)
    assert_matches(remote, reference.generate([prompts[0]] * 2, GREEDY))
    gens = client(dead_url(), max_retries=1).generate(prompts, GREEDY)
    assert {g.finish_reason for g in gens} == {"error"}
    assert "connection failed" in gens[0].error


def test_two_servers_share_a_batch_keeping_groups_together(servers, server, reference, tokenizer):
    one, two = servers
    system = tokenizer.encode("You are an agent. Use the tools below when needed. " * 6)
    group_a = [system + tokenizer.encode("Book a flight")] * 3
    group_b = [system + tokenizer.encode("Cancel the hotel")] * 3
    sampler = client(one.url, two.url)
    gens = sampler.generate(group_a + group_b, GREEDY)
    # Each server ran one group as its batch: the reference runs the same batches (in bf16 a
    # prompt's K/V can differ in the last bits with what is prefilled in the same pass).
    local = [g for group in (group_a, group_b) for g in reference.generate(group, GREEDY)]
    assert_matches(gens, local)
    (body_one,), (body_two,) = one.requests, two.requests
    assert {tuple(map(tuple, body_one["input_ids"])), tuple(map(tuple, body_two["input_ids"]))} == {
        tuple(map(tuple, group_a)),
        tuple(map(tuple, group_b)),
    }
    # the next turn of an episode goes back to the server that holds its prefix in cache
    owner = one if body_one["input_ids"] == group_a else two
    follow_up = group_a[0] + list(gens[0].token_ids) + tokenizer.encode(" tool result")
    fresh = system + tokenizer.encode("Rent a car")  # shares only the system prompt: not sticky
    for _ in range(3):
        sampler.generate([follow_up, fresh], GREEDY)
    assert sum([follow_up] == b["input_ids"] for b in owner.requests) == 3
    other = two if owner is one else one
    assert sum(b["input_ids"] == [fresh] for b in other.requests) == 3


def test_update_weights_from_disk_changes_served_weights(tiny_path, tokenizer, prompts, tmp_path):
    from transformers import AutoModelForCausalLM

    changed = AutoModelForCausalLM.from_pretrained(tiny_path)
    with torch.no_grad():
        changed.get_input_embeddings().weight.mul_(-2.0)
    changed.save_pretrained(tmp_path / "step-1")
    expected = HFSampler(changed.eval(), tokenizer).generate(prompts, GREEDY)
    with running_server(tiny_path) as own:
        sampler = client(own.url)
        before = sampler.generate(prompts, GREEDY)
        sampler.update_weights_from_disk(tmp_path / "step-1", weight_version="step-1")
        after = sampler.generate(prompts, GREEDY)
        info = httpx.get(f"{own.url}/model_info").json()
        with pytest.raises(SamplerError, match=r"no config\.json"):
            sampler.update_weights_from_disk(tmp_path / "missing")
    assert [g.token_ids for g in before] != [g.token_ids for g in after]
    assert_matches(after, expected)
    assert info["weight_version"] == "step-1"


def test_health_reports_each_server(server):
    dead = dead_url()
    sampler = client(server.url, dead)
    assert sampler.health() == {server.url: True, dead: False}
    server.faults.unhealthy = True
    assert sampler.health()[server.url] is False
    with pytest.raises(SamplerError, match="not healthy after"):
        sampler.wait_until_healthy(timeout_s=0.1, poll_s=0.05)


def test_loopback_server_follows_the_stub_checklist(server, prompts):
    """Single request -> object; unknown sampling key / empty ids -> 400 with the error text."""
    one = httpx.post(
        f"{server.url}/generate",
        json={
            "input_ids": prompts[0],
            "sampling_params": {"max_new_tokens": 3},
            "return_logprob": True,
        },
    ).json()
    assert isinstance(one, dict) and one["meta_info"]["completion_tokens"] == len(one["output_ids"])
    assert [t[1] for t in one["meta_info"]["output_token_logprobs"]] == one["output_ids"]
    bad = httpx.post(
        f"{server.url}/generate",
        json={"input_ids": prompts[0], "sampling_params": {"max_tokens": 3}},
    )
    assert bad.status_code == 400 and bad.json()["error"].startswith("unknown field `max_tokens`")
    empty = httpx.post(f"{server.url}/generate", json={"input_ids": []})
    assert empty.status_code == 400 and "cannot be empty" in empty.json()["error"]["message"]


def test_router_policy_by_hand():
    assert prefix_hashes([1, 2]) == [2, 2 * 1_000_003 + 3]
    router = PrefixRouter(2)
    a, b, c = [1, 2, 3], [1, 2, 4, 5], [9]
    # groups by identical ids, largest (by tokens) first onto the least-loaded server:
    # a·2 = 6 tokens -> 0; b = 4 -> 1; c = 1 -> 1 (load 4 < 6)
    assert router.assign([a, b, a, c]) == [0, 1, 0, 1]
    router.remember([*a, 7], 1)
    # a continuation of a remembered sequence is sticky; the bare prompt a is not
    assert router.assign([[*a, 7, 8], a]) == [1, 0]
    assert PrefixRouter(1).assign([a, b, c]) == [0, 0, 0]


def drain(session) -> dict:
    got = {}
    while session.busy:
        got.update(session.step())
    return got


def test_a_session_answers_each_request_as_the_hf_sampler_does(server, reference, prompts):
    sampler = client(server.url)
    with sampler.session(GREEDY) as session:
        for i, prompt in enumerate(prompts):
            session.submit(i, prompt, 8, frozenset())
        session.submit("none", prompts[0], 0, frozenset())  # a zero cap: finished, no request
        got = drain(session)
    assert got["none"].token_ids == () and got["none"].finish_reason == "length"
    assert_matches([got[i] for i in range(len(prompts))], reference.generate(prompts, GREEDY))
    assert sorted(len(b["input_ids"]) for b in server.requests) == [1, 1, 1]  # one per request


def test_session_seeds_follow_the_request_not_the_finishing_order(server, prompts):
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=5)
    runs = []
    for order in (range(3), reversed(range(3))):
        with client(server.url).session(params) as session:
            for i in order:
                session.submit(("group", i), prompts[1], 6, frozenset())
            runs.append({k: g.token_ids for k, g in drain(session).items()})
    assert runs[0] == runs[1]
    assert len(set(runs[0].values())) == 3  # siblings get different seeds


def test_session_routes_groups_together_balances_load_and_follows_continuations(
    servers, server, tokenizer
):
    one, two = servers
    group_a = tokenizer.encode("You are an agent. Book a flight for me please.")
    group_b = tokenizer.encode("You are an agent. Cancel the hotel for me please.")
    sampler = client(one.url, two.url)
    with sampler.session(GREEDY) as session:
        for i in range(3):
            session.submit(("a", i), group_a, 8, frozenset())
            session.submit(("b", i), group_b, 8, frozenset())
        first = drain(session)
    served = {s.url: [b["input_ids"][0] for b in s.requests] for s in servers}
    assert sorted(map(len, served.values())) == [3, 3]  # one group per server
    assert all(len({tuple(p) for p in prompts}) == 1 for prompts in served.values())
    owner = one if served[one.url][0] == group_a else two
    follow_up = group_a + list(first[("a", 0)].token_ids) + tokenizer.encode(" ok")
    before = len(owner.requests)
    with sampler.session(GREEDY) as session:
        session.submit("next", follow_up, 4, frozenset())
        drain(session)
    assert len(owner.requests) == before + 1  # the next turn went where its prefix is cached
