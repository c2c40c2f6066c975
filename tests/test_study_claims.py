"""The world-model claims (a′)–(d′) (study.claims) on hand-made study states."""

from __future__ import annotations

from envace_engine.config import build
from recipes.study.config import StudyConfig
from recipes.study.report import build_report, markdown
from recipes.study.state import (
    ArmState,
    CheckpointEval,
    FidelityResult,
    SettingResult,
    StudyState,
)

TASKS = [f"t{i}" for i in range(12)]
ARMS = ["envace", "real-grpo", "simulator", "fidelity"]


def config() -> StudyConfig:
    return build(StudyConfig, {"model": "tiny", "arms": ARMS, "eval": {"bootstrap": 300}})


def setting(label: str, wins: int) -> SettingResult:
    success = {t: 1.0 if i < wins else 0.0 for i, t in enumerate(TASKS)}
    mode = "select" if label.startswith("select") else "none"
    return SettingResult(label, 2 if mode == "select" else 0, mode, success, 0.5, 1, 20, 0, 0, 1)


def checkpoint(name: str, plain: int, select: int, score: float, echo: float, recall: float):
    by_task = {
        t: {
            "exact": score,
            "status_agree": score,
            "score": score,
            "echo_rate": echo,
            "error_recall": recall,
        }
        for t in TASKS
    }
    fid = FidelityResult(
        {t: 0.0 for t in TASKS},
        24,
        score,
        score,
        score,
        0.5,
        1.0,
        {t: score for t in TASKS},
        {"echo_rate": echo},
        by_task,
    )
    settings = {
        "plain N=0": setting("plain N=0", plain),
        "select N=2": setting("select N=2", select),
    }
    return CheckpointEval(name, f"s--eval-{name}", settings, fid)


def state(**evals: CheckpointEval) -> StudyState:
    s = StudyState("core", status="done")
    s.arms = {a: ArmState(f"core--{a}", "done", 10) for a in ARMS}
    s.evals = dict(evals)
    return s


def verdicts(s: StudyState) -> dict[str, dict]:
    report = build_report(config(), s)
    return {v["claim"][:4]: v for v in report["verdicts"]}


def test_the_claims_when_the_signal_works():
    v = verdicts(
        state(
            sft=checkpoint("sft", 6, 6, 0.3, 0.3, 0.0),
            envace=checkpoint("envace", 7, 7, 0.3, 0.4, 0.0),  # fidelity flat, more echoes
            fidelity=checkpoint("fidelity", 7, 9, 0.6, 0.1, 0.5),
            **{"real-grpo": checkpoint("real-grpo", 7, 7, 0.3, 0.3, 0.0)},
            simulator=checkpoint("simulator", 2, 2, 0.3, 0.3, 0.0),
        )
    )
    assert v["(a′)"]["verdict"] == "supported"  # +0.3 on every task; envace +0
    assert v["(b′)"]["verdict"] == "supported"  # Δ 0 vs real-grpo, +5/12 vs simulator
    assert v["(c′)"]["verdict"] == "supported"  # echo 0.4 vs 0.1 on every task
    assert v["(d′)"]["verdict"] in ("supported", "inconclusive")  # 9 vs 7 wins of 12


def test_the_claims_when_it_does_not():
    v = verdicts(
        state(
            sft=checkpoint("sft", 6, 6, 0.3, 0.3, 0.0),
            envace=checkpoint("envace", 7, 7, 0.5, 0.1, 0.5),  # the task-only arm gained too
            fidelity=checkpoint("fidelity", 8, 0, 0.2, 0.3, 0.0),
            **{"real-grpo": checkpoint("real-grpo", 12, 12, 0.3, 0.3, 0.0)},
            simulator=checkpoint("simulator", 12, 12, 0.3, 0.3, 0.0),
        )
    )
    assert v["(a′)"]["verdict"] == "not supported"
    assert v["(b′)"]["verdict"] == "not supported"
    assert v["(c′)"]["verdict"] == "not supported"
    assert v["(d′)"]["verdict"] == "not supported"
    assert "(a′)" in markdown(build_report(config(), state()))


def test_missing_evaluations_are_not_run():
    assert {v["verdict"] for v in verdicts(state()).values()} == {"not run"}
