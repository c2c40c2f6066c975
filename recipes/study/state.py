"""What a study has done so far, kept as ``study.json`` in its run folder (atomic rewrites).

A study is resumable because every finished unit is recorded here the moment it finishes: an
arm's status and last checkpoint; each curve point an arm's steps produced; each evaluated
(checkpoint, setting) with its per-task results; each checkpoint's fidelity evaluation. A
killed study reads this file back and skips what is recorded (an arm itself resumes from its
newest checkpoint, saved every step). The file is plain JSON, so the studio and
``envace study report`` read it without running anything.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STATE_FILE = "study.json"
LOCK_FILE = ".study.lock"
ARM_STATUSES = ("pending", "running", "done", "failed")


@dataclass
class ArmState:
    """One arm: its train run, how far it got, and why it failed (if it did)."""

    run_id: str
    status: str = "pending"
    steps_done: int = 0
    checkpoint: str = ""  # the model dir of its last checkpoint, once done
    digest: str = ""  # sha256 of that checkpoint's weights (``runner.digest``), once done
    reason: str = ""
    seconds: float = 0.0  # wall time spent training it (all sessions together)
    retired: list[str] = field(default_factory=list)  # earlier runs of this arm (``redo``)
    machine: str = ""  # the CPU type it finished training on (``runner.machine``)


@dataclass
class SettingResult:
    """One checkpoint at one test-time setting: per-task success rates and costs."""

    label: str  # "plain N=0", "parallel N=2", ...
    budget: int
    mode: str  # "none" | "parallel" | "sequential" | "select"
    success: dict[str, float]  # task id -> successes / repeats
    reward: float
    real_calls: float
    act_tokens: float
    rehearsal_tokens: float
    memory_tokens: float
    wall_s: float
    invalid_calls: float | None = None  # per committed episode; None in studies run before it


@dataclass
class FidelityResult:
    """One checkpoint in its own rehearsed world: per-task success there, and pair fidelity."""

    rehearsed_success: dict[str, float]  # task id -> successes / repeats (rehearsal mode)
    pairs: int
    exact: float | None
    status_agree: float | None
    score: float | None
    real_nll: float | None
    wall_s: float
    exact_by_task: dict[str, float] = field(default_factory=dict)  # tasks with pairs only
    # fidelity.collusion rates (echo_rate, error_recall, ...); empty in studies before them
    collusion: dict[str, float] = field(default_factory=dict)
    # task id -> exact, status_agree, score and collusion rates (``training.probe.by_task``)
    by_task: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass
class CheckpointEval:
    """Everything evaluated for one checkpoint (``base``, ``sft`` or an arm's last)."""

    model: str
    run_id: str
    settings: dict[str, SettingResult] = field(default_factory=dict)
    fidelity: FidelityResult | None = None
    error: str = ""
    fidelity_run_id: str = ""  # the run holding the fidelity rollout's episodes, once evaluated
    machines: list[str] = field(default_factory=list)  # CPU types that evaluated it

    def complete(self, n_settings: int) -> bool:
        """Whether all ``n_settings`` settings and the world evaluation are recorded."""
        return len(self.settings) == n_settings and self.fidelity is not None


@dataclass
class HeldEval:
    """A partial evaluation set aside while its arm trains again because its checkpoint was
    lost (``runner.reopen_lost_arm``), and the digest of the weights it was measured on: kept in
    ``study.json`` so that a study killed while the arm retrains still has it."""

    digest: str
    evaluation: CheckpointEval


@dataclass
class StudyState:
    """The whole study's progress (see the module docstring)."""

    study_id: str
    arms: dict[str, ArmState] = field(default_factory=dict)
    curves: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)  # arm/step/name
    evals: dict[str, CheckpointEval] = field(default_factory=dict)
    status: str = "running"
    start_digest: str = ""  # sha256 of the starting checkpoint's weights (``runner.digest``)
    held: dict[str, HeldEval] = field(default_factory=dict)  # arm -> evaluation set aside
    # The arms' shared step-0 probe of the starting checkpoint: {"key": its settings' digest
    # (``training.probe.start_probe_key``), "metrics": {...}} once the first arm has run it.
    start_probe: dict[str, Any] = field(default_factory=dict)
    # Lanes (``StudyConfig.lanes`` > 1): the unit each lane process runs ("train:envace",
    # "eval:sft") -> its pid, and the study's wall time over all its sessions.
    claims: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0

    def redo(self, arm: str) -> ArmState:
        """Start ``arm`` again in a new run, from the start: its curves and its evaluation go,
        its earlier runs stay on disk, untouched, and are listed in ``retired`` (e.g. the arm
        ran under an engine version the other arms did not)."""
        old = self.arms.get(arm)
        if old is None or (old.status == "pending" and not old.steps_done):
            raise ValueError(f"arm {arm!r} has not run in study {self.study_id}: nothing to redo")
        retired = [*old.retired, old.run_id]
        run_id = f"{self.study_id}--{arm}-r{len(retired) + 1}"
        self.arms[arm] = ArmState(run_id=run_id, retired=retired)
        self.curves.pop(arm, None)
        self.evals.pop(arm, None)
        self.held.pop(arm, None)
        self.status = "running"
        return self.arms[arm]

    def save(self, folder: Path) -> None:
        """Write ``study.json`` to a temporary sibling, then rename (never half a file)."""
        path = Path(folder) / STATE_FILE
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(asdict(self), indent=1, sort_keys=True), encoding="utf-8")
        tmp.replace(path)

    @classmethod
    def load(cls, folder: Path) -> StudyState | None:
        """The saved state of the study in ``folder``, or None if it has none yet."""
        path = Path(folder) / STATE_FILE
        if not path.is_file():
            return None
        return from_dict(json.loads(path.read_text(encoding="utf-8")))


@contextlib.contextmanager
def locked(folder: Path) -> Iterator[None]:
    """Hold the study's lock file (``fcntl.flock``): lane processes read, merge and write
    ``study.json`` one at a time."""

    with (Path(folder) / LOCK_FILE).open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@dataclass(frozen=True)
class Owned:
    """The parts of a study one lane process writes: the arms it trains (their records, curves
    and set-aside evaluations) and the checkpoints it evaluates."""

    arms: frozenset[str] = frozenset()
    evals: frozenset[str] = frozenset()


def merge_save(state: StudyState, folder: Path, owned: Owned) -> None:
    """Write ``state``'s ``owned`` parts into ``study.json`` (under the lock), keep what other
    lanes wrote there, and bring ``state``'s other parts up to date from it. The owned parts'
    objects stay the same in ``state`` (callers hold references to them)."""
    with locked(folder):
        disk = StudyState.load(folder) or StudyState(state.study_id)
        for arm in owned.arms:
            disk.arms[arm] = state.arms[arm]
            _put(disk.curves, arm, state.curves.get(arm))
            _put(disk.held, arm, state.held.get(arm))
        for name in owned.evals:
            _put(disk.evals, name, state.evals.get(name))
        disk.start_probe = disk.start_probe or state.start_probe
        disk.save(folder)
    for arm in set(disk.arms) - owned.arms:
        state.arms[arm] = disk.arms[arm]
        _put(state.curves, arm, disk.curves.get(arm))
        _put(state.held, arm, disk.held.get(arm))
    for name in set(disk.evals) - owned.evals:
        state.evals[name] = disk.evals[name]
    state.start_probe, state.claims = disk.start_probe, disk.claims


def _put(table: dict[str, Any], key: str, value: Any) -> None:
    if value is None:
        table.pop(key, None)
    else:
        table[key] = value


def from_dict(body: dict[str, Any]) -> StudyState:
    """A ``StudyState`` from its JSON form (``asdict``)."""
    held = {
        arm: HeldEval(raw["digest"], _checkpoint_eval(raw["evaluation"]))
        for arm, raw in body.get("held", {}).items()
    }
    return StudyState(
        study_id=body["study_id"],
        arms={k: ArmState(**v) for k, v in body.get("arms", {}).items()},
        curves=body.get("curves", {}),
        evals={name: _checkpoint_eval(raw) for name, raw in body.get("evals", {}).items()},
        status=body.get("status", "running"),
        start_digest=body.get("start_digest", ""),
        held=held,
        start_probe=body.get("start_probe", {}),
        claims=body.get("claims", {}),
        wall_s=body.get("wall_s", 0.0),
    )


def _checkpoint_eval(raw: dict[str, Any]) -> CheckpointEval:
    settings = {k: SettingResult(**v) for k, v in raw.get("settings", {}).items()}
    fidelity = FidelityResult(**raw["fidelity"]) if raw.get("fidelity") else None
    return CheckpointEval(
        raw["model"],
        raw["run_id"],
        settings,
        fidelity,
        raw.get("error", ""),
        raw.get("fidelity_run_id", ""),
        list(raw.get("machines", [])),
    )
