"""FSDP2 training: 2 CPU processes (gloo) match a 2-rank DDP run, pad uneven micro-batch counts,
and write checkpoints that resume with either strategy.

Run as a script under ``torchrun`` this file is also the job the tests launch:

* ``python tests/test_fsdp.py train RUN_DIR [--resume] [key=value ...]``: the real trainer
  (configs/tiny-test.toml plus overrides, reward as in tests/train_job.py); every rank saves its
  full parameters as ``params.rank<R>.pt`` (and, under FSDP, the gathered shards as
  ``shards.rank<R>.pt``);
* ``python tests/test_fsdp.py step RUN_DIR [key=value ...]``: two ``trainer.optimize`` calls
  on hand-made rows with a different number of micro-batches per rank (one rank has none at
  all in the first step), then the same dumps.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))

from envace_engine.config import ConfigError, TrainConfig, build, load  # noqa: E402
from envace_engine.training.parallel import fsdp  # noqa: E402
from envace_engine.training.parallel.distributed import Dist  # noqa: E402

THIS = Path(__file__).resolve()
# share_prefix off: FSDP runs whole rows, so DDP must too for the two to agree to 1e-6
BASE = [
    "steps=2",
    "tasks_per_step=1",
    "checkpoint_every=1",
    "loss.kl_coef=0.01",
    "share_prefix=false",
]
ATOL = 1e-6


# ---------------------------------------------------------------- fast checks (no processes)


def test_strategy_key_defaults_to_ddp_and_rejects_unknown_values() -> None:
    assert build(TrainConfig, {}).distributed.strategy == "ddp"
    assert build(TrainConfig, {}, ["distributed.strategy=fsdp"]).distributed.strategy == "fsdp"
    with pytest.raises(ConfigError, match=r"distributed\.strategy: .*'ddp' or 'fsdp'.*zero3"):
        build(TrainConfig, {}, ["distributed.strategy=zero3"])
    with pytest.raises(ConfigError, match=r"unknown key 'distributed\.stratgy'.*strategy"):
        build(TrainConfig, {}, ["distributed.stratgy=fsdp"])


def test_sharding_needs_decoder_layers_and_a_process_group(tiny_model) -> None:
    import torch

    with pytest.raises(ValueError, match=r"no decoder layers.*strategy = 'ddp'"):
        fsdp.decoder_layers(torch.nn.Linear(2, 2))
    assert len(fsdp.decoder_layers(tiny_model)) == tiny_model.config.num_hidden_layers
    with pytest.raises(ValueError, match=r"process group.*torchrun"):
        fsdp.shard(tiny_model, Dist())


def test_score_of_a_plain_model_is_completion_logprobs(tiny_model) -> None:
    import torch

    from envace_engine.logprobs import completion_logprobs

    ids = torch.tensor([[5, 6, 7, 8]])
    mask, completion = torch.ones_like(ids), torch.tensor([[0.0, 0.0, 1.0, 1.0]])
    want = completion_logprobs(tiny_model, ids, mask, completion, temperature=0.7)
    plain = fsdp.score(tiny_model, ids, mask, completion, 0.7)
    wrapped = fsdp.score(fsdp.LogprobModule(tiny_model), ids, mask, completion, 0.7)
    assert torch.equal(plain, want) and torch.equal(wrapped, want)


# ---------------------------------------------------------------- 2-rank runs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch(mode: str, run_dir: Path, *args: str) -> None:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
        "--master_addr=127.0.0.1", f"--master_port={_free_port()}",
        str(THIS), mode, str(run_dir), *args,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    subprocess.run(cmd, env=env, check=True, timeout=600)  # a hang = mismatched collectives


def _load(path: Path) -> dict:
    import torch

    return torch.load(path, weights_only=True)


def _assert_close(got: dict, want: dict, what: str) -> None:
    import torch

    assert got.keys() == want.keys(), what
    for name in want:
        diff = float((got[name].float() - want[name].float()).abs().max())
        assert torch.allclose(got[name], want[name], atol=ATOL, rtol=0), f"{what}: {name} {diff}"


def _ranks_agree(run_dir: Path, sharded: bool) -> dict:
    """Both ranks' full parameters (bit-identical) and, under FSDP, equal to the shards."""
    import torch

    rank0, rank1 = _load(run_dir / "params.rank0.pt"), _load(run_dir / "params.rank1.pt")
    for name in rank0:
        assert torch.equal(rank0[name], rank1[name]), f"ranks diverged at {name}"
    if sharded:  # the full copy the sampler reads is exactly what the shards hold
        for rank in (0, 1):
            shards = _load(run_dir / f"shards.rank{rank}.pt")
            for name, value in shards.items():
                assert torch.equal(value, rank0[name]), f"full copy != shards at {name}"
    return rank0


def _changed(params: dict, initial: dict) -> bool:
    import torch

    return any(not torch.equal(params[k], initial[k]) for k in initial)


def _losses(run_dir: Path) -> list[float]:
    import json

    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [float(json.loads(line)["loss"]) for line in lines]


def _resume_from_step_1(source: Path, target: Path, strategy: str) -> dict:
    """Continue ``source``'s step-1 checkpoint with ``strategy`` to step 2; the final params."""
    name = "checkpoints/step-000001"
    shutil.copytree(source / name, target / name)
    _launch("train", target, "--resume", *BASE, f"distributed.strategy={strategy}")
    return _ranks_agree(target, sharded=strategy == "fsdp")


@pytest.mark.slow
def test_fsdp_trains_like_ddp_and_checkpoints_resume_with_either(tmp_path: Path) -> None:
    import torch

    ddp_dir, fsdp_dir = tmp_path / "ddp", tmp_path / "fsdp"
    _launch("train", ddp_dir, *BASE, "distributed.strategy=ddp")
    _launch("train", fsdp_dir, *BASE, "distributed.strategy=fsdp")

    ddp = _ranks_agree(ddp_dir, sharded=False)
    sharded = _ranks_agree(fsdp_dir, sharded=True)
    assert _changed(sharded, _load(fsdp_dir / "params.initial.pt")), "nothing was trained"
    losses = _losses(fsdp_dir)
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    _assert_close(sharded, ddp, "fsdp vs ddp final parameters")

    # Same checkpoint format: full weights and a plain optimizer state_dict, equal values.
    ckpt = "checkpoints/step-000002"
    from safetensors.torch import load_file

    _assert_close(
        load_file(str(fsdp_dir / ckpt / "model.safetensors")),
        load_file(str(ddp_dir / ckpt / "model.safetensors")),
        "checkpoint weights",
    )
    opt_f = torch.load(fsdp_dir / ckpt / "trainer_state.pt", weights_only=False)["optimizer"]
    opt_d = torch.load(ddp_dir / ckpt / "trainer_state.pt", weights_only=False)["optimizer"]
    assert opt_f["param_groups"] == opt_d["param_groups"]
    assert opt_f["state"].keys() == opt_d["state"].keys()
    for pid, entry in opt_d["state"].items():
        _assert_close(opt_f["state"][pid], entry, f"optimizer state of parameter {pid}")

    # Resume across strategies: a DDP checkpoint into shards, an FSDP one into plain DDP.
    _assert_close(_resume_from_step_1(ddp_dir, tmp_path / "d2f", "fsdp"), ddp, "ddp -> fsdp")
    _assert_close(_resume_from_step_1(fsdp_dir, tmp_path / "f2d", "ddp"), sharded, "fsdp -> ddp")


@pytest.mark.slow
def test_uneven_micro_batch_counts_are_padded_with_zero_weight(tmp_path: Path) -> None:
    # kl_coef > 0: the padding also runs the sharded reference model's collectives.
    args = ["micro_batch_tokens=1", "loss.kl_coef=0.01"]
    _launch("step", tmp_path / "ddp", *args, "distributed.strategy=ddp")
    _launch("step", tmp_path / "fsdp", *args, "distributed.strategy=fsdp")
    ddp = _ranks_agree(tmp_path / "ddp", sharded=False)
    sharded = _ranks_agree(tmp_path / "fsdp", sharded=True)
    assert _changed(sharded, _load(tmp_path / "fsdp" / "params.initial.pt"))
    _assert_close(sharded, ddp, "fsdp vs ddp after uneven micro-batches")
    padded = [(tmp_path / "fsdp" / f"padding.rank{r}.txt").read_text() for r in (0, 1)]
    assert padded == ["0 1", "3 0"], "ranks did not pad to the larger micro-batch count"


# ---------------------------------------------------------------- the job (under torchrun)


def _uneven_rows(rank: int, step: int) -> tuple[list, list[float]]:
    """Step 0: rank 0 has 3 rows, rank 1 none; step 1: rank 0 one, rank 1 two."""
    from envace_engine.types import Role, TrainRow

    count = [[3, 0], [1, 2]][step][rank]
    rows, advantages = [], []
    for i in range(count):
        prompt = tuple(100 + 7 * i + rank + step + k for k in range(5))
        completion = tuple(200 + 11 * i + 3 * rank + k for k in range(3 + i))
        rows.append(
            TrainRow(
                f"e{rank}{i}", "g", Role.ACT, prompt, completion, (-1.5,) * len(completion), 1.0
            )
        )
        advantages.append(0.5 if i % 2 == 0 else -0.75)
    return rows, advantages


def _dump(parts: object, run_dir: Path, rank: int) -> None:
    import torch

    full = {k: v.detach().cpu().clone() for k, v in parts.model.state_dict().items()}  # type: ignore[attr-defined]
    torch.save(full, run_dir / f"params.rank{rank}.pt")
    sharded = parts.sharded  # type: ignore[attr-defined]
    if sharded is not None:  # all-gather every shard (a collective: every rank dumps)
        gathered = {n: p.full_tensor().detach().cpu() for n, p in sharded.lm.named_parameters()}
        torch.save(gathered, run_dir / f"shards.rank{rank}.pt")


def _job(argv: list[str]) -> None:
    import torch

    from envace_engine.sink import JsonlSink
    from envace_engine.training import optimize, trainer
    from envace_engine.training.parallel import distributed
    from tests.train_job import even_token_share

    mode, run_dir = argv[0], Path(argv[1])
    resume = "--resume" in argv
    overrides = [a for a in argv[2:] if a != "--resume"]
    config = load(TrainConfig, ROOT / "configs" / "tiny-test.toml", overrides)
    parts = trainer.setup(config)
    parts = dataclasses.replace(parts, reward=even_token_share, reward_is_success=False)
    rank = parts.dist.rank
    run_dir.mkdir(parents=True, exist_ok=True)
    if not resume and parts.dist.is_main:
        initial = {k: v.detach().cpu().clone() for k, v in parts.model.state_dict().items()}
        torch.save(initial, run_dir / "params.initial.pt")
    if mode == "train":
        trainer.run(parts, run_dir, JsonlSink(run_dir), resume=resume)
    else:
        padded = []
        for step in range(2):
            out = optimize.optimize(parts, *_uneven_rows(rank, step))
            padded.append(str(int(out["optim/padding_micro_batches"])))
        (run_dir / f"padding.rank{rank}.txt").write_text(" ".join(padded))
    _dump(parts, run_dir, rank)
    distributed.shutdown(parts.dist)


if __name__ == "__main__":
    _job(sys.argv[1:])
