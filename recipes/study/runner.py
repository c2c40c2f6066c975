"""``run_study``: train every arm, evaluate every checkpoint, write the report — resumably.

Order: the held-out evaluation of ``sft``; then the arms one after another (in the config's
order, arms retrained because their checkpoint was lost last: ``arm_order``, with ``base`` and
the retired runs evaluated before the first of those), each followed by the evaluation of its
last checkpoint (each arm an ``envace train`` run with a checkpoint every step,
so a kill loses at most the step in flight and a resumed arm repeats none: the step is redone from
the same checkpoint, seeds and task position, and its stored output is replaced whole); then
``base`` and the earlier runs of redone arms named in ``eval.retired``; then the report. Each arm's
results are complete before the next arm starts, so a study stopped part-way already answers the
claims about the arms it has finished. ``study.json`` (``state``) records each finished unit the
moment it finishes, and the process hands freed memory back to the system after each one.

An arm that diverges — a NaN loss, or no row with a non-zero advantage in any step (no reward
variance anywhere: nothing to learn) — is marked failed with that reason; the others go on and
the report shows it. A programmer error still raises.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import math
import platform
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol, TypeVar

from envace_engine import adapters
from envace_engine.config import EVAL_BATCH_SIZE, EVAL_CACHE_TOKENS, PROMPT_FILE
from envace_engine.environments import get_suite
from envace_engine.models import load_model, load_tokenizer, resolve
from envace_engine.rollout.loop import RolloutConfig
from envace_engine.rollout.rewards import state_reward
from envace_engine.samplers import make_sampler
from envace_engine.samplers.embedded.heap import release_freed_memory
from envace_engine.sink import Sink
from envace_engine.training.checkpoint import latest
from envace_engine.types import Episode
from recipes.study.config import StudyConfig
from recipes.study.evaluation import (
    EvalPlan,
    Policy,
    evaluate_fidelity,
    evaluate_settings,
    make_rehearser,
    plan_settings,
)
from recipes.study.report import build_report, write_report
from recipes.study.state import ArmState, CheckpointEval, HeldEval, StudyState

# Step metrics an arm's curves keep (the report plots them; the arm's run has all of them).
CURVE_METRICS = (
    "reward/mean",
    "success/real",
    "fidelity/exact",
    "fidelity/status_agree",
    "adv/act/nonzero",
    "adv/rehearse/nonzero",
    "optim/rows_forward",
    "loss",
    "perf/step_s",
    "perf/rollout_s",
    "perf/train_s",
    "rollout/logprob_diff",
    "rollout/mismatch_kl",
    "heldout/success",
    "heldout/rehearsed_success",
    "heldout/gap",
    "heldout/fidelity_exact",
    "heldout/status_agree",
    "heldout/real_nll",
    "collusion/echo_rate",
    "collusion/error_recall",
    "collusion/errors_as_success",
    "collusion/wrong_answer_taken",
    "world/f_mean",
)


Arm = TypeVar("Arm", bound=str)  # an arm name (config.ArmName in a study)


class RunSinks(Protocol):
    """Where the study's runs live (the CLI backs it with ``storage``'s run writers)."""

    def path(self, run_id: str) -> Path:
        """The folder of run ``run_id`` (it may not exist yet)."""
        ...

    def open(
        self, run_id: str, kind: str, model: str, config: Mapping[str, Any]
    ) -> AbstractContextManager[Sink]:
        """A sink writing run ``run_id`` (created, or reopened to continue it)."""
        ...


class StartChanged(ValueError):
    """The starting checkpoint is not the one the study started from."""


class ArmDiverged(RuntimeError):
    """An arm's training produced a NaN loss; the message says at which step."""


class CurveSink:
    """Forwards everything to the arm's run and keeps its curve points in the study state."""

    def __init__(self, inner: Sink, state: StudyState, arm: str, save: Callable[[], None]):
        self.inner, self.state, self.arm, self.save = inner, state, arm, save
        self.clock = time.perf_counter()  # the arm's seconds are banked at every save

    def bank_time(self) -> None:
        """Add the time since the last call to the arm's ``seconds`` (a process killed
        mid-arm then loses at most one step's worth)."""
        now = time.perf_counter()
        self.state.arms[self.arm].seconds += now - self.clock
        self.clock = now

    def episodes(self, step: int, episodes: Sequence[Episode]) -> None:
        """Forward a step's episodes."""
        self.inner.episodes(step, episodes)

    def metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Forward, record the curve metrics, and stop the arm on a NaN loss."""
        self.inner.metrics(step, metrics)
        point = {k: float(metrics[k]) for k in CURVE_METRICS if k in metrics}
        curve = self.state.curves.setdefault(self.arm, {})
        curve[str(step)] = {**curve.get(str(step), {}), **point}
        arm = self.state.arms[self.arm]
        if "loss" in metrics:
            arm.steps_done = max(arm.steps_done, step + 1)
        self.bank_time()
        self.save()
        if "loss" in metrics and not math.isfinite(float(metrics["loss"])):
            raise ArmDiverged(f"loss is {metrics['loss']} at step {step}")

    def progress(self, done: int, total: int, message: str = "") -> None:
        """Forward progress."""
        self.inner.progress(done, total, message)


def redo_arms(
    config: StudyConfig, study_dir: Path, arms: Sequence[str], log: Callable[[str], None]
) -> None:
    """Mark ``arms`` of the study in ``study_dir`` to train again from the start in new runs
    (``StudyState.redo``) and save that, before the study continues. A name that is not one
    of the study's arms, or an arm that never ran, is a ``ValueError`` and changes nothing."""
    unknown = [a for a in arms if a not in config.arms]
    if unknown:
        raise ValueError(
            f"{', '.join(unknown)}: not an arm of this study (its arms: {', '.join(config.arms)})"
        )
    state = StudyState.load(study_dir) or StudyState(Path(study_dir).name)
    for arm in arms:
        fresh = state.redo(arm)
        log(f"arm {arm}: redone in run {fresh.run_id} (kept: {', '.join(fresh.retired)})")
    state.save(study_dir)


def run_study(
    config: StudyConfig,
    study_dir: Path,
    sinks: RunSinks,
    log: Callable[[str], None],
    units: int | None = None,
) -> StudyState:
    """Run (or continue) the study stored in ``study_dir``; return its state.

    ``units`` stops it after that many units (an arm's training, a checkpoint's evaluation)
    that changed the study's state, with ``status`` still ``running``: the CLI continues in a
    fresh process after each unit (``envace study``'s module docstring says why); ``None`` runs
    everything in this process."""
    worked = 0
    state = StudyState(Path(study_dir).name)
    for state, changed in study_units(config, study_dir, sinks, log):
        worked += changed
        if units is not None and worked >= units and state.status != "done":
            break
    return state


def study_units(
    config: StudyConfig, study_dir: Path, sinks: RunSinks, log: Callable[[str], None]
) -> Iterator[tuple[StudyState, bool]]:
    """The study, one unit at a time: after each unit the state (saved) and whether the unit
    changed it (False for a unit already finished in an earlier process)."""
    state = open_state(config, study_dir)

    def save() -> None:
        state.save(study_dir)

    def publish() -> None:  # a unit finished: the studio's report follows
        save()
        write_report(build_report(config, state), study_dir)

    save()
    plan = make_plan(config)

    def evaluated(name_model: tuple[str, str]) -> bool:
        changed = evaluate_checkpoint(config, state, plan, name_model, sinks, save, log)
        if changed:
            publish()
        return changed

    yield state, evaluated(("sft", config.model))
    order = arm_order(state, config.arms, len(plan.settings))
    first_retrained = next(
        (arm for arm in order if lost_mid_evaluation(state, arm, len(plan.settings))), None
    )
    for arm in order:
        if arm == first_retrained:  # new results before repeated training: base, retired runs
            for name_model in untrained_checkpoints(config, state, sinks):
                yield state, evaluated(name_model)
        reopen_lost_arm(state, arm, len(plan.settings), log)
        trained = train_arm(config, arm, state, sinks, save, log, keep=Path(study_dir) / KEPT)
        keep_verified_eval(state, arm, log)
        publish()
        release_memory()
        yield state, trained
        if state.arms[arm].checkpoint:
            yield state, evaluated((arm, state.arms[arm].checkpoint))
    for name_model in checkpoints(config, state, sinks):  # base, retired, added settings
        yield state, evaluated(name_model)
    state.status = "done"
    publish()
    yield state, True


def open_state(config: StudyConfig, study_dir: Path) -> StudyState:
    """The study's saved state (a new one the first time), checked against ``config`` and
    with a record for every arm: what every way of running the study starts from."""

    resolve(config.model)  # a missing SFT checkpoint fails here, naming the path
    study_id = Path(study_dir).name
    state = StudyState.load(study_dir) or StudyState(study_id)
    check_start(config.model, state)
    if state.status == "paused":  # ``pause``: it goes on now
        state.status = "running"
    for arm in config.arms:
        state.arms.setdefault(arm, ArmState(run_id=f"{study_id}--{arm}"))
    relocate_kept(state, Path(study_dir))
    check_retired(config, state)  # before any arm trains: a typo fails now, not hours later
    return state


def pause(config: StudyConfig, study_dir: Path) -> StudyState:
    """Record an unfinished study as ``paused`` between units (``envace study --units``), in
    its state and its report; the next run of it (``open_state``) makes it ``running`` again."""
    state = StudyState.load(study_dir) or StudyState(Path(study_dir).name)
    if state.status != "done":
        state.status = "paused"
        state.save(study_dir)
        write_report(build_report(config, state), study_dir)
    return state


def relocate_kept(state: StudyState, study_dir: Path) -> None:
    """Point each finished arm whose recorded checkpoint is not here (a study folder copied
    from another machine or clone) at the adapter the study kept for it, when that adapter's
    digest is the recorded one; any other arm is left to ``lost_mid_evaluation``."""
    for arm, record in state.arms.items():
        kept = study_dir / KEPT / arm
        if not record.checkpoint or Path(record.checkpoint).is_dir() or not kept.is_dir():
            continue
        if record.digest and digest(str(kept)) == record.digest:
            record.checkpoint = str(kept)


def digest(model: str) -> str:
    """sha256 over a local checkpoint's weight files (name and bytes, in name order); ``""``
    for a registry model (its weights come from an installed package)."""

    folder = Path(model)
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        with f.open("rb") as stream:
            while chunk := stream.read(1 << 24):
                h.update(chunk)
    return h.hexdigest() if files else ""


def check_start(model: str, state: StudyState) -> None:
    """Record the starting checkpoint's digest, or check it against the recorded one: arms
    that start later (a resumed study, one whose data folder was restored from a copy without
    checkpoints and whose SFT checkpoint was rebuilt) must start where the first ones did."""
    found = digest(model)
    if state.start_digest and not found and not Path(model).exists():
        raise StartChanged(
            f"{model}: no checkpoint there, and this study started from one (sha256 "
            f"{state.start_digest[:12]}); if it moved (a study folder copied from an older "
            "clone), resume with --set model=ITS_NEW_PATH: its weights are checked against "
            "that digest"
        )
    if state.start_digest and found != state.start_digest:
        raise StartChanged(
            f"{model}: its weights (sha256 {found[:12] or 'none'}) are not the checkpoint this "
            f"study started from ({state.start_digest[:12]}); rebuild that one (the SFT recipe "
            "is deterministic on one machine type) or start a new study with --config"
        )
    state.start_digest = found


def forget_lost_steps(
    state: StudyState, arm: str, has_checkpoint: bool, log: Callable[[str], None]
) -> None:
    """An arm recorded as part-trained whose run has no checkpoint (its data folder was lost,
    the study restored from a copy of ``study.json``) starts again from step 0: its partial
    curve and banked time go, so the new run's steps are neither mixed with nor added to them."""
    record = state.arms[arm]
    if record.steps_done and not has_checkpoint:
        log(f"arm {arm}: no checkpoint for its {record.steps_done} steps; it starts again")
        record.steps_done, record.seconds = 0, 0.0
        state.curves.pop(arm, None)


def lost_mid_evaluation(state: StudyState, arm: str, n_settings: int) -> bool:
    """Whether ``arm`` is done but must train again: its last checkpoint is gone and its
    evaluation (``n_settings`` settings and the world evaluation) is unfinished."""
    record, evaluated = state.arms[arm], state.evals.get(arm)
    complete = evaluated is not None and evaluated.complete(n_settings)
    return record.status == "done" and not Path(record.checkpoint).is_dir() and not complete


def arm_order(state: StudyState, arms: Sequence[Arm], n_settings: int) -> list[Arm]:
    """The order the arms run in: ``arms``' order, but arms that train again only because
    their checkpoint was lost (``lost_mid_evaluation``) go after the others. A study restored
    elsewhere then first produces results it has none of; retraining an arm it has partial
    results for (about an hour on the 2-core machine) comes last, so a session that ends
    part-way has added an arm rather than repeated one."""
    return sorted(arms, key=lambda a: lost_mid_evaluation(state, a, n_settings))  # stable


def reopen_lost_arm(
    state: StudyState, arm: str, n_settings: int, log: Callable[[str], None]
) -> HeldEval | None:
    """A finished arm whose last checkpoint is gone (the study restored from a copy of
    ``study.json`` elsewhere) while its evaluation is unfinished trains again from step 0 — the
    evaluation needs the weights. Its curve and time restart with it; its partial evaluation is
    set aside in ``state.held`` (saved with the state, so a kill while the arm retrains keeps
    it) and returned, to be put back only if the retrained weights are the same
    (``keep_verified_eval``)."""
    if not lost_mid_evaluation(state, arm, n_settings):
        return None
    record = state.arms[arm]
    log(f"arm {arm}: its checkpoint {record.checkpoint} is gone; it trains again")
    state.arms[arm] = ArmState(run_id=record.run_id, retired=record.retired)
    state.curves.pop(arm, None)
    evaluated = state.evals.pop(arm, None)
    if evaluated is not None:
        state.held[arm] = HeldEval(record.digest, evaluated)
    return state.held.get(arm)


def keep_verified_eval(state: StudyState, arm: str, log: Callable[[str], None]) -> None:
    """Once ``arm`` has finished training, put back the partial evaluation ``reopen_lost_arm``
    set aside when the retrained last checkpoint has the weights it was measured on (one machine
    type trains the same weights); otherwise drop it and every setting is evaluated on the new
    weights."""
    record = state.arms[arm]
    if record.status != "done" or arm not in state.held:
        return  # still training, or failed: a failed arm keeps it set aside (nothing is lost)
    held = state.held.pop(arm)
    if held.digest and held.digest == record.digest:
        held.evaluation.model = record.checkpoint
        state.evals[arm] = held.evaluation
        kept = len(held.evaluation.settings)
        log(f"arm {arm}: retrained to the same weights; {kept} settings kept")
    else:
        log(f"arm {arm}: retrained weights differ or were not recorded; evaluated afresh")


@dataclasses.dataclass
class StartProbe:
    """The arms' step-0 probe, run by the first arm and kept in ``study.json``: every arm
    starts from the same checkpoint with the same seed and probe settings, so it is the same
    probe (``training.probe.ProbeMemo``; the key says when it is not)."""

    state: StudyState
    save: Callable[[], None]

    def recall(self, key: str) -> dict[str, float] | None:
        """The kept metrics when they were measured under ``key``."""
        kept = self.state.start_probe
        return dict(kept["metrics"]) if kept.get("key") == key else None

    def remember(self, key: str, metrics: Mapping[str, float]) -> None:
        """Keep ``metrics`` (saved at once: a killed arm's successor reuses them)."""
        self.state.start_probe = {"key": key, "metrics": dict(metrics)}
        self.save()


def train_arm(
    config: StudyConfig,
    arm: str,
    state: StudyState,
    sinks: RunSinks,
    save: Callable[[], None],
    log: Callable[[str], None],
    keep: Path | None = None,
) -> bool:
    """Train one arm to its last step (resuming its run), unless it is done or failed (then
    return False: nothing changed). ``keep``: where a finished LoRA arm's adapter is kept
    (``keep_adapter``)."""
    from envace_engine.training.trainer import train

    record = state.arms[arm]
    if record.status in ("done", "failed"):
        return False
    cfg = config.arm_config(arm, record.run_id)
    run_dir = sinks.path(record.run_id)
    forget_lost_steps(state, arm, latest(run_dir) is not None, log)
    record.status = "running"
    save()
    log(f"arm {arm}: training {cfg.steps} steps (run {record.run_id})")
    curves = None
    try:
        with sinks.open(record.run_id, "train", cfg.model, cfg.model_dump(mode="json")) as sink:
            curves = CurveSink(sink, state, arm, save)
            train(cfg, run_dir, curves, resume=True, memo=StartProbe(state, save))
    except ArmDiverged as err:
        record.status, record.reason = "failed", f"diverged: {err}"
    finally:
        if curves is not None:
            curves.bank_time()
    if record.status == "running":
        trained = sum(p.get("optim/rows_forward", 0.0) for p in state.curves.get(arm, {}).values())
        found = latest(run_dir)
        if trained == 0 and config.train.require_signal:
            record.status = "failed"
            record.reason = "no reward variance: no group of any step had a non-zero advantage"
        elif found is None:
            record.status, record.reason = "failed", f"no checkpoint in {run_dir}"
        else:
            kept = keep_adapter(found, keep / arm) if keep is not None else found
            record.status, record.checkpoint = "done", str(kept)
            record.digest, record.machine = digest(str(kept)), machine()
    save()
    log(f"arm {arm}: {record.status} {record.reason}".rstrip())
    return True


KEPT = "adapters"  # <study>/adapters/<arm>: finished LoRA arms, small enough to commit
KEPT_FILES = (adapters.ADAPTER_CONFIG, adapters.ADAPTER_WEIGHTS, PROMPT_FILE)


def machine() -> str:
    """The CPU type a unit runs on: its model name and its bf16 unit (or fp32 only)."""
    from envace_engine.samplers.embedded.packed import cpu_bf16

    name = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as info:
        name = next((x.partition(":")[2].strip() for x in info if x.startswith("model name")), name)
    return f"{name} ({cpu_bf16() or 'no bf16 unit: fp32'})"


def keep_adapter(checkpoint: Path, dest: Path) -> Path:
    """A finished arm's model as the study keeps it: a LoRA adapter is copied into ``dest``
    in the study folder (adapter, config, prompt record: a few MB, no optimizer state), so
    ``study.json`` and ``<study>/adapters/`` committed together let ``--resume`` continue on
    any machine, without the run's checkpoints; full weights stay where they are."""
    if not adapters.is_adapter_dir(checkpoint):
        return checkpoint
    tmp = dest.with_name(f".{dest.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in KEPT_FILES:
        if (checkpoint / name).is_file():
            shutil.copy2(checkpoint / name, tmp / name)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


def checkpoints(config: StudyConfig, state: StudyState, sinks: RunSinks) -> list[tuple[str, str]]:
    """(name, model) of every checkpoint to evaluate: base, sft, each finished arm, then the
    last checkpoint of each earlier run named in ``eval.retired`` (``<arm>-rK``: the K-th run
    of that arm)."""

    check_retired(config, state)
    out = [("base", config.base_model)] if config.eval.base else []
    out.append(("sft", config.model))
    out += [(arm, state.arms[arm].checkpoint) for arm in config.arms if state.arms[arm].checkpoint]
    for arm in config.arms:
        for k, run_id in enumerate(state.arms[arm].retired, start=1):
            found = latest(sinks.path(run_id)) if run_id in config.eval.retired else None
            if found is not None:
                out.append((f"{arm}-r{k}", str(found)))
    return out


def untrained_checkpoints(
    config: StudyConfig, state: StudyState, sinks: RunSinks
) -> list[tuple[str, str]]:
    """The checkpoints of ``checkpoints`` that no arm of this study trains: ``base`` and the
    retired runs."""
    trained = ("sft", *config.arms)
    return [item for item in checkpoints(config, state, sinks) if item[0] not in trained]


def check_retired(config: StudyConfig, state: StudyState) -> None:
    """Every run in ``eval.retired`` must be an earlier run of one of the study's arms."""
    known = [run for arm in config.arms for run in state.arms[arm].retired]
    unknown = [run for run in config.eval.retired if run not in known]
    if unknown:
        raise ValueError(
            f"eval.retired names {', '.join(unknown)}: not an earlier run of an arm of this "
            f"study (its earlier runs: {', '.join(known) or 'none'})"
        )


def evaluate_checkpoint(
    config: StudyConfig,
    state: StudyState,
    plan: EvalPlan,
    name_model: tuple[str, str],
    sinks: RunSinks,
    save: Callable[[], None],
    log: Callable[[str], None],
) -> bool:
    """Evaluate one checkpoint at the settings it lacks, then in its rehearsed world; False
    when it had everything already."""
    name, model = name_model
    suffix = _redo_suffix(state, name)
    record = state.evals.setdefault(
        name, CheckpointEval(model, f"{state.study_id}--eval-{name}{suffix}")
    )
    if record.complete(len(plan.settings)):
        return False
    log(f"eval {name}: {model}")
    if machine() not in record.machines:
        record.machines.append(machine())
    policy = load_policy(name, model, config)
    here = plan
    if name == "base":
        rollout = dataclasses.replace(plan.rollout, n_examples=config.eval.base_examples)
        here = dataclasses.replace(plan, rollout=rollout)
    meta = {"study": state.study_id, "checkpoint": name}

    def keep(result: Any) -> None:
        record.settings[result.label] = result
        save()
        release_memory()  # the kept heap of one setting must not add to the next's peak

    rehearser = make_rehearser(policy, here)  # settings and world share their imagination
    with sinks.open(record.run_id, "sweep", model, meta) as sink:
        evaluate_settings(policy, here, rehearser, sink, list(record.settings), keep)
    if record.fidelity is None:
        record.fidelity_run_id = f"{state.study_id}--fidelity-{name}{suffix}"
        with sinks.open(record.fidelity_run_id, "eval", model, meta) as sink:
            record.fidelity = evaluate_fidelity(policy, here, rehearser, sink)
    del policy, rehearser
    release_memory()
    return True


def release_memory() -> None:
    """Collect garbage and return the allocator's free pages to the system (glibc
    ``malloc_trim``), after every unit and every evaluation setting. A study trains and
    evaluates several checkpoints in one process: one that had trained two arms was stopped by
    the kernel's OOM killer at 24 GB resident in an evaluation that a fresh process ran at ~17 GB
    peak, and a fresh study's first evaluation was killed at 24.3 GB in its fifth setting when
    memory was returned only after each unit."""

    gc.collect()
    release_freed_memory()


def _redo_suffix(state: StudyState, name: str) -> str:
    """``-rN`` for a redone arm (its evaluation runs are new runs too), else ``""``."""
    arm = state.arms.get(name)
    return arm.run_id.removeprefix(f"{state.study_id}--{name}") if arm is not None else ""


def make_plan(config: StudyConfig) -> EvalPlan:
    """The held-out tasks, settings and rollout settings every checkpoint is evaluated with."""
    e = config.eval
    suite = get_suite(config.suite)
    filtered = [
        t
        for t in suite.tasks(e.split)
        if all(str(t.meta.get(k)) == v for k, v in config.train.task_filter.items())
    ]
    if not filtered:
        raise ValueError(f"no {config.suite}/{e.split} task matches the study's task_filter")
    rollout = config.arm_config("envace", "plan").rollout.episode_settings()
    rollout["temperature"] = e.temperature
    return EvalPlan(
        suite=suite,
        tasks=tuple(filtered[: e.n_tasks]),
        pool=tuple(suite.tasks(config.train.split)),
        settings=plan_settings(e.budgets, e.modes, e.select_budgets),
        rollout=RolloutConfig(**rollout),
        repeats=e.repeats,
        memory_tokens=e.memory_tokens,
        success=state_reward(suite),
        seed=config.seed,
    )


def load_policy(name: str, model: str, config: StudyConfig) -> Policy:
    """A checkpoint's sampler, tokenizer and (local checkpoints) transformers model."""
    from envace_engine.training.precision import bf16_autocast

    spec = resolve(model)
    tokenizer = load_tokenizer(spec)
    if spec.kind != "hf":
        return Policy(name, make_sampler(spec, tokenizer=tokenizer), tokenizer, None)
    hf = load_model(spec)
    dtype = config.train.rollout.sampler_dtype  # evaluations sample as the arms did
    sampler = make_sampler(
        spec,
        model=hf,
        tokenizer=tokenizer,
        batch_size=EVAL_BATCH_SIZE,
        dtype=dtype,
        prefix_cache_tokens=EVAL_CACHE_TOKENS,
        call_cache_tokens=EVAL_CACHE_TOKENS,
    )
    # The real NLL is scored in the precision the arms' probes score it in.
    return Policy(name, sampler, tokenizer, hf, bf16_autocast(config.train.bf16, hf.device))
