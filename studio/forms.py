"""The launch form: validated job requests and the ``envace`` command line each one runs.

Form values are outside text, so they are parsed with pydantic; every problem becomes one line
naming the field, what is wrong and what would be accepted. A valid request turns into an argv
for ``python -m envace_engine.cli ...``; ``{run_dir}`` is filled in by the job manager.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from envace_engine.config import ROLLOUT_DEFAULTS
from envace_engine.models import SMOLLM2, TINY, is_local_model, registry
from studio.space import HostLimits

KINDS = {
    "train": "EnvACE training (rehearsal mode, role-wise GRPO)",
    "baseline": "real-env GRPO baseline (tools executed for real)",
    "sft": "SFT warm-up on reference trajectories",
    "eval": "evaluation against the real tools",
    "sweep": "rehearsal-budget sweep (N x mode)",
    "rollout": "a batch of rollouts, no training",
}
# every suite of ``envace_engine.environments.suite_names()`` (a test checks they agree; the
# studio does not import the engine's environments to list them)
SuiteName = Literal[
    "toy",
    "toy-library",
    "bfcl-gen",
    "bfcl",
    "tau2-airline",
    "tau2-retail",
    "tau2-mock",
    "vita-delivery-zh",
    "vita-delivery-en",
    "vita-instore",
]
SUITES: tuple[str, ...] = get_args(SuiteName)
# suites whose conversations need a simulated user (τ², VitaBench)
USER_SUITES = frozenset(s for s in SUITES if s.startswith(("tau2-", "vita-")))
USER_KINDS = frozenset({"eval"})  # commands that take a simulated user (``--user``)
JUDGED_KINDS = frozenset({"eval", "sweep"})  # commands that take a judge (``--judge``)
MODES = ("parallel", "sequential", "select")
TRAINING = frozenset({"train", "baseline", "sft"})  # their job file names the run folder itself
RESUMABLE = frozenset({"train", "baseline"})  # `envace train --resume RUN_DIR`
# The forms open on the cheapest job, so one click on a hosted demo never starts a CPU-heavy
# one: a rollout batch (no training) of the random tiny model finishes in seconds.
DEFAULT_KIND = "rollout"
DEFAULT_MODEL = TINY
MODEL_CHOICES = (TINY, SMOLLM2)


class FormError(ValueError):
    """The form has bad values; the message lists each one (field: problem)."""


def default(name: str) -> Any:
    """A launch form field's default (``LaunchRequest``, whose rollout defaults come from the
    engine's ``config.ROLLOUT_DEFAULTS``): the pages show these as initial values."""
    return LaunchRequest.model_fields[name].default


def known_model(value: str) -> str:
    """``value`` stripped, if it names a registered model, a checkpoint or an SGLang server."""
    value = value.strip()
    if value in registry() or value.startswith("sglang+http"):
        return value
    if is_local_model(value):
        return value
    raise ValueError(
        f"unknown model {value!r}: use one of {', '.join(registry())}, a checkpoint folder "
        "with config.json, a LoRA adapter folder (BASE+FOLDER), or sglang+http://HOST:PORT"
    )


def limits_note(limits: HostLimits) -> str:
    """Markdown shown beside a launch button: what a job costs, and the host's limits (a
    Space's), so a visitor reads them before the click rather than in a refusal after it."""
    cost = (
        f"`{TINY}` is a small random model for trying the plumbing: its jobs end in seconds; "
        f"`{SMOLLM2}` jobs take minutes on a CPU."
    )
    rules = []
    if limits.max_jobs is not None:
        rules.append(
            "one job at a time" if limits.max_jobs == 1 else f"{limits.max_jobs} jobs at a time"
        )
    if limits.max_model_params is not None:
        rules.append(
            f"models up to {limits.max_model_params / 1e6:.0f} M parameters, run on this "
            "machine's CPU (no remote servers)"
        )
    if not rules:
        return cost
    return f"**Limits on this host:** {'; '.join(rules)}. {cost}"


def clamp_page(page: object, pages: int) -> tuple[int, str]:
    """A requested page number clamped to 1..``pages``, and a message when it was out of range
    or not a number ("" otherwise), so a pager answers page 999 or 0 with a sentence instead of
    an error."""
    pages = max(1, pages)
    try:
        wanted = int(float(str(page).strip()))
    except (ValueError, OverflowError):
        return 1, f"page {page!r} is not a number: showing page 1 of {pages}"
    if wanted < 1:
        return 1, f"pages start at 1 (asked for {wanted}): showing page 1 of {pages}"
    if wanted > pages:
        return pages, f"there are only {pages} page(s) (asked for {wanted}): showing page {pages}"
    return wanted, ""


class LaunchRequest(BaseModel):
    """One job request from the Runs page or the Budget page."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["train", "baseline", "sft", "eval", "sweep", "rollout"]
    model: str = Field(min_length=1)
    suite: SuiteName
    # τ² and VitaBench only: the simulated user's model ("" = replay each task's scripted opening)
    user: str = ""
    # τ² and VitaBench evals and sweeps only: the judge (τ²'s NL assertions; every VitaBench
    # score), an endpoint or a model as for ``user``. "" = those episodes are stored unscored.
    judge: str = ""
    steps: int = Field(default=2, ge=1, le=100_000)
    episodes: int = Field(default=8, ge=1, le=10_000)
    group: int = Field(default=4, ge=1, le=64)
    tasks: int = Field(default=8, ge=1, le=10_000)
    budgets: tuple[int, ...] = (0, 1, 2)
    modes: tuple[Literal["parallel", "sequential", "select"], ...] = ("parallel",)
    # eval/sweep: the schema check before the world role (docs/rehearsal.md, *Checked calls*)
    check_calls: bool = ROLLOUT_DEFAULTS.check_calls
    seed: int = Field(default=0, ge=0)
    max_turns: int = Field(default=ROLLOUT_DEFAULTS.max_turns, ge=1, le=64)
    max_new_tokens: int = Field(default=ROLLOUT_DEFAULTS.max_new_tokens_act, ge=1, le=4096)

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        return known_model(value)

    @field_validator("user")
    @classmethod
    def _known_user(cls, value: str) -> str:
        value = value.strip()
        if not value or value.startswith("openai+http"):  # an OpenAI-compatible endpoint
            return value
        return known_model(value)

    @field_validator("judge")
    @classmethod
    def _known_judge(cls, value: str) -> str:
        value = value.strip()
        if not value or value.startswith(("http://", "https://", "openai+http")):  # an endpoint
            return value
        return known_model(value)

    @field_validator("budgets", mode="before")
    @classmethod
    def _parse_budgets(cls, value: object) -> object:
        if isinstance(value, str):
            parts = [p.strip() for p in value.split(",") if p.strip()]
            if not parts or not all(p.isdigit() for p in parts):
                raise ValueError(
                    f"must be whole numbers separated by commas, like 0,1,2,4 (got {value!r})"
                )
            return tuple(sorted({int(p) for p in parts}))
        return value

    @field_validator("budgets")
    @classmethod
    def _budget_range(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value or max(value) > 64:
            raise ValueError("give between one and a few budgets, each from 0 to 64")
        return value

    @field_validator("modes")
    @classmethod
    def _some_mode(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("pick at least one rehearsal mode (parallel, sequential or select)")
        return value

    def argv(self) -> list[str]:
        """The command line this request runs (``{run_dir}`` is filled in at launch): the
        command of its kind on the job file ``config`` describes."""
        command = {"sft": "sft", "train": "train", "baseline": "train"}.get(self.kind, self.kind)
        tail = [] if self.kind in TRAINING else ["--run-dir", "{run_dir}"]
        return [
            sys.executable,
            "-m",
            "envace_engine.cli",
            command,
            "--config",
            "{run_dir}/config.toml",
            *tail,
        ]

    @model_validator(mode="after")
    def _tau2_needs(self) -> LaunchRequest:
        if self.suite in USER_SUITES and self.kind in TRAINING:
            raise ValueError(
                f"{self.kind} on {self.suite} is not available: training with a simulated user "
                "in the loop is not wired yet; evaluate (eval), sweep or roll out instead"
            )
        if self.user and (self.suite not in USER_SUITES or self.kind not in USER_KINDS):
            raise ValueError(
                f"user: a simulated user takes part only in eval jobs on a tau2 or vita suite "
                f"(got {self.kind} on {self.suite}); clear the user field"
            )
        if self.judge and (self.suite not in USER_SUITES or self.kind not in JUDGED_KINDS):
            raise ValueError(
                f"judge: a judge scores only eval and sweep jobs on a tau2 or vita suite "
                f"(got {self.kind} on {self.suite}); clear the judge field"
            )
        return self

    @model_validator(mode="after")
    def _whole_groups(self) -> LaunchRequest:
        if self.kind == "rollout" and self.episodes % self.group:
            raise ValueError(
                f"episodes ({self.episodes}) must be a multiple of the group size ({self.group})"
            )
        return self

    def config(self, root: Path, run_id: str) -> dict[str, object]:
        """The job file written into the run folder (``envace KIND --config FILE``): a
        ``TrainConfig`` / ``SFTConfig`` (``root`` and ``run_id`` make the job write where the
        studio looks), or the ``EvalSpec`` / ``SweepSpec`` / ``RolloutSpec`` of the job."""
        if self.kind in TRAINING:
            return self._training(root, run_id)
        tokens = {"max_new_tokens_act": self.max_new_tokens}
        common = {"model": self.model, "suite": self.suite, "max_turns": self.max_turns}
        common |= {"seed": self.seed, **tokens}
        if self.kind == "rollout":  # episodes stored as a run, so the inspector shows them
            return {**common, "mode": "rehearsal", "episodes": self.episodes, "group": self.group}
        evaluation = {**common, "max_new_tokens_rehearse": self.max_new_tokens}
        evaluation |= {"n_tasks": self.tasks, "check_calls": self.check_calls}
        evaluation |= {"judge": self.judge} if self.judge else {}
        if self.kind == "sweep":
            budgets = {"budgets": list(self.budgets), "modes": list(self.modes)}
            return {**evaluation, **budgets, "model": [self.model]}
        return {
            **evaluation,
            "repeats": self.episodes,
            **({"user": self.user} if self.user else {}),
        }

    def _training(self, root: Path, run_id: str) -> dict[str, object]:
        rollout = {
            "max_turns": self.max_turns,
            "max_new_tokens_act": self.max_new_tokens,
            "max_new_tokens_rehearse": self.max_new_tokens,
        }
        common = {
            "model": self.model,
            "suite": self.suite,
            "seed": self.seed,
            "root": str(root),
            "run_id": run_id,
            "rollout": rollout,
        }
        if self.kind == "sft":
            return {**common, "max_steps": self.steps, "n_tasks": self.tasks}
        return {
            **common,
            "mode": "real-grpo" if self.kind == "baseline" else "envace",
            "steps": self.steps,
            "tasks_per_step": self.tasks,
            "group_size": self.group,
            "checkpoint_every": 1,
        }


def parse(values: dict[str, object]) -> LaunchRequest:
    """Validate raw form values; raises FormError listing every bad field."""
    try:
        return LaunchRequest(**values)
    except ValidationError as err:
        lines = []
        for problem in err.errors():
            field = ".".join(str(p) for p in problem["loc"]) or "form"
            message = problem["msg"].removeprefix("Value error, ")
            if problem["type"] in ("int_parsing", "int_from_float"):
                message = f"must be a whole number (got {problem['input']!r})"
            lines.append(f"{field}: {message}")
        raise FormError("\n".join(lines)) from None
