"""Job specs of the commands that evaluate and roll out: ``envace eval``, ``sweep``, ``rollout``.

Each spec is the one declaration of its job's settings: a typed field with its default and
description. Everything else is derived from it — the command's flags (``cli.spec_options``),
the TOML job file the studio writes (``envace KIND --config FILE``), the run manifest's
``config`` (``resolved().record()``). Training jobs are declared the same way in
``config.TrainConfig`` / ``SFTConfig`` and the study in ``study.config.StudyConfig``.

Settings are data only: samplers, tokenizers, users and judges are built from them by the
command (``cli.users``), never stored in a spec.

Flags: ``--`` plus the field name with dashes, ``--x/--no-x`` for booleans, repeatable (or
comma-separated) for tuples. ``FLAGS`` adds kept aliases; ``DEPRECATED`` maps a flag an earlier
release used to its field (the command still takes it and says what to write instead).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from envace_engine.config import (
    EVAL_BATCH_SIZE,
    EVAL_TEMPERATURE,
    MEMORY_TOKENS,
    ROLLOUT_DEFAULTS,
    ReportTo,
    SamplerDtype,
    Section,
    checkpoint_prompts,
)
from envace_engine.types import Mode

RehearsalName = Literal["parallel", "sequential", "select"]


def _listed(value: object) -> object:
    """A tuple from a comma-separated string or a list of them (``0,1,2`` or ``[0, 1]``)."""
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list | tuple):
        return tuple(p.strip() for v in value for p in str(v).split(",") if p.strip())
    return value


class JobSpec(Section):
    """A job spec (a frozen config section): flags derive from its fields."""

    FLAGS: ClassVar[dict[str, tuple[str, ...]]] = {}  # field -> further flags it answers to
    DEPRECATED: ClassVar[dict[str, str]] = {}  # an earlier release's flag -> its field now

    def record(self) -> dict[str, Any]:
        """What the run manifest stores as the job's ``config``."""
        return self.model_dump(mode="json")


class EvaluationSpec(JobSpec):
    """What an evaluation and a sweep share."""

    suite: str = Field(description="task suite (`envace tasks list`) or mcp:PATH/suite.toml")
    split: str | None = Field(
        None, description="split (default: the suite's held-out split; tau2, vita: test)"
    )
    n_tasks: int = Field(8, ge=1, description="the split's first K tasks")
    repeats: int = Field(1, ge=1, description="episodes per task (pass^k)")
    temperature: float = Field(EVAL_TEMPERATURE, ge=0.0, description="sampling temperature")
    top_p: float = Field(
        ROLLOUT_DEFAULTS.top_p,
        gt=0.0,
        le=1.0,
        description="nucleus sampling: sample among the most likely tokens whose probability "
        "mass reaches top_p (1 = off)",
    )
    seed: int = Field(0, description="sampling seed")
    max_turns: int = Field(
        ROLLOUT_DEFAULTS.max_turns, ge=1, description="agent replies per user turn"
    )
    # the prompt settings: None = what the checkpoint was trained with (``resolved``)
    max_new_tokens_act: int | None = Field(
        None, ge=1, description="tokens per agent reply (default: the checkpoint's)"
    )
    max_new_tokens_rehearse: int | None = Field(
        None, ge=1, description="tokens per imagined result (default: the checkpoint's)"
    )
    rehearse_history: bool | None = Field(
        None, description="the conversation in rehearse prompts (default: the checkpoint's)"
    )
    world_state: bool | None = Field(
        None, description="the task's world state in rehearse prompts (default: the checkpoint's)"
    )
    n_examples: int | None = Field(
        None, ge=0, description="worked examples in prompts (default: the checkpoint's)"
    )
    memory_tokens: int = Field(MEMORY_TOKENS, ge=1, description="tokens per memory")
    check_calls: bool = Field(
        ROLLOUT_DEFAULTS.check_calls,
        description="imagined episodes: a call the tools' schemas refuse gets the real tools' "
        "error, the world role is not asked",
    )
    success_threshold: float = Field(
        1.0, gt=0.0, le=1.0, description="reward that counts as success, in (0, 1]"
    )
    batch_size: int = Field(EVAL_BATCH_SIZE, ge=1, description="prompts per forward batch")
    dtype: SamplerDtype = Field(
        "auto",
        description="GEMM dtype of embedded samplers: auto = bf16 where the CPU has a bf16 "
        "unit, else float32",
    )
    judge: str | None = Field(
        None,
        description="judge of tau2 NL assertions and of every vita score (none: those stay "
        "unscored): http://HOST:PORT or openai+http://HOST:PORT[?model=NAME], or a model name "
        "or checkpoint dir (the embedded engine)",
    )
    judge_max_new_tokens: int = Field(1024, ge=1, description="tokens per embedded-judge reply")
    report_to: ReportTo = Field("none", description="also log metrics to trackio or wandb")

    FLAGS: ClassVar[dict[str, tuple[str, ...]]] = {"n_tasks": ("--tasks",)}
    DEPRECATED: ClassVar[dict[str, str]] = {"--examples": "n_examples", "--judge-url": "judge"}

    def checkpoints(self) -> tuple[str, ...]:
        """The models this job evaluates."""
        raise NotImplementedError

    def resolved(self) -> EvaluationSpec:
        """This spec with every unset prompt setting taken from the checkpoints' record, else
        the defaults: a checkpoint is evaluated with the prompts it was trained with.
        Checkpoints recorded with different settings need the settings given explicitly."""
        records = [r for r in (checkpoint_prompts(m) for m in self.checkpoints()) if r]
        if any(r != records[0] for r in records[1:]):
            raise ValueError(
                f"the checkpoints were trained with different prompt settings ({records}): "
                "give n_examples, max_new_tokens_act, max_new_tokens_rehearse, "
                "rehearse_history and world_state explicitly"
            )
        recorded = {**ROLLOUT_DEFAULTS.model_dump(), **(records[0] if records else {})}
        unset = {k: recorded[k] for k in PROMPT_FIELDS if getattr(self, k) is None}
        return self.model_copy(update=unset)

    def rollout_settings(self) -> dict[str, Any]:
        """The keys of ``rollout.RolloutConfig`` this spec sets (after ``resolved``)."""
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
            "max_turns": self.max_turns,
            **{k: getattr(self, k) for k in PROMPT_FIELDS},
            "check_calls": self.check_calls,
        }


PROMPT_FIELDS = (
    "max_new_tokens_act",
    "max_new_tokens_rehearse",
    "rehearse_history",
    "world_state",
    "n_examples",
)


class EvalSpec(EvaluationSpec):
    """``envace eval``: one checkpoint in the real environment, optionally after private
    rehearsal (``budget`` imagined episodes per task in ``rehearsal`` mode)."""

    model: str = Field(description="model name, checkpoint dir or sglang+http://HOST:PORT")
    budget: int = Field(0, ge=0, description="imagined episodes before each task (0 = plain)")
    rehearsal: RehearsalName = Field("parallel", description="parallel | sequential | select")
    basis: str | None = Field(
        None,
        description="scoring basis: bfcl official|strict, tau2 official|legacy (default first)",
    )
    user: str | None = Field(
        None,
        description="simulated user (tau2, vita): model name, checkpoint dir, "
        "sglang+http://HOST:PORT or openai+http://HOST:PORT[?model=NAME]; default: replay the "
        "task's scripted opening",
    )
    max_steps: int = Field(200, ge=1, description="messages per simulated-user conversation")
    user_max_new_tokens: int = Field(128, ge=1, description="tokens per simulated-user message")
    user_temperature: float = Field(
        0.0, ge=0.0, description="simulated user's temperature (tau2: 0)"
    )

    def checkpoints(self) -> tuple[str, ...]:
        return (self.model,)

    def rollout_settings(self) -> dict[str, Any]:
        return {**super().rollout_settings(), "max_steps": self.max_steps}


class SweepSpec(EvaluationSpec):
    """``envace sweep``: the grid of rehearsal budgets x modes x checkpoints."""

    model: tuple[str, ...] = Field(
        min_length=1,
        description="checkpoints to sweep, in order (repeat --model or separate by commas)",
    )
    budgets: tuple[int, ...] = Field(
        (0, 1, 2, 4), min_length=1, description="imagined-episode budgets, e.g. 0,1,2,4"
    )
    modes: tuple[RehearsalName, ...] = Field(
        ("parallel", "sequential"),
        min_length=1,
        description="rehearsal modes, e.g. parallel,select",
    )

    FLAGS: ClassVar[dict[str, tuple[str, ...]]] = {
        **EvaluationSpec.FLAGS,
        "modes": ("--rehearsal",),
    }

    _list = field_validator("model", "budgets", "modes", mode="before")(_listed)

    @field_validator("budgets")
    @classmethod
    def _no_negative(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if min(value) < 0:
            raise ValueError(f"budgets {list(value)}: each budget is 0 or more")
        return value

    def checkpoints(self) -> tuple[str, ...]:
        return self.model


class RolloutSpec(JobSpec):
    """``envace rollout``: a batch of episodes of a suite's training split, no training."""

    model: str = Field(description="policy: smollm2-135m, tiny, a checkpoint dir or sglang+")
    suite: str = Field("toy", description="task suite (`envace tasks list`)")
    split: str = Field("train", description="task split")
    mode: Mode = Field(Mode.REHEARSAL, description="who answers tool calls")
    episodes: int = Field(4, ge=1, description="episodes in total (a multiple of --group)")
    group: int = Field(1, ge=1, description="episodes per task (a GRPO group)")
    seed: int = Field(0, description="task choice and sampling seed")
    simulator: str | None = Field(None, description="frozen simulator model (simulator mode)")
    max_turns: int = Field(
        ROLLOUT_DEFAULTS.max_turns, ge=1, description="agent replies per user turn"
    )
    max_new_tokens_act: int = Field(
        ROLLOUT_DEFAULTS.max_new_tokens_act, ge=1, description="tokens per act generation"
    )
    max_new_tokens_rehearse: int = Field(
        ROLLOUT_DEFAULTS.max_new_tokens_rehearse, ge=1, description="tokens per world generation"
    )
    temperature: float = Field(
        ROLLOUT_DEFAULTS.temperature, ge=0.0, description="sampling temperature"
    )
    n_examples: int = Field(
        ROLLOUT_DEFAULTS.n_examples, ge=0, description="worked examples in both prompts"
    )
    grounded_rehearsal: bool = Field(
        ROLLOUT_DEFAULTS.grounded_rehearsal, description="reference results in the rehearse prompt"
    )
    dtype: SamplerDtype = Field("auto", description="GEMM dtype of the embedded samplers")

    DEPRECATED: ClassVar[dict[str, str]] = {
        "--max-new-tokens": "max_new_tokens_act",
        "--examples": "n_examples",
        "--grounded/--no-grounded": "grounded_rehearsal",
    }

    @model_validator(mode="after")
    def _consistent(self) -> RolloutSpec:
        if self.episodes % self.group:
            raise ValueError(f"episodes {self.episodes}: not a multiple of group {self.group}")
        if (self.mode is Mode.SIMULATOR) != (self.simulator is not None):
            raise ValueError("--simulator MODEL is needed in simulator mode, and only there")
        return self

    def rollout_settings(self) -> dict[str, Any]:
        """The keys of ``rollout.RolloutConfig`` this spec sets."""
        keys = ROLLOUT_KEYS
        return {k: getattr(self, k) for k in keys}


ROLLOUT_KEYS = (
    "mode",
    "max_turns",
    "max_new_tokens_act",
    "max_new_tokens_rehearse",
    "temperature",
    "seed",
    "grounded_rehearsal",
    "n_examples",
)

SPECS: dict[str, type[JobSpec]] = {"eval": EvalSpec, "sweep": SweepSpec, "rollout": RolloutSpec}
"""The job spec of each command declared here, by command name."""

# keys runs recorded before the job specs, and what each is called now
_RENAMED = {"examples": "n_examples", "judge_url": "judge", "checkpoints": "model"}


def spec_of_run(kind: str, model: str, suite: str, config: dict[str, Any]) -> JobSpec:
    """The job spec of a stored ``eval``, ``sweep`` or ``rollout`` run, from its manifest's
    ``model``, ``suite`` and ``config`` — also one recorded before the job specs (its keys
    renamed, its sweep's modes a comma-separated string, its rollout settings partial)."""
    if kind not in SPECS:
        raise ValueError(f"runs of kind {kind!r} have no job spec here: one of {sorted(SPECS)}")
    data = {_RENAMED.get(k, k): v for k, v in config.items()}
    data.setdefault("suite", suite)
    if kind == "sweep":
        data.setdefault("model", model.split(","))
    else:
        data.setdefault("model", model)
    return SPECS[kind].model_validate(data)
