"""Staging a run for the Hugging Face Hub: a checkpoint with a model card, episodes as a dataset.

``stage_model`` copies the run's checkpoint (the SFT ``model/`` folder, else the newest
``checkpoints/step-*``) without the trainer's resume state, and writes a model card: YAML
metadata (library, base model, tags, dataset), the run's config and its last metrics.
``stage_dataset`` turns the run's episodes into rows with a ``messages`` column (the agent's
chat, as TRL's SFT and chat templates read it: ``{"role", "content"}`` dicts) beside the
episode's task, reward, stop reason and mode, written as one Parquet file under ``data/`` with a
dataset card. Messages are recovered from the stored token ids: each episode's agent context
is decoded and split at the chat template's ChatML markers (``<|im_start|>role ... <|im_end|>``);
a tokenizer whose template is not ChatML is refused with that reason. Nothing here uses the
network; ``envace push`` uploads the staged folders.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from envace_engine import adapters
from envace_engine.training.checkpoint import latest

# the trainer's resume state: optimizer moments, RNG, our step counter — not a model's files
RESUME_FILES = frozenset({"trainer_state.pt", "state.json"})
CHATML = re.compile(r"<\|im_start\|>(\w+)\n(.*?)(?:<\|im_end\|>|\Z)", re.DOTALL)
CARD_METRICS = ("success/real", "reward/mean", "fidelity/score", "eval/success", "loss")


class StageError(ValueError):
    """The run cannot be staged as asked; the message says why and what to do."""


def find_checkpoint(run_dir: Path) -> Path:
    """The run's model: ``model/`` (an SFT run) or its newest complete training checkpoint;
    either may be a LoRA adapter, which is pushed as an adapter repo (peft loads it back)."""
    model = run_dir / "model"
    if (model / "config.json").is_file() or adapters.is_adapter_dir(model):
        return model
    found = latest(run_dir)
    if found is None:
        raise StageError(
            f"{run_dir.name} has no checkpoint (no model/ folder, no checkpoints/step-*): only "
            "sft and train runs can be pushed as a model; push its episodes with --dataset"
        )
    return found


def stage_model(run_dir: Path, dest: Path, dataset_repo: str | None = None) -> Path:
    """Copy the run's checkpoint into ``dest`` and write its model card; returns ``dest``."""
    checkpoint = find_checkpoint(run_dir)
    dest.mkdir(parents=True, exist_ok=True)
    for item in checkpoint.iterdir():
        if item.is_file() and item.name not in RESUME_FILES:
            shutil.copy2(item, dest / item.name)
    manifest = _manifest(run_dir)
    metrics = last_metrics(run_dir)
    card = model_card(manifest, metrics, dataset_repo, adapters.is_adapter_dir(checkpoint))
    (dest / "README.md").write_text(card, encoding="utf-8")
    return dest


def _manifest(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "run.json").read_text(encoding="utf-8"))


def last_metrics(run_dir: Path) -> dict[str, float]:
    """The run's metrics at its last step (empty when it logged none)."""
    import pyarrow.parquet as pq

    files = sorted((run_dir / "metrics").glob("*.parquet"))
    if not files:
        return {}
    table = pq.read_table(files[-1]).to_pylist()
    return {row["name"]: row["value"] for row in table}


def model_card(
    manifest: dict[str, Any], metrics: dict[str, float], dataset: str | None, adapter: bool = False
) -> str:
    """A model card: Hub metadata, what the run was, its config and headline metrics;
    ``adapter``: the repo holds a LoRA adapter (peft loads it onto its base)."""
    config = manifest.get("config", {})
    base = config.get("model") or manifest.get("model", "")
    library = "peft" if adapter else "transformers"
    meta = [f"library_name: {library}", "tags:", "- envace", "- world-rehearsal", "- trl"]
    if adapter:
        meta.append("- lora")
    if base and "/" in base and not Path(base).exists():  # a Hub id, not a local folder
        meta.append(f"base_model: {base}")
    if dataset:
        meta += ["datasets:", f"- {dataset}"]
    shown = [(k, metrics[k]) for k in CARD_METRICS if k in metrics]
    table = "\n".join(f"| `{k}` | {v:.4f} |" for k, v in shown) or "| — | — |"
    return "\n".join(
        [
            "---",
            *meta,
            "---",
            "",
            f"# {manifest.get('run_id', 'EnvACE run')}",
            "",
            f"A `{manifest.get('kind', '?')}` run of EnvACE Studio on suite "
            f"`{manifest.get('suite', '?')}`, from `{base}`. World-rehearsal training: the "
            "policy acts (writes tool calls) and rehearses (writes the tools' responses), "
            "trained end to end by role-wise GRPO.",
            "",
            *(_adapter_usage(base) if adapter else []),
            "## Last metrics",
            "",
            "| metric | value |",
            "|---|---|",
            table,
            "",
            "## Config",
            "",
            "```json",
            json.dumps(config, indent=1, sort_keys=True),
            "```",
            "",
        ]
    )


def _adapter_usage(base: str) -> list[str]:
    return [
        "## Load it",
        "",
        f"A LoRA adapter on `{base}`: `PeftModel.from_pretrained(base_model, REPO)` with peft, "
        f'or `model = "{base}+DIR"` in EnvACE Studio with the repo downloaded to `DIR`.',
        "",
    ]


def chat_messages(text: str) -> list[dict[str, str]]:
    """The ``{"role", "content"}`` messages of one decoded ChatML context (module doc)."""
    messages = [{"role": r, "content": c.strip("\n")} for r, c in CHATML.findall(text)]
    if not messages:
        raise StageError(
            "the episode text has no ChatML markers (<|im_start|>role ... <|im_end|>): messages "
            "can only be recovered for chat templates in ChatML (SmolLM2, Qwen)"
        )
    if messages[-1]["role"] == "assistant" and not messages[-1]["content"]:
        messages.pop()  # the generation prompt of an episode that ended before replying
    return messages


def episode_rows(run_dir: Path, tokenizer: Any) -> list[dict[str, Any]]:
    """One row per stored episode: its messages and what it was (task, reward, stop, mode)."""
    import pyarrow.parquet as pq

    from storage.export import export_run

    with tempfile.TemporaryDirectory() as tmp:
        export_run(run_dir, Path(tmp))
        if not (Path(tmp) / "episodes.parquet").is_file():
            raise StageError(f"{run_dir.name} stored no episodes: there is no dataset to push")
        episodes = pq.read_table(Path(tmp) / "episodes.parquet").to_pylist()
        segments = pq.read_table(Path(tmp) / "segments.parquet").to_pylist()
    ids: dict[str, list[int]] = {}
    for seg in segments:  # sorted by step, episode and seq by the export
        ids.setdefault(seg["episode_id"], []).extend(seg["token_ids"])
    rows = []
    for ep in episodes:
        text = tokenizer.decode(ids.get(ep["episode_id"], []), skip_special_tokens=False)
        rows.append(
            {
                "messages": chat_messages(text),
                "episode_id": ep["episode_id"],
                "task_id": ep["task_id"],
                "suite": ep["suite"],
                "mode": ep["mode"],
                "step": ep["step"],
                "reward": ep["reward"],
                "stop_reason": ep["stop_reason"],
            }
        )
    return rows


def stage_dataset(run_dir: Path, dest: Path, tokenizer: Any, model_repo: str | None) -> Path:
    """Write the run's episodes as ``data/train-00000-of-00001.parquet`` and a dataset card."""
    import datasets

    rows = episode_rows(run_dir, tokenizer)
    (dest / "data").mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_list(rows).to_parquet(dest / "data" / "train-00000-of-00001.parquet")
    manifest = _manifest(run_dir)
    (dest / "README.md").write_text(dataset_card(manifest, len(rows), model_repo), "utf-8")
    return dest


def dataset_card(manifest: dict[str, Any], n_rows: int, model_repo: str | None) -> str:
    """A dataset card: Hub metadata (one default config over ``data/``) and the columns."""
    behind = f", the run behind [{model_repo}](https://huggingface.co/{model_repo})"
    lines = [
        "---",
        "configs:",
        "- config_name: default",
        "  data_files:",
        "  - split: train",
        "    path: data/train-*.parquet",
        "tags:",
        "- envace",
        "- tool-use",
        "- trajectories",
        "---",
        "",
        f"# Episodes of {manifest.get('run_id', 'an EnvACE run')}",
        "",
        f"{n_rows} episodes of a `{manifest.get('kind', '?')}` run on suite "
        f"`{manifest.get('suite', '?')}`" + (behind if model_repo else "") + ".",
        "",
        "Columns: `messages` (the agent's chat: system, user, assistant and tool messages, as "
        "chat templates and TRL's `SFTTrainer` read them; in rehearsal-mode runs a tool message "
        "may hold the policy's own rehearsed response), `episode_id`, `task_id`, `suite`, "
        "`mode`, `step`, `reward`, `stop_reason`.",
        "",
    ]
    return "\n".join(lines)
