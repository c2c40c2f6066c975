"""The trainer rolling out on SGLang servers: each step's weights pushed and served, end to end.

Two loopback SGLang-protocol servers (``tests/sglang_server.py``, in this process) start on the
tiny model, the trainer's starting point. The trainer runs ``envace`` mode with
``sampler = "sglang+http://A,B?tokenizer=tiny"``: rollouts go over HTTP, and after every
optimizer step ``sync_weights`` saves the weights and calls ``/update_weights_from_disk`` on
both servers. Because the servers live in this process, the tests compare the served tensors
with the trainer's directly, and read which weight version answered every ``/generate``.

Timeline of loop iteration ``s`` (0-based), which the ``WatchingSink`` below observes:

    rollout on the servers (they must serve the weights after s steps, version "s")
    optimizer step (trainer now holds the weights after s + 1 steps)
    sink.episodes(s, ...)          <- the sink looks here: servers still one step behind
    checkpoint, then push version "s + 1" to every server
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from envace_engine.config import ConfigError, TrainConfig, load
from envace_engine.models import load_model, resolve
from envace_engine.samplers.sglang import SamplerError
from envace_engine.sink import JsonlSink
from envace_engine.training import checkpoint, trainer
from envace_engine.training.parallel import weight_sync
from envace_engine.types import Episode
from tests.sglang_server import Faults, LoopbackSGLang, running_server
from tests.train_job import even_token_share

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
Params = dict[str, torch.Tensor]


@pytest.fixture()
def servers(tiny_path) -> Iterator[tuple[LoopbackSGLang, LoopbackSGLang]]:
    """Two fresh loopback servers on the tiny model (each test changes their weights)."""
    with running_server(tiny_path) as one, running_server(tiny_path) as two:
        yield one, two


def sglang_spec(servers: Sequence[LoopbackSGLang]) -> str:
    hosts = ",".join(s.url.removeprefix("http://") for s in servers)
    return f"sglang+http://{hosts}?tokenizer=tiny"


def sglang_parts(servers: Sequence[LoopbackSGLang], *overrides: str) -> trainer.Parts:
    """configs/tiny-test.toml rolled out on ``servers``, scored by a reward that varies.

    The tiny random model never calls a tool, so the task reward is always 0; the share of even
    sampled token ids differs between a group's episodes, so every step has a real gradient.
    """
    sets = [f'sampler="{sglang_spec(servers)}"', *overrides]
    config = load(TrainConfig, CONFIGS / "tiny-test.toml", sets)
    parts = trainer.setup(config)
    return dataclasses.replace(parts, reward=even_token_share, reward_is_success=False)


def snapshot(model: Any) -> Params:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def serves(server: LoopbackSGLang, expected: Params) -> bool:
    """Whether the server's model holds exactly ``expected`` (same names, bit-equal tensors)."""
    served = server.sampler.model.state_dict()
    return served.keys() == expected.keys() and all(
        torch.equal(served[k], v) for k, v in expected.items()
    )


def reported_version(server: LoopbackSGLang) -> str:
    return httpx.get(f"{server.url}/model_info").json()["weight_version"]


def pushed(run_dir: Path) -> list[str]:
    """Everything under ``<run>/weights``, temporaries included."""
    root = run_dir / weight_sync.WEIGHTS
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


@dataclasses.dataclass(frozen=True)
class StepView:
    """One step as seen from its sink call, per server (in server order)."""

    step: int
    rollout_versions: tuple[tuple[str, ...], ...]  # versions that answered this step's /generate
    reported: tuple[str, ...]  # each server's weight_version at the sink call
    serves_step_start: tuple[bool, ...]  # served tensors == trainer's before this step's update
    weights: tuple[str, ...]  # the run's weights/ folder at the sink call


class WatchingSink(JsonlSink):
    """A ``JsonlSink`` that also records, at each step, what the servers serve and answered.

    ``fail_at`` injects a weight-push failure: at that step's sink call the last server is told
    to answer the coming ``/update_weights_from_disk`` as if the path did not exist there.
    """

    def __init__(
        self,
        run_dir: Path,
        parts: trainer.Parts,
        servers: Sequence[LoopbackSGLang],
        fail_at: int | None = None,
    ) -> None:
        super().__init__(run_dir)
        self.run_dir, self.parts, self.servers, self.fail_at = run_dir, parts, servers, fail_at
        self.step_start = snapshot(parts.model)
        self.answered = [0] * len(servers)
        self.views: list[StepView] = []

    def episodes(self, step: int, episodes: Sequence[Episode]) -> None:
        """Store the episodes, then record the servers' state (see the module docstring)."""
        super().episodes(step, episodes)
        versions = []
        for i, server in enumerate(self.servers):
            versions.append(tuple(server.weight_versions[self.answered[i] :]))
            self.answered[i] = len(server.weight_versions)
        self.views.append(
            StepView(
                step,
                tuple(versions),
                tuple(reported_version(s) for s in self.servers),
                tuple(serves(s, self.step_start) for s in self.servers),
                tuple(pushed(self.run_dir)),
            )
        )
        self.step_start = snapshot(self.parts.model)  # this step's update, pushed next
        if step == self.fail_at:
            self.servers[-1].faults.hide_weights = 1


@pytest.mark.slow
def test_each_step_is_served_to_every_server_and_rolled_out_on_it(servers, tmp_path) -> None:
    parts = sglang_parts(servers, "steps=3")
    initial = snapshot(parts.model)
    assert all(serves(s, initial) for s in servers)  # same starting point as the trainer
    stale = tmp_path / weight_sync.WEIGHTS / ".step-000009.tmp4242"  # left by a killed run
    stale.mkdir(parents=True)
    sink = WatchingSink(tmp_path, parts, servers)

    assert trainer.run(parts, tmp_path, sink) == 3

    served_before = ["0", "1", "2"]  # step s samples the weights after s steps (0: pushed first)
    for view, version in zip(sink.views, served_before, strict=True):
        assert view.reported == (version, version), view
        assert view.serves_step_start == (True, True), view
        answered = [v for per_server in view.rollout_versions for v in per_server]
        assert answered and set(answered) == {version}, view
    assert [v.weights for v in sink.views[1:]] == [("step-000001",), ("step-000002",)]
    final = snapshot(parts.model)
    assert final.keys() == initial.keys()
    assert any(not torch.equal(final[k], initial[k]) for k in final), "training changed nothing"
    for server in servers:
        assert serves(server, final) and reported_version(server) == "3"
    assert pushed(tmp_path) == ["step-000003"]  # older copies and the stale temporary are gone


@pytest.mark.slow
def test_a_failed_push_stops_training_and_keeps_the_last_good_state(servers, tmp_path) -> None:
    one, two = servers
    parts = sglang_parts(servers, "steps=3")
    sink = WatchingSink(tmp_path, parts, servers, fail_at=1)

    failed = tmp_path / weight_sync.WEIGHTS / "step-000002"
    with pytest.raises(weight_sync.WeightSyncError) as caught:
        trainer.run(parts, tmp_path, sink)
    message = str(caught.value)
    assert f"{two.url}: update_weights_from_disk({failed}) failed" in message
    assert "no config.json" in message and "step 2:" in message and "resume" in message

    assert [v.step for v in sink.views] == [0, 1]  # step 2 never started
    newest = checkpoint.latest(tmp_path)
    assert newest == checkpoint.checkpoint_dir(tmp_path, 2)
    assert checkpoint.read_state(newest).step == 2
    saved = snapshot(load_model(resolve(str(newest))))
    assert saved.keys() == snapshot(parts.model).keys()
    assert all(torch.equal(saved[k], v) for k, v in snapshot(parts.model).items())
    # the failing server still serves step 1, from the copy that is kept on disk
    assert reported_version(two) == "1" and reported_version(one) == "2"
    kept = snapshot(load_model(resolve(str(tmp_path / "weights/step-000001"))))
    assert serves(two, kept) and serves(one, saved)
    assert pushed(tmp_path) == ["step-000001", "step-000002"]  # the failed one, for diagnosis


def test_sync_weights_reaches_every_server_and_keeps_one_copy(servers, tmp_path) -> None:
    one, two = servers
    parts = sglang_parts(servers)
    with torch.no_grad():
        parts.model.get_input_embeddings().weight.mul_(-2.0)
    changed = snapshot(parts.model)

    weight_sync.sync_weights(parts.weight_source(), tmp_path, 5)
    assert [reported_version(s) for s in servers] == ["5", "5"]
    assert serves(one, changed) and serves(two, changed)
    assert pushed(tmp_path) == ["step-000005"]
    weight_sync.sync_weights(parts.weight_source(), tmp_path, 6)
    assert pushed(tmp_path) == ["step-000006"]

    one.faults.hide_weights = 1
    with pytest.raises(weight_sync.WeightSyncError, match=rf"{one.url}: .*step-000007\) failed"):
        weight_sync.sync_weights(parts.weight_source(), tmp_path, 7)
    assert pushed(tmp_path) == ["step-000006", "step-000007"]
    assert reported_version(one) == "6"


def test_in_process_sampler_needs_no_push(tmp_path) -> None:
    parts = trainer.setup(load(TrainConfig, CONFIGS / "tiny-test.toml"))
    weight_sync.sync_weights(parts.weight_source(), tmp_path, 1)
    assert pushed(tmp_path) == []


def test_setup_refuses_servers_that_do_not_answer(servers) -> None:
    _, two = servers
    two.faults = Faults(unhealthy=True)  # SGLang answers 503 on /health while it loads
    with pytest.raises(SamplerError, match=rf"no healthy SGLang server at {two.url} "):
        sglang_parts(servers)


@pytest.mark.parametrize(
    ("sampler", "error"),
    [
        ("tiny", "set sampler = 'sglang+http://HOST:PORT"),
        ("sglang+http://127.0.0.1", "needs a port"),
        ("sglang+ftp://127.0.0.1:30000", "expected sglang+http://HOST:PORT"),
    ],
)
def test_sampler_key_must_name_sglang_servers(sampler: str, error: str) -> None:
    with pytest.raises(ConfigError, match=r"sampler") as caught:
        load(TrainConfig, None, [f'sampler="{sampler}"'])
    assert error in str(caught.value)


def test_example_sglang_config_loads() -> None:
    config = load(TrainConfig, CONFIGS / "toy-envace-sglang.toml")
    assert config.sampler is not None and config.sampler.startswith("sglang+http://")
    assert not config.model.startswith("sglang+")
