"""Lanes: a study's units run several at a time, each lane a process on its share of the cores.

Why. A small model's step on a CPU is partly serial — Python bookkeeping, small and
memory-bound operations — so one process rarely keeps every core busy, and two units side by
side, one thread each, can do more work per second than one unit with both threads
(measured by ``bench/lanes.py``; results in ``bench/results/``). With
``StudyConfig.lanes = L`` the study runs L lane processes, each with ``cores // L`` threads.

How. The units are those of ``runner.study_units``: each arm's training, each checkpoint's
evaluation (``lane_units``: trainings first; an arm's evaluation waits for its training). A
lane claims the first unfinished, unclaimed unit in that order (``claim``: its pid recorded in
``study.json``'s ``claims``, under the study's lock), runs it with the same functions as the
sequential study, and writes only what it owns (``state.merge_save``); then it continues in a
fresh program image, as the sequential study does. The supervisor (``envace study``) starts
the lanes, banks the study's wall time, gives a lane that crashed one restart, and marks the
study done when every unit is. Lanes die with the supervisor (``PR_SET_PDEATHSIG``), so a
``kill -9`` of it stops the whole study; ``--resume`` then clears the dead lanes' claims, and
each arm resumes from its newest checkpoint as before.

A unit's results do not depend on the lane that ran it: every unit runs in its own process
with the same seeds, and threads per lane are fixed by ``lanes`` and the cores. They can
differ from a sequential study's where the thread count changes the float rounding.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from recipes.study.config import StudyConfig
from recipes.study.evaluation import plan_settings
from recipes.study.report import build_report, write_report
from recipes.study.runner import (
    KEPT,
    RunSinks,
    evaluate_checkpoint,
    lost_mid_evaluation,
    make_plan,
    open_state,
    train_arm,
    untrained_checkpoints,
)
from recipes.study.state import Owned, StudyState, locked, merge_save

POLL_S = 5.0  # how often a waiting lane looks for work, and the supervisor for exits
BANK_S = 15.0  # how often the supervisor adds the elapsed wall time to ``study.json``
PR_SET_PDEATHSIG = 1  # prctl option (linux/prctl.h)


class LanesError(RuntimeError):
    """The study cannot run in lanes as it stands; the message says why and what to do."""


@dataclass(frozen=True)
class Unit:
    """One unit: an arm's training (``kind = "train"``) or a checkpoint's evaluation."""

    kind: str
    name: str  # the arm, or the checkpoint ("sft", "base", an arm, "<arm>-rK")
    model: str = ""  # the evaluated checkpoint; an arm's is known once it has trained

    @property
    def key(self) -> str:
        """``"train:envace"``, ``"eval:sft"``: the unit's name in ``StudyState.claims``."""
        return f"{self.kind}:{self.name}"


def lane_units(config: StudyConfig, state: StudyState, sinks: RunSinks) -> list[Unit]:
    """Every unit, in the order lanes take them: every arm's training, then the evaluations
    (sft, each arm's, then base). Trainings are the long units and each one's evaluation must
    wait for it; started first, they end while evaluations are left to share the lanes, instead
    of the last arm's training and then its evaluation running alone beside an idle lane."""
    units = [Unit("train", arm) for arm in config.arms]
    units.append(Unit("eval", "sft", config.model))
    units += [Unit("eval", arm, state.arms[arm].checkpoint) for arm in config.arms]
    units += [Unit("eval", n, m) for n, m in untrained_checkpoints(config, state, sinks)]
    return units


def finished(unit: Unit, state: StudyState, n_settings: int) -> bool:
    """Whether ``unit`` has nothing left to do (a failed arm has no evaluation)."""
    if unit.kind == "train":
        return state.arms[unit.name].status in ("done", "failed")
    if unit.name in state.arms and state.arms[unit.name].status == "failed":
        return True
    record = state.evals.get(unit.name)
    return record is not None and record.complete(n_settings)


def n_settings(config: StudyConfig) -> int:
    """How many test-time settings each checkpoint is evaluated at (``make_plan``'s, without
    loading the tasks)."""
    e = config.eval
    return len(plan_settings(e.budgets, e.modes, e.select_budgets))


def blocked(unit: Unit, state: StudyState) -> bool:
    """An arm's evaluation before the arm has trained."""
    return unit.kind == "eval" and unit.name in state.arms and not unit.model


def prepare(config: StudyConfig, study_dir: Path, log: Callable[[str], None]) -> StudyState:
    """The supervisor's start: the state set up as the sequential study sets it up, and the
    claims of lanes no longer running cleared. A lane of an earlier supervisor still alive, or
    an arm that must train again because its checkpoint was lost, is a ``LanesError``."""
    with locked(study_dir):
        state = open_state(config, study_dir)
        running = {key: pid for key, pid in state.claims.items() if alive(pid)}
        if running:
            raise LanesError(
                f"lane processes of an earlier run of this study still run ({running}): "
                "stop them (kill PID) before resuming"
            )
        lost = [a for a in config.arms if lost_mid_evaluation(state, a, n_settings(config))]
        if lost:
            raise LanesError(
                f"arms {', '.join(lost)} must train again (their checkpoints are gone): "
                "resume with --set lanes=1, which retrains them in order"
            )
        for key in state.claims:
            log(f"lanes: {key} was cut off; it continues from its last record")
        state.claims = {}
        state.status = "running"
        state.save(study_dir)
    return state


def claim(
    config: StudyConfig, study_dir: Path, sinks: RunSinks, pid: int
) -> tuple[Unit | None, bool]:
    """Claim the next unit for lane ``pid``: (the unit, False), or (None, whether a unit
    waits on another lane's training)."""
    count = n_settings(config)
    with locked(study_dir):
        state = _load(study_dir)
        waiting = False
        for unit in lane_units(config, state, sinks):
            if finished(unit, state, count) or unit.key in state.claims:
                continue
            if blocked(unit, state):
                waiting = True
                continue
            state.claims[unit.key] = pid
            state.save(study_dir)
            return unit, False
    return None, waiting


def run_unit(
    config: StudyConfig,
    study_dir: Path,
    sinks: RunSinks,
    unit: Unit,
    log: Callable[[str], None],
) -> None:
    """Run a claimed unit, writing only its own parts of the state; then release it."""
    state = _load(study_dir)
    if unit.kind == "train":
        owned = Owned(arms=frozenset({unit.name}))
    else:
        owned = Owned(evals=frozenset({unit.name}))

    def save() -> None:
        merge_save(state, study_dir, owned)

    try:
        if unit.kind == "train":
            train_arm(config, unit.name, state, sinks, save, log, keep=study_dir / KEPT)
        else:
            plan = make_plan(config)  # a claimed evaluation knows its checkpoint (``blocked``)
            evaluate_checkpoint(config, state, plan, (unit.name, unit.model), sinks, save, log)
        save()
        write_report(build_report(config, state), study_dir)
    finally:
        release(study_dir, os.getpid())


def release(study_dir: Path, pid: int) -> None:
    """Drop every claim of lane ``pid``."""
    with locked(study_dir):
        state = _load(study_dir)
        state.claims = {k: v for k, v in state.claims.items() if v != pid}
        state.save(study_dir)


def supervise(
    config: StudyConfig,
    study_dir: Path,
    lane_argv: Sequence[str],
    log: Callable[[str], None],
    sinks: RunSinks,
    progress: Callable[[int, int, str], None] = lambda done, total, message: None,
) -> StudyState:
    """Run the study in ``config.lanes`` lane processes (``lane_argv``: the command of one
    lane) until every unit is finished; return the final state. ``progress(done, total,
    message)`` hears the finished units as the wall time is banked. A lane that exits with an
    error is started again once; if the units are still unfinished when every lane has
    stopped, a ``LanesError`` names them."""
    prepare(config, study_dir, log)
    threads = lane_threads(config.lanes)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    log(f"lanes: {config.lanes} processes of {threads} thread(s) each")
    lanes = {_spawn(lane_argv, env): 0 for _ in range(config.lanes)}
    banked = time.monotonic()
    while lanes:
        time.sleep(POLL_S)
        for proc in [p for p in lanes if p.poll() is not None]:
            restarts = lanes.pop(proc)
            release(study_dir, proc.pid)
            if proc.returncode != 0 and restarts == 0:
                log(f"lanes: lane {proc.pid} exited with {proc.returncode}; starting another")
                lanes[_spawn(lane_argv, env)] = 1
            elif proc.returncode != 0:
                log(f"lanes: lane {proc.pid} exited with {proc.returncode} again; not restarted")
        if time.monotonic() - banked >= BANK_S or not lanes:
            banked, state = _bank(study_dir, banked)
            count = n_settings(config)
            units = lane_units(config, state, sinks)
            done = sum(finished(u, state, count) for u in units)
            running = ", ".join(sorted(state.claims)) or "none"
            progress(done, len(units), f"{done}/{len(units)} units done; running: {running}")
    return finish(config, study_dir, sinks)


def lane_threads(lanes: int) -> int:
    """Threads per lane: ``OMP_NUM_THREADS`` when it is set (the user's choice), else the
    cores this process may use divided among the lanes."""
    chosen = os.environ.get("OMP_NUM_THREADS", "")
    if chosen.isdigit() and int(chosen) > 0:
        return int(chosen)
    return max(1, len(os.sched_getaffinity(0)) // lanes)


def finish(config: StudyConfig, study_dir: Path, sinks: RunSinks) -> StudyState:
    """Mark the study done and write its report, or raise naming the unfinished units."""
    count = n_settings(config)
    with locked(study_dir):
        state = _load(study_dir)
        left = [u.key for u in lane_units(config, state, sinks) if not finished(u, state, count)]
        if left:
            raise LanesError(f"the lanes stopped with units unfinished: {', '.join(left)}")
        state.status = "done"
        state.save(study_dir)
    write_report(build_report(config, state), study_dir)
    return state


def _bank(study_dir: Path, since: float) -> tuple[float, StudyState]:
    """Add the wall time since ``since`` to the study's ``wall_s``; return the new mark and
    the state."""
    now = time.monotonic()
    with locked(study_dir):
        state = _load(study_dir)
        state.wall_s += now - since
        state.save(study_dir)
    return now, state


def _spawn(argv: Sequence[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start one lane, set to be killed when this process dies."""
    return subprocess.Popen(list(argv), env=env, preexec_fn=_die_with_parent)


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        pass
    return True


def _load(study_dir: Path) -> StudyState:
    state = StudyState.load(study_dir)
    if state is None:
        raise LanesError(f"{study_dir}: no study.json (start the study with --config)")
    return state


def lane_main(
    config: StudyConfig,
    study_dir: Path,
    sinks: RunSinks,
    log: Callable[[str], None],
    fresh: Callable[[], object],
) -> None:
    """One lane: claim and run a unit, then ``fresh()`` (a new program image that starts
    here again); wait while the only units left wait on other lanes; return when none is
    left for it."""
    while True:
        unit, waiting = claim(config, study_dir, sinks, os.getpid())
        if unit is not None:
            run_unit(config, study_dir, sinks, unit, log)
            sys.stdout.flush()
            fresh()
            return
        if not waiting:
            return
        time.sleep(POLL_S)
