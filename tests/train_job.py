"""A training job for tests: the real trainer on the tiny model, with a reward that varies.

The tiny random model never writes a parseable tool call, so every task reward is 0 and every
advantage is 0: nothing would be trained and a resume or distributed test could not fail. This
job keeps the real trainer, sampler, rollout, loss and checkpoints, and scores episodes with a
deterministic function of the sampled tokens instead (the Python API takes any ``RewardFn``):
the share of even token ids among the agent's sampled tokens. It differs between the episodes
of a group, so advantages and gradients are non-zero.

Usage: ``python tests/train_job.py RUN_DIR [--resume] [key=value ...]`` (config:
configs/tiny-test.toml plus overrides). Writes ``<RUN_DIR>/params.sha256`` (rank 0, or every
rank as ``params.rank<R>.sha256`` when distributed) when it finishes, and the digest of
the starting weights as ``params.initial.sha256``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from envace_engine.config import TrainConfig, load  # noqa: E402
from envace_engine.sink import JsonlSink  # noqa: E402
from envace_engine.types import Episode, Role, Task  # noqa: E402


def even_token_share(task: Task, episode: Episode) -> float:
    """Share of even ids among the agent's sampled tokens (0 when it sampled none)."""
    ids = [t for s in episode.segments if s.role is Role.ACT for t in s.token_ids]
    return sum(t % 2 == 0 for t in ids) / len(ids) if ids else 0.0


def member_spread(task: Task, episode: Episode) -> float:
    """``even_token_share`` plus a step by the episode's place in its group (its id ends in
    ``-<member>``): every group's rewards differ whatever the model sampled, so a step always
    has rows with non-zero advantages on every machine's numerics."""
    member = int(episode.id.rsplit("-", 1)[1])
    return even_token_share(task, episode) + 0.01 * member


def params_digest(model: object) -> str:
    """SHA-256 over every parameter's bytes, in name order."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):  # type: ignore[attr-defined]
        h.update(name.encode())
        h.update(p.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def main(argv: list[str]) -> None:
    """Run the job (see the module docstring)."""
    from envace_engine.training import trainer

    run_dir = Path(argv[0])
    resume = "--resume" in argv
    overrides = [a for a in argv[1:] if a != "--resume"]
    config = load(TrainConfig, ROOT / "configs" / "tiny-test.toml", overrides)
    parts = trainer.setup(config)
    parts = dataclasses.replace(parts, reward=even_token_share, reward_is_success=False)
    run_dir.mkdir(parents=True, exist_ok=True)
    if not resume and parts.dist.is_main:
        (run_dir / "params.initial.sha256").write_text(params_digest(parts.model))
    trainer.run(parts, run_dir, JsonlSink(run_dir), resume=resume)
    name = "params.sha256"
    if parts.dist.enabled:
        name = f"params.rank{parts.dist.rank}.sha256"
    (run_dir / name).write_text(params_digest(parts.model))


if __name__ == "__main__":
    main(sys.argv[1:])
