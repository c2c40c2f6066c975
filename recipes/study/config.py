"""``StudyConfig``: one typed tree for ``envace study`` (a TOML file plus ``--set`` overrides).

Arms (``ARMS``) all start from the same SFT checkpoint (``model``) and share ``[train]``: the same
steps, batch shape, task order and seeds. What an arm changes is exactly its definition:

* ``envace`` — rehearsal rollouts, both roles trained, role-wise baseline;
* ``real-grpo`` — real-environment rollouts, act role trained (the interaction baseline);
* ``act-only`` — rehearsal rollouts, rehearse role frozen;
* ``shared-baseline`` — ``envace`` with one baseline for both roles;
* ``simulator`` — a frozen copy of the SFT model answers the tools; act role trained;
* ``fidelity`` — ``envace`` with the world role's truth signals of ``[fidelity]``: the offline
  fidelity reward on rehearse rows, the auxiliary next-observation NLL and the KL anchor.

A study whose arms include ``fidelity`` is judged on the world-model claims (a′)–(d′)
(``study.claims``); the others on the reproduction claims (a)–(e).

``[eval]`` says how every checkpoint (``base``, ``sft`` and each arm's last) is evaluated; it is
the only section a resumed study may change (``RESUMABLE``), with ``lanes`` (how many units
run at once: scheduling, not a setting of any unit) and ``model``'s path (a moved SFT checkpoint:
its weights must be the ones the study started from, which ``open_state`` checks by digest):
the arms share everything else.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from envace_engine.config import (
    EVAL_TEMPERATURE,
    MEMORY_TOKENS,
    AdvantageSettings,
    LoraSettings,
    LossSettings,
    OptimSettings,
    ProbeSettings,
    ReportTo,
    RolloutSettings,
    Section,
    TrainConfig,
    same_as,
)
from envace_engine.specs import SweepSpec
from envace_engine.stats import RESAMPLES

ArmName = Literal["envace", "real-grpo", "act-only", "shared-baseline", "simulator", "fidelity"]
ARMS: tuple[str, ...] = (
    "envace",
    "real-grpo",
    "act-only",
    "shared-baseline",
    "simulator",
    "fidelity",
)
# What each arm sets in its TrainConfig on top of the shared [train] section.
ARM_OVERRIDES: dict[str, dict[str, Any]] = {
    "envace": {"mode": "envace"},
    "real-grpo": {"mode": "real-grpo"},
    "act-only": {"mode": "act-only"},
    "shared-baseline": {"mode": "envace", "advantages": {"role_wise": False}},
    "simulator": {"mode": "simulator"},
    "fidelity": {"mode": "envace"},  # and the [fidelity] section (StudyConfig.arm_config)
}


class StudyFidelity(Section):
    """What the ``fidelity`` arm adds to ``envace`` (``TrainConfig`` keys of the same names)."""

    task_weight: float = Field(
        0.5, ge=0, le=1, description="world.task_weight: α of a rehearse row's α·R + (1 − α)·F"
    )
    world_nll: float = Field(0.1, ge=0, description="loss.world_nll: the auxiliary NLL's weight")
    world_kl: float = Field(0.0, ge=0, description="loss.world_kl: the world role's KL anchor")
    world_nll_replay: int = Field(
        0, ge=0, description="loss.world_nll_replay: SFT rehearse examples replayed per step"
    )
    world_nll_rows: int = Field(
        0, ge=0, description="loss.world_nll_rows: at most this many world NLL rows per step"
    )


class StudyTrain(Section):
    """What every arm shares (``TrainConfig`` keys; an arm adds only its mode/baseline)."""

    split: Annotated[str, same_as(TrainConfig, "split")] = "train"
    task_filter: Annotated[dict[str, str], same_as(TrainConfig, "task_filter")] = Field(
        default_factory=dict
    )
    reward: Annotated[Literal["state", "reference"], same_as(TrainConfig, "reward")] = "state"
    steps: Annotated[int, same_as(TrainConfig, "steps")] = 40
    tasks_per_step: Annotated[int, same_as(TrainConfig, "tasks_per_step")] = 8
    group_size: int = Field(4, ge=2, description="episodes per task (G); 1 would train nothing")
    micro_batch_tokens: Annotated[int, same_as(TrainConfig, "micro_batch_tokens")] = 4096
    bf16: Annotated[bool, same_as(TrainConfig, "bf16")] = True
    checkpoint_every: int = Field(1, ge=1, description="1: a killed arm repeats no step")
    require_signal: bool = Field(
        True,
        description="mark an arm failed when no step had a row with a non-zero advantage "
        "(no reward variance anywhere); false keeps such an arm (plumbing tests)",
    )
    rollout: Annotated[RolloutSettings, same_as(TrainConfig, "rollout")] = RolloutSettings()
    advantages: Annotated[AdvantageSettings, same_as(TrainConfig, "advantages")] = (
        AdvantageSettings()
    )
    loss: Annotated[LossSettings, same_as(TrainConfig, "loss")] = LossSettings()
    optim: Annotated[OptimSettings, same_as(TrainConfig, "optim")] = OptimSettings()
    probe: Annotated[ProbeSettings, same_as(TrainConfig, "probe")] = ProbeSettings()
    # LoRA arms: each finished arm's adapter is kept in the study folder (runner.keep_adapter)
    lora: Annotated[LoraSettings, same_as(TrainConfig, "lora")] = LoraSettings()


# --set keys ``envace study --resume`` accepts (and records): prefixes, and whole keys
RESUMABLE = ("eval.",)
RESUMABLE_KEYS = frozenset({"lanes", "model"})


class StudyEval(Section):
    """Held-out evaluation of each checkpoint (``study.evaluation``)."""

    split: str = Field("validation", description="held-out split the tasks come from")
    n_tasks: Annotated[int, same_as(SweepSpec, "n_tasks")] = 64
    repeats: Annotated[int, same_as(SweepSpec, "repeats")] = 2
    budgets: Annotated[tuple[int, ...], same_as(SweepSpec, "budgets")] = (0, 1, 2)
    modes: tuple[Literal["parallel", "sequential"], ...] = Field(
        ("parallel", "sequential"), min_length=1, description="rehearsal modes at each budget"
    )
    select_budgets: tuple[int, ...] = Field(
        (),
        description="budgets N at which the select mode (docs/rehearsal.md) is also evaluated",
    )
    retired: tuple[str, ...] = Field(
        (),
        description="run ids of earlier runs of redone arms whose last checkpoint is evaluated "
        "too (named <arm>-r1, <arm>-r2, ... by their place among the arm's earlier runs: shown "
        "in the tables, never used by a verdict)",
    )
    temperature: float = Field(EVAL_TEMPERATURE, gt=0, description="sampling temperature")
    memory_tokens: int = Field(MEMORY_TOKENS, ge=1, description="tokens per memory")
    bootstrap: int = Field(RESAMPLES, ge=100, description="bootstrap resamples for the 95 % CIs")
    base: bool = Field(True, description="also evaluate the base model (before SFT)")
    base_examples: int = Field(
        2,
        ge=0,
        description="worked examples in the base model's prompts (an untrained model writes "
        "the call format only after seeing it; the trained checkpoints use their own record)",
    )


class StudyConfig(Section):
    """Everything ``envace study`` needs (see the module docstring)."""

    INHERITS_PROMPTS: ClassVar[bool] = True

    model: str = Field(description="the SFT checkpoint every arm starts from")
    base_model: str = Field("smollm2-135m", description="the model before SFT (row 'base')")
    suite: Annotated[str, same_as(TrainConfig, "suite")] = "toy"
    arms: tuple[ArmName, ...] = Field(
        ("envace", "real-grpo", "act-only", "shared-baseline"),
        description="training arms, each its own run from model (ARM_OVERRIDES)",
    )
    seed: int = Field(0, description="every arm's and evaluation's seed")
    root: Annotated[str | None, same_as(TrainConfig, "root")] = None
    run_id: str | None = Field(None, description="the study's folder name; None = a fresh id")
    cost: str = Field("", description="what the full study costs on the reference machine")
    report_to: ReportTo = Field("none", description="also log every run's metrics to a tracker")
    lanes: int = Field(
        1,
        ge=1,
        le=64,
        description="units (an arm's training, a checkpoint's evaluation) run at once, each "
        "in its own process on cores // lanes threads (study.lanes)",
    )
    train: StudyTrain = Field(StudyTrain(), description="[train]: what every arm shares")
    eval: StudyEval = Field(StudyEval(), description="[eval]: each checkpoint's evaluation")
    fidelity: StudyFidelity = Field(
        StudyFidelity(), description="[fidelity]: what the fidelity arm adds"
    )
    # Filled from ``model``'s checkpoint record by ``config.build`` (INHERITS_PROMPTS) and
    # folded into [train.rollout] (``_fold_prompts``); a study renders every prompt as the SFT
    # checkpoint was trained.
    rollout: dict[str, Any] = Field(
        default_factory=dict,
        description="the SFT checkpoint's prompt settings (filled in; folded into [train.rollout])",
    )

    @model_validator(mode="before")
    @classmethod
    def _fold_prompts(cls, data: Any) -> Any:
        """[train.rollout] = the checkpoint's prompt settings under the keys it sets itself,
        resolved here, once. A dumped config (the study's run.json) then holds the resolved
        values, so rebuilding it on ``--resume`` gives the same arms: resolving later, by which
        keys look explicitly set, took a dump's defaults as explicit and lost the checkpoint's
        settings."""
        if not isinstance(data, dict) or not data.get("rollout"):
            return data
        train = dict(data.get("train") or {})
        train["rollout"] = {**data["rollout"], **dict(train.get("rollout") or {})}
        return {**data, "train": train}

    @model_validator(mode="after")
    def _checks(self) -> StudyConfig:
        if not self.arms:
            raise ValueError(f"arms is empty: choose from {', '.join(ARMS)}")
        if len(set(self.arms)) != len(self.arms):
            raise ValueError(f"arms {list(self.arms)} lists an arm twice")
        if 0 not in self.eval.budgets:
            raise ValueError("[eval] budgets must include 0 (the no-rehearsal row every Δ uses)")
        if any(n < 2 for n in self.eval.select_budgets):
            raise ValueError(
                f"[eval] select_budgets {list(self.eval.select_budgets)}: use budgets of 2 or "
                "more (select at N = 1 replays the only imagined reply: plain execution)"
            )
        return self

    def arm_config(self, arm: str, run_id: str) -> TrainConfig:
        """The ``TrainConfig`` of one arm: the shared [train] section plus the arm's override."""
        if arm not in ARM_OVERRIDES:
            raise ValueError(f"unknown arm {arm!r}: choose from {', '.join(ARMS)}")
        data: dict[str, Any] = self.train.model_dump(exclude={"require_signal"})
        data.update(
            model=self.model,
            suite=self.suite,
            seed=self.seed,
            root=self.root,
            run_id=run_id,
            keep_checkpoints=1,
        )
        for key, value in ARM_OVERRIDES[arm].items():
            data[key] = {**data[key], **value} if isinstance(value, dict) else value
        if arm == "fidelity":
            f = self.fidelity
            data["world"] = {"task_weight": f.task_weight}
            data["loss"] = {
                **data["loss"],
                "world_nll": f.world_nll,
                "world_kl": f.world_kl,
                "world_nll_replay": f.world_nll_replay,
                "world_nll_rows": f.world_nll_rows,
            }
        return TrainConfig.model_validate(data)
