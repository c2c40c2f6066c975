"""One typed config tree for ``envace train`` and ``envace sft``: TOML file + CLI overrides.

The tree is pydantic (it parses outside text). Top-level keys are the run's identity and the
GRPO batch shape; the sections ``[rollout]``, ``[advantages]``, ``[loss]``, ``[optim]`` and
``[distributed]`` hold the knobs of one concept each. Defaults follow EnvACE's run (docs/method.md
§4): one optimizer step per rollout batch, constant lr, grad clip 1.0, ratio clip 0.2, dual
clip 3, KL off, mean-only advantages pooled over rows. Every unknown key, wrong type or
out-of-range value is an error naming the key, what is wrong and what to set instead
(``ConfigError``).

Overrides use dotted keys, ``rollout.temperature=0.7``; values are parsed as TOML values (so
``true``, ``3``, ``"x"`` and ``[0.9, 0.99]`` work) and fall back to a plain string.
"""

from __future__ import annotations

import json
import os
import textwrap
import tomllib
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.fields import FieldInfo

from envace_engine.adapters import split_name
from envace_engine.models import ModelError, resolve

TrainMode = Literal["envace", "real-grpo", "act-only", "simulator"]
# The embedded sampler's GEMM dtype (``samplers.embedded.sampler.compute_dtype``).
SamplerDtype = Literal["auto", "float32", "bfloat16"]
RewardKind = Literal["state", "reference", "judge"]


class ConfigError(ValueError):
    """A config file or override is invalid; the message says which key and what to set."""


class Section(BaseModel):
    """A frozen config section: unknown keys are errors (``build`` names them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    # Whether ``build`` fills unset ``[rollout]`` prompt keys from the checkpoint named by
    # ``model`` (``with_checkpoint_prompts``): configs that start from a trained policy.
    INHERITS_PROMPTS: ClassVar[bool] = False


class RolloutSettings(Section):
    """How episodes are generated (maps onto ``rollout.RolloutConfig``)."""

    max_turns: int = Field(4, ge=1, description="agent replies per user turn")
    max_new_tokens_act: int = Field(128, ge=1, description="tokens per agent reply")
    max_new_tokens_rehearse: int = Field(96, ge=1, description="tokens per rehearsed result")
    max_episode_tokens: int = Field(4096, ge=1, description="policy tokens per episode")
    context_limit: int = Field(8192, ge=1, description="prompt + new tokens of any generation")
    temperature: float = Field(1.0, gt=0, description="sampling temperature (> 0 for GRPO)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass; 1 = off")
    grounded_rehearsal: bool = Field(True, description="reference results in rehearse prompts")
    rehearse_history: bool = Field(True, description="conversation so far in rehearse prompts")
    world_state: bool = Field(
        False,
        description="the task's world state (what the environment holds at the start, in its "
        "own words: Task.meta['world_state']) in rehearse prompts, where the suite writes one",
    )
    n_examples: int = Field(2, ge=0, description="worked examples from other tasks per prompt")
    end_on_invalid_rehearsal: bool = Field(
        True,
        description="a rehearsed INVALID_* error ends the episode (EnvACE's code); false: the "
        "agent reads it as a tool message and goes on, as after a real tool's error",
    )
    check_calls: bool = Field(
        False,
        description="check each rehearsed or simulated call against the offered tool schemas "
        "first: a call the real tools would refuse before running (unknown tool, arguments "
        "against the schema) gets their error and the world role is not asked",
    )
    sampler_batch_size: int = Field(32, ge=1, description="prompts per HF forward batch")
    sampler_dtype: SamplerDtype = Field(
        "auto",
        description="GEMM dtype of the embedded sampler: auto = bf16 where the CPU has a native "
        "bf16 unit (AMX-BF16, AVX512-BF16), else float32",
    )

    # Keys that configure the sampler, not the episodes (``rollout.RolloutConfig`` has neither).
    SAMPLER_KEYS: ClassVar[frozenset[str]] = frozenset({"sampler_batch_size", "sampler_dtype"})

    def episode_settings(self) -> dict[str, Any]:
        """The keys ``rollout.RolloutConfig`` takes (all but the sampler's)."""
        return self.model_dump(exclude=set(self.SAMPLER_KEYS))


ROLLOUT_DEFAULTS = RolloutSettings()
"""The one source of rollout defaults: ``RolloutConfig``, the CLI options and the studio's forms
read theirs from here."""

EVAL_TEMPERATURE = 0.7
"""Sampling temperature of evaluations and sweeps (training samples at
``ROLLOUT_DEFAULTS.temperature``)."""

EVAL_BATCH_SIZE = 64
"""Decode slots of an evaluation's embedded sampler (``envace eval``, ``sweep``, ``study``):
64 tasks x 2 repeats decode in two waves of full batches."""

MEMORY_TOKENS = 96
"""Token cap of one memory written after rehearsal (``testtime.memory.MemoryConfig``; the
``memory_tokens`` of ``envace eval``, ``sweep`` and the study's evaluations)."""

EVAL_CACHE_TOKENS = 65536
"""Prefix-cache tokens an evaluation's embedded sampler keeps, also while a rollout runs
(``HFSampler``'s ``prefix_cache_tokens`` and ``call_cache_tokens``): an evaluation is one long
decode session per rollout, and a cache evicting only when a session ends grows with it
(measured by ``bench/eval_memory.py``; docs/samplers.md)."""


# experiment trackers a run can also log its metrics to (``envace_engine.tracking``)
ReportTo = Literal["none", "trackio", "wandb"]

TRACE_EPISODES = 2
"""Episodes per step a tracker also gets as traces: ``TrainConfig.trace_episodes``, and what
``envace eval``, ``sweep`` and ``study`` runs reporting to a tracker log (a few conversations
to read beside the curves, not a copy of the run)."""

# The prompt settings a checkpoint was trained with (docs/training.md, "Prompt settings"): the
# rollout must render prompts exactly as training did, so ``envace eval``, ``sweep``, ``train``
# and ``study`` take these from a checkpoint unless told otherwise.
PROMPT_KEYS = (
    "n_examples",
    "grounded_rehearsal",
    "rehearse_history",
    "world_state",
    "max_new_tokens_act",
    "max_new_tokens_rehearse",
)
PROMPT_FILE = "envace_prompts.json"  # in a checkpoint directory, beside config.json


def prompt_settings(settings: RolloutSettings) -> dict[str, Any]:
    """The prompt keys of ``settings`` (what a checkpoint records)."""
    return {k: getattr(settings, k) for k in PROMPT_KEYS}


def write_prompt_settings(model_dir: str | Path, settings: RolloutSettings) -> None:
    """Record in checkpoint ``model_dir`` the prompt settings it was trained with."""
    body = json.dumps(prompt_settings(settings), indent=1, sort_keys=True)
    (Path(model_dir) / PROMPT_FILE).write_text(body + "\n", encoding="utf-8")


def checkpoint_prompts(model: str) -> dict[str, Any]:
    """The prompt settings recorded in checkpoint dir ``model`` (or the adapter dir of
    ``BASE+ADAPTER_DIR``; {} for registry names, dirs without a record, or servers). A malformed
    record is an error naming the file."""
    if model.startswith("sglang+"):
        return {}
    # BASE+ADAPTER_DIR: the adapter's record (the run that trained it rendered the prompts)
    file = split_name(model)[1] / PROMPT_FILE
    if not file.is_file():
        return {}
    try:
        body = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ConfigError(f"{file} is not valid JSON ({err}): re-save the checkpoint") from None
    if not isinstance(body, dict):
        raise ConfigError(f"{file} must hold a JSON object of prompt settings")
    return {k: body[k] for k in PROMPT_KEYS if k in body}


def with_checkpoint_prompts(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with ``[rollout]`` prompt keys it does not set taken from its ``model``'s record."""
    out = dict(data)
    recorded = checkpoint_prompts(str(out.get("model", "")))
    if recorded:
        given = dict(out.get("rollout") or {})
        out["rollout"] = {**recorded, **given}
    return out


class AdvantageSettings(Section):
    """Role-wise GRPO advantages (``advantages.compute_advantages``)."""

    pooling: Literal["rows", "trajectories"] = Field(
        "rows",
        description="the baseline b: mean over the pool's rows (EnvACE) or over its "
        "trajectories, each counted once",
    )
    scale_by_std: bool = Field(False, description="divide by the pool's std (TRL, verl)")
    role_wise: bool = Field(
        True, description="one pool per role in a group; false = one shared pool (ablation)"
    )


class LossSettings(Section):
    """The clipped policy-gradient loss (``loss.policy_loss``)."""

    clip_eps_low: float = Field(0.2, ge=0, lt=1, description="ratio clip below 1: 1 − eps")
    clip_eps_high: float | None = Field(None, ge=0, description="defaults to clip_eps_low")
    dual_clip: float | None = Field(3.0, gt=1, description="None turns the dual clip off")
    kl_coef: float = Field(0.0, ge=0, description="> 0 loads a frozen reference model")
    world_kl: float = Field(
        0.0,
        ge=0,
        description="KL to the starting checkpoint on rehearse rows only, added to kl_coef "
        "there: anchors the world role; > 0 loads a frozen reference model",
    )
    world_nll: float = Field(
        0.0,
        ge=0,
        description="weight of the world role's NLL of known answers (reference results, schema "
        "errors) under this step's rehearse prompts, added to the loss (training.world_nll)",
    )
    world_nll_replay: int = Field(
        0,
        ge=0,
        description="SFT rehearse examples of training tasks replayed per step in the world NLL "
        "(needs world_nll > 0)",
    )
    world_nll_rows: int = Field(
        0,
        ge=0,
        description="at most this many rows in a step's world NLL (its own known answers and the "
        "replayed examples together), a uniform sample drawn by the step's seed; each row costs "
        "a forward and backward over its whole rehearse prompt; 0 = every row",
    )
    aggregation: Literal["seq_mean_token_mean", "token_mean"] = Field(
        "seq_mean_token_mean",
        description="mean over each row's tokens then over rows (TRL grpo), or one mean over "
        "the batch's tokens (TRL bnpo)",
    )
    tis_cap: float | None = Field(
        None,
        ge=1,
        description="truncated importance sampling: the ratio takes the trainer's log-probs and "
        "each token's loss is weighted by min(p_trainer / p_sampler, tis_cap); None = the ratio "
        "takes the sampler's log-probs (docs/training.md, 'Sampler/trainer mismatch')",
    )


class WorldSettings(Section):
    """What trains the world role besides task success (docs/method.md §3, *Rewards per row*).

    A rehearse row's reward is ``task_weight·R_task + (1 − task_weight)·F``, where ``F`` is the
    offline fidelity of its rehearsal against the task's recorded references and the tools'
    schema check (``training.world_reward``), and ``R_task`` alone where ``F`` is unknown.
    """

    task_weight: float = Field(
        1.0,
        ge=0,
        le=1,
        description="weight of task success in a rehearse row's reward, the rest is the offline "
        "fidelity F; 1 = task success only (EnvACE's reward)",
    )


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraSettings(Section):
    """A LoRA adapter instead of full fine-tuning (``envace_engine.adapters``, peft).

    Off by default: every weight is trained. On, the base model is frozen and one adapter (both
    roles share it, the method's shared parameters) is trained; checkpoints hold the adapter
    and its optimizer state only, a few MB that load onto the base on any machine.
    """

    enabled: bool = Field(False, description="train a LoRA adapter instead of every weight")
    rank: int = Field(16, ge=1, description="the adapter's rank r")
    alpha: int = Field(32, ge=1, description="scale numerator: the update is alpha/r·B·A")
    dropout: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="dropout on the adapter's input while training (> 0: the trainer's "
        "log-probs differ from the sampler's, which the mismatch metrics show)",
    )
    target_modules: tuple[str, ...] = Field(
        LORA_TARGETS,
        min_length=1,
        description="names of the linear layers that get an adapter (default: every linear "
        "layer of a Llama block)",
    )


class OptimSettings(Section):
    """AdamW with a constant learning rate and global-norm gradient clipping."""

    lr: float = Field(1e-6, gt=0, description="learning rate (constant)")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW's moment decays")
    weight_decay: float = Field(0.0, ge=0, description="AdamW's decoupled weight decay")
    eps: float = Field(1e-8, gt=0, description="AdamW's denominator epsilon")
    grad_clip: float | None = Field(1.0, gt=0, description="max grad norm; None = no clipping")


class DistributedSettings(Section):
    """How ranks share the model under ``torchrun``/``accelerate launch`` (one process: no effect).

    ``ddp``: every rank holds the whole model and AdamW state; gradients are averaged by one
    all-reduce per step. ``fsdp``: FSDP2 shards parameters, gradients and AdamW state over the
    ranks (one unit per decoder layer plus the root), for models whose training state does not
    fit one device; each rank still keeps one full copy of the weights for sampling and
    checkpoints (docs/training.md). Both give the same weights, and a run resumes with either.
    """

    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp", description="ddp = replicated model; fsdp = FSDP2-sharded training state"
    )


class ProbeSettings(Section):
    """Held-out probes during training (``training.probe``): every ``every`` steps, and before
    the first, real and rehearsal rollouts of ``n_tasks`` tasks of ``split`` that are never
    trained on. ``every = 0`` turns them off."""

    every: int = Field(0, ge=0, description="steps between probes; 0 = no probes")
    split: str = Field("validation", description="held-out split the probe tasks come from")
    n_tasks: int = Field(16, ge=1, description="probe tasks (the split's first, after task_filter)")
    repeats: int = Field(1, ge=1, description="episodes per probe task and rollout mode")
    temperature: float = Field(EVAL_TEMPERATURE, gt=0, description="sampling temperature")


class TrainConfig(Section):
    """Everything ``envace train`` needs. ``run_id`` names the run under ``<root>/runs/``.

    ``[rollout]`` prompt keys it does not set come from ``model``'s checkpoint record
    (``PROMPT_KEYS``), so training renders prompts as the checkpoint was trained with.
    """

    INHERITS_PROMPTS: ClassVar[bool] = True

    model: str = Field("smollm2-135m", description="registry name or checkpoint dir to train")
    sampler: str | None = Field(
        None,
        description="sglang+http://HOST:PORT[,HOST2:PORT] to roll out on SGLang servers (each "
        "step's weights are pushed to them); None = sample in process from the trained model",
    )
    suite: str = Field("toy", description="task suite (`envace tasks list`)")
    split: str = Field("train", description="split the training tasks come from")
    task_filter: dict[str, str] = Field(
        default_factory=dict, description="keep tasks whose meta[key] equals value"
    )
    mode: TrainMode = Field(
        "envace",
        description="envace: rehearsal rollouts, both roles trained; real-grpo: real rollouts, "
        "act trained; act-only: rehearsal rollouts, world role frozen; simulator: a frozen "
        "simulator answers, act trained",
    )
    reward: RewardKind = Field(
        "state",
        description="task success: state (replay the calls on the real backend, compare with "
        "the reference), reference (compare the calls), judge (an LLM judge at judge_url)",
    )
    judge_url: str | None = Field(None, description="http://HOST:PORT of the judge (reward judge)")
    steps: int = Field(30, ge=1, description="optimizer steps (one per rollout batch)")
    tasks_per_step: int = Field(4, ge=1, description="tasks rolled out per step")
    group_size: int = Field(4, ge=1, description="episodes per task (G)")
    seed: int = Field(0, description="task order, sampling and initialisation seed")
    micro_batch_tokens: int = Field(4096, ge=1, description="padded tokens per micro-batch")
    bf16: bool = Field(
        False,
        description="bf16 autocast for the training forward pass where bf16 GEMMs are native "
        "(a CPU with AMX-BF16 / AVX512-BF16, a GPU); fp32 elsewhere, with a warning",
    )
    report_to: ReportTo = Field("none", description="also log metrics to trackio or wandb")
    trace_episodes: int = Field(
        TRACE_EPISODES,
        ge=0,
        description="episodes per step report_to also gets as traces, spread over the step's "
        "tasks (each tool call with its rehearsed and its real answer); 0 = none",
    )
    share_prefix: bool = Field(
        True,
        description="run a micro-batch's common prompt prefix through the model once (same "
        "loss and gradients; ignored under FSDP)",
    )
    pack_episodes: bool = Field(
        True,
        description="score the nested act rows of one episode in one sequence (same loss and "
        "gradients, fewer tokens: batching.Unit)",
    )
    checkpoint_every: int = Field(10, ge=1, description="save a checkpoint every k steps")
    keep_checkpoints: int = Field(2, ge=1, description="newest checkpoints kept on disk")
    root: str | None = Field(
        None,
        description="studio data folder (runs go to <root>/runs/<run_id>); "
        "None = $ENVACE_HOME or ./runs",
    )
    run_id: str | None = Field(None, description="the run's folder name; None = a fresh id")
    rollout: RolloutSettings = Field(RolloutSettings(), description="[rollout]: prompts, sampling")
    advantages: AdvantageSettings = Field(AdvantageSettings(), description="[advantages]")
    loss: LossSettings = Field(LossSettings(), description="[loss]: the clipped PG loss")
    world: WorldSettings = Field(WorldSettings(), description="[world]: world-role rewards")
    optim: OptimSettings = Field(OptimSettings(), description="[optim]: AdamW")
    distributed: DistributedSettings = Field(DistributedSettings(), description="[distributed]")
    probe: ProbeSettings = Field(ProbeSettings(), description="[probe]: held-out probes")
    lora: LoraSettings = Field(LoraSettings(), description="[lora]: adapters instead of weights")

    @model_validator(mode="after")
    def _cross_checks(self) -> TrainConfig:
        if self.lora.enabled and self.distributed.strategy == "fsdp":
            raise ValueError(
                "lora.enabled is not supported with distributed.strategy = 'fsdp' (an adapter "
                "is small: use 'ddp') or set lora.enabled = false"
            )
        if self.world.task_weight < 1 and self.advantages.pooling != "rows":
            raise ValueError(
                "world.task_weight < 1 gives rehearse rows rewards of their own, which "
                "advantages.pooling = 'trajectories' cannot pool: set advantages.pooling = 'rows'"
            )
        world_terms = self.loss.world_kl > 0 or self.loss.world_nll > 0
        if world_terms and self.mode != "envace":
            raise ValueError(
                f"loss.world_kl and loss.world_nll train the world role, which mode = "
                f"{self.mode!r} does not train: set mode = 'envace' or set them to 0"
            )
        if self.loss.world_nll_rows and self.loss.world_nll == 0:
            raise ConfigError(
                "loss.world_nll_rows caps the world NLL's rows, which is off: set "
                "loss.world_nll > 0 or loss.world_nll_rows = 0"
            )
        if self.loss.world_nll_replay and self.loss.world_nll == 0:
            raise ValueError(
                "loss.world_nll_replay replays examples into the world NLL, which is off: set "
                "loss.world_nll > 0 or loss.world_nll_replay = 0"
            )
        if self.loss.world_nll > 0 and self.distributed.strategy == "fsdp":
            raise ValueError(
                "loss.world_nll > 0 is not supported with distributed.strategy = 'fsdp' (its "
                "micro-batches differ per rank): use 'ddp' or set loss.world_nll = 0"
            )
        if self.world.task_weight < 1 and self.mode not in ("envace",):
            raise ValueError(
                f"world.task_weight < 1 shapes the rehearse rows, which mode = {self.mode!r} "
                "does not train: set mode = 'envace' or leave world.task_weight = 1"
            )
        if self.reward == "judge" and not self.judge_url:
            raise ValueError("reward = 'judge' needs judge_url = 'http://HOST:PORT'")
        if self.model.startswith("sglang+"):
            raise ValueError(
                "model must have local weights to train: set model = 'smollm2-135m' (or a "
                "checkpoint dir) and sampler = 'sglang+http://HOST:PORT' for server rollouts"
            )
        if self.sampler is not None:
            _check_sampler(self.sampler)
            if self.rollout.sampler_dtype != "auto":
                raise ValueError(
                    f"rollout.sampler_dtype = {self.rollout.sampler_dtype!r} applies to the "
                    "embedded sampler; an SGLang server computes in the dtype it was started "
                    "with (its --dtype): leave rollout.sampler_dtype unset"
                )
        if self.group_size == 1:
            raise ValueError("group_size = 1 gives every row advantage 0: set group_size >= 2")
        return self


def _check_sampler(spec: str) -> None:
    """``sampler`` must name SGLang servers: only they get each step's weights pushed.

    Any other sampler would hold its own copy of the weights that nothing updates, so the
    rollouts would come from a stale policy without an error anywhere.
    """

    if not spec.startswith("sglang+"):
        raise ValueError(
            f"sampler = {spec!r}: set sampler = 'sglang+http://HOST:PORT[,HOST2:PORT]' to roll "
            "out on SGLang servers, or leave sampler unset to sample in process from the "
            "trained model"
        )
    try:
        resolve(spec)  # parses the URLs only; nothing is contacted here
    except ModelError as err:
        raise ValueError(f"sampler: {err}") from None


class SFTConfig(Section):
    """Everything ``envace sft`` needs: reference trajectories of both roles, supervised.

    ``training.sft`` runs its own loop (length-bucketed batches, bf16 autocast, the LM head
    only on completion tokens). After training it scores ``eval_tasks`` tasks of
    ``eval_split`` teacher-forced (exact tool calls, exact rehearsals) and the checkpoint
    records ``[rollout]``'s prompt settings (``PROMPT_KEYS``).
    """

    model: str = Field("smollm2-135m", description="registry name or checkpoint dir to train")
    suite: str = Field("toy", description="task suite (`envace tasks list`)")
    split: str = Field("train", description="split the reference trajectories come from")
    task_filter: dict[str, str] = Field(
        default_factory=dict, description="keep tasks whose meta[key] equals value"
    )
    n_tasks: int = Field(200, ge=1, description="tasks whose reference trajectories are used")
    roles: tuple[Literal["act", "rehearse", "memory"], ...] = Field(
        ("act", "rehearse"),
        description="roles whose completions are trained: the agent's calls, the world's "
        "answers, rehearsal memories",
    )
    memory_fraction: float = Field(
        0.0,
        ge=0,
        le=1,
        description="share of tasks whose act examples also appear with a rehearsal memory in "
        "context (and, with role 'memory', whose memory is written from an imagined attempt)",
    )
    invalid_fraction: float = Field(
        0.0,
        ge=0,
        le=1,
        description="share of reference calls that also get an invalid variant (an argument "
        "the schema lacks, a required one dropped, a wrong type) whose rehearse target is the "
        "real environment's error (training.sft.invalid); 0 = reference calls only",
    )
    max_steps: int = Field(100, ge=1, description="optimizer steps")
    batch_size: int = Field(8, ge=1, description="sequences per step (see pack_turns)")
    pack_turns: bool = Field(
        False,
        description="one sequence per task's nested act turns (turn k's prompt holds every "
        "earlier turn): one forward for all of them, the loss and gradients of separate "
        "examples; batch_size then counts sequences, so a step sees more turns",
    )
    lr: float = Field(1e-4, gt=0, description="peak learning rate (AdamW)")
    lr_schedule: Literal["constant", "cosine"] = Field(
        "constant", description="after warm-up: constant, or cosine down to min_lr_ratio·lr"
    )
    warmup_steps: int = Field(0, ge=0, description="linear warm-up steps before the schedule")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="cosine floor, as a share of lr")
    grad_clip: float | None = Field(1.0, gt=0, description="max grad norm; None = no clipping")
    bf16: bool = Field(
        True,
        description="bf16 autocast where bf16 GEMMs are native (a CPU with AMX-BF16 / "
        "AVX512-BF16, a GPU); fp32 elsewhere, with a warning",
    )
    report_to: ReportTo = Field("none", description="also log metrics to trackio or wandb")
    seed: int = Field(0, description="task order and initialisation seed")
    eval_split: str | None = Field(
        "validation", description="held-out split scored teacher-forced at the end; None = skip"
    )
    eval_tasks: int = Field(64, ge=1, description="held-out tasks scored teacher-forced")
    out_dir: str | None = Field(None, description="checkpoint dir; None = <run dir>/model")
    root: str | None = Field(None, description="studio data folder, as TrainConfig.root")
    run_id: str | None = Field(None, description="the run's folder name; None = a fresh id")
    rollout: RolloutSettings = Field(
        RolloutSettings(), description="[rollout]: prompt settings the checkpoint records"
    )
    lora: LoraSettings = Field(LoraSettings(), description="[lora]: adapters instead of weights")


C = TypeVar("C", bound=BaseModel)


def same_as(model: type[BaseModel], name: str) -> FieldInfo:
    """``model``'s declaration of ``name`` (description, bounds), for a field that means the same
    in another section: ``steps: Annotated[int, same_as(TrainConfig, "steps")] = 40`` keeps its
    own default and is documented and checked once."""
    return model.model_fields[name]


@dataclass(frozen=True)
class Key:
    """One settable key of a config (what ``--set NAME=VALUE`` takes)."""

    name: str  # dotted: ``loss.world_nll``
    type: str
    default: str
    description: str


def keys(cls: type[BaseModel], prefix: str = "") -> list[Key]:
    """Every leaf key of ``cls``, sections expanded, in declaration order."""
    out: list[Key] = []
    for name, field in cls.model_fields.items():
        kind = field.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            out += keys(kind, f"{prefix}{name}.")
            continue
        default = (
            "(required)"
            if field.is_required()
            else _literal(field.get_default(call_default_factory=True))
        )
        out.append(Key(prefix + name, _type_name(kind), default, field.description or ""))
    return out


def _literal(value: Any) -> str:
    """``value`` as ``--set`` writes it (a TOML literal); ``None`` (unset) has none."""
    if value is None:
        return "None"
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, Mapping):  # an inline table (JSON's objects are not TOML)
        return "{" + ", ".join(f"{k} = {_literal(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)  # strings, numbers, booleans and arrays read the same in TOML


def _type_name(kind: Any) -> str:
    if isinstance(kind, type) and not typing.get_args(kind):
        return kind.__name__
    return str(kind).replace("typing.", "").replace("NoneType", "None")


def format_keys(cls: type[BaseModel]) -> str:
    """``keys(cls)`` for a terminal: ``name: type = default`` and its description indented."""
    lines = []
    for key in keys(cls):
        lines.append(f"{key.name}: {key.type} = {key.default}")
        lines += textwrap.wrap(
            key.description,
            96,
            initial_indent="    ",
            subsequent_indent="    ",
            break_on_hyphens=False,
        )
    return "\n".join(lines)


def data_root(root: str | None) -> Path:
    """The studio data folder: ``root``, else $ENVACE_HOME, else ./runs (as ``envace runs``)."""
    return Path(root or os.environ.get("ENVACE_HOME") or "runs")


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b=value`` -> (["a", "b"], parsed value). Values are TOML literals or plain strings."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r} must look like key=value (e.g. steps=10)")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return key.strip().split("."), value


def merge(data: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """A copy of ``data`` with every ``key=value`` override applied (sections created)."""
    out: dict[str, Any] = {k: dict(v) if isinstance(v, Mapping) else v for k, v in data.items()}
    for text in overrides:
        path, value = parse_override(text)
        node = out
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {part!r} is a value, not a [section]")
            node = child
        node[path[-1]] = value
    return out


def build(cls: type[C], data: Mapping[str, Any], overrides: Sequence[str] = ()) -> C:
    """Validate ``data`` plus overrides as ``cls``; errors become one readable ``ConfigError``."""
    merged = merge(data, overrides)
    if issubclass(cls, Section) and cls.INHERITS_PROMPTS:
        merged = with_checkpoint_prompts(merged)
    try:
        return cls.model_validate(merged)
    except ValidationError as err:
        lines = [_explain(cls, e) for e in err.errors()]
        raise ConfigError(f"invalid {cls.__name__}:\n  " + "\n  ".join(lines)) from None


def load(cls: type[C], path: str | Path | None, overrides: Sequence[str] = ()) -> C:
    """Read a TOML file (optional) and validate it with ``overrides`` as ``cls``."""
    data: dict[str, Any] = {}
    if path is not None:
        file = Path(path)
        if not file.is_file():
            raise ConfigError(f"config file {file} does not exist: pass --config FILE.toml")
        try:
            data = tomllib.loads(file.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"{file} is not valid TOML: {err}") from None
    return build(cls, data, overrides)


def _explain(cls: type[BaseModel], error: Mapping[str, Any]) -> str:
    """One line per pydantic error, naming the dotted key and the fix."""
    loc = [str(p) for p in error.get("loc", ())]
    key = ".".join(loc) or "(top level)"
    if error.get("type") == "extra_forbidden":
        valid = ", ".join(sorted(_fields_at(cls, loc[:-1])))
        where = f"[{'.'.join(loc[:-1])}]" if len(loc) > 1 else "the top level"
        return f"unknown key {key!r} in {where}; valid keys: {valid}"
    got = error.get("input")
    shown = "" if isinstance(got, Mapping) else f" (got {got!r})"
    return f"{key}: {error.get('msg', 'invalid value')}{shown}"


def _fields_at(cls: type[BaseModel], path: Sequence[str]) -> list[str]:
    """Field names of the section at ``path`` (``[]`` for the top level)."""
    model: Any = cls
    for part in path:
        field = model.model_fields.get(part)
        if field is None or not isinstance(field.annotation, type):
            return []
        model = field.annotation
    return list(model.model_fields) if hasattr(model, "model_fields") else []
