"""SFT warm-up on reference trajectories of both roles, with TRL's ``SFTTrainer``.

Examples (one per generation the policy will make at run time, "step-as-sample"):

* ``act`` — prompt: the act chat up to an assistant message of the reference trajectory;
  completion: that message (a ``<tool_call>`` block, or the final answer);
* ``rehearse`` — prompt: the rehearse chat for one reference call; completion:
  ``<execution_result>{reference result}</execution_result>``.

Both are rendered with the *same* prompt functions and switches the rollout uses
(``prompts.act_samples``/``rehearse_samples`` with ``pick_examples`` from the same pool,
``grounded_rehearsal``, ``rehearse_history``, ``n_examples``): if SFT saw other prompts than the
rollout, it would teach a format the policy never meets. The data is TRL's conversational
prompt-completion form, so the loss is on completion (assistant) tokens only
(``completion_only_loss`` is True for such data, docs/protocols.md §2.2), including ``<|im_end|>``,
which teaches the model to stop. bf16 autocast on CPU. The result is a Hugging Face checkpoint
directory that ``envace train`` takes as ``model``.
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from envace_engine.config import SFTConfig
from envace_engine.environments import get_suite
from envace_engine.environments.base import Suite
from envace_engine.rollout.prompts import (
    ChatSample,
    Message,
    RehearseContext,
    act_samples,
    pick_examples,
    rehearse_samples,
    to_chat,
)
from envace_engine.seeds import derive_seed
from envace_engine.sink import Sink
from envace_engine.types import Task


def sft_tasks(suite: Suite, config: SFTConfig) -> list[Task]:
    """The first ``n_tasks`` tasks (in a seeded order) matching ``task_filter``, with references."""
    tasks = [
        t
        for t in suite.tasks(config.split)
        if any(t.reference_calls)
        and all(str(t.meta.get(k)) == v for k, v in config.task_filter.items())
    ]
    if not tasks:
        raise ValueError(
            f"no {config.suite}/{config.split} task with reference calls matches task_filter="
            f"{config.task_filter}: loosen the filter or choose another split"
        )
    random.Random(config.seed).shuffle(tasks)
    return tasks[: config.n_tasks]


def task_samples(task: Task, pool: Sequence[Task], config: SFTConfig) -> list[ChatSample]:
    """The SFT samples of one task for the configured roles, rendered as the rollout renders."""
    r = config.rollout
    examples = pick_examples(task, pool, r.n_examples)
    tools = tuple(task.tools)
    samples: list[ChatSample] = []
    if "act" in config.roles:
        samples += act_samples(task, tools, examples)
    if "rehearse" in config.roles:
        ctx = RehearseContext(
            tools=tools,
            task=task,
            grounded=r.grounded_rehearsal,
            with_history=r.rehearse_history,
            examples=examples,
        )
        samples += rehearse_samples(ctx)
    return samples


def to_record(sample: ChatSample) -> dict[str, Any]:
    """One TRL conversational prompt-completion row (``role`` kept for counting)."""
    return {
        "prompt": to_chat(sample.prompt),
        "completion": to_chat([Message("assistant", sample.target)]),
        "role": sample.role,
    }


def build_records(config: SFTConfig, suite: Suite | None = None) -> list[dict[str, Any]]:
    """All SFT rows for ``config``, shuffled with its seed."""
    suite = suite or get_suite(config.suite)
    # The rollout draws worked examples from the train split (rollout._default_pool).
    pool = suite.tasks("train") if config.rollout.n_examples > 0 else []
    records = [
        to_record(s) for t in sft_tasks(suite, config) for s in task_samples(t, pool, config)
    ]
    random.Random(derive_seed(config.seed, "sft-records")).shuffle(records)
    return records


def run_sft(config: SFTConfig, out_dir: Path, sink: Sink | None = None) -> Path:
    """Train with TRL's SFTTrainer and save a checkpoint dir at ``out_dir`` (atomically)."""
    import torch
    from datasets import Dataset
    from trl import SFTConfig as TRLConfig
    from trl import SFTTrainer

    from envace_engine.models import load_model, load_tokenizer, resolve

    torch.manual_seed(config.seed)
    spec = resolve(config.model)
    model, tokenizer = load_model(spec), load_tokenizer(spec)
    records = build_records(config)
    dataset = Dataset.from_list([{k: r[k] for k in ("prompt", "completion")} for r in records])
    out = Path(out_dir)
    work = out.with_name(f".{out.name}.work{os.getpid()}")
    args = TRLConfig(
        output_dir=str(work),
        max_steps=config.max_steps,
        per_device_train_batch_size=config.batch_size,
        learning_rate=config.lr,
        lr_scheduler_type="constant",
        bf16=config.bf16,
        use_cpu=not torch.cuda.is_available(),
        max_length=config.rollout.context_limit,  # never truncate a completion away
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=config.seed,
        dataloader_num_workers=0,
        disable_tqdm=sink is not None,
    )
    callbacks = [_sink_callback(sink, config.max_steps)] if sink is not None else []
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=callbacks,
    )
    trainer.train()
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    trainer.model.float().save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(out)
    shutil.rmtree(work, ignore_errors=True)
    return out


def _sink_callback(sink: Sink, total: int) -> Any:
    """A ``TrainerCallback`` forwarding the Trainer's logs (loss, lr, accuracy) to ``sink``."""
    from transformers import TrainerCallback

    class SinkCallback(TrainerCallback):
        # The Trainer logs a step's loss and, at the end, a summary for the same step; a sink
        # replaces a step's metrics whole, so merge everything logged for a step.
        def __init__(self) -> None:
            self.seen: dict[int, dict[str, float]] = {}

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            step = int(state.global_step)
            values = {
                f"sft/{k}": float(v) for k, v in (logs or {}).items() if isinstance(v, int | float)
            }
            if values:
                merged = self.seen.setdefault(step, {})
                merged.update(values)
                sink.metrics(step, dict(merged))
            sink.progress(step, total, f"sft step {step}")

    return SinkCallback()
