"""The study report from a hand-made study state: table, world model, verdicts, studio page."""

from __future__ import annotations

from pathlib import Path

import pytest

from envace_engine.config import build
from envace_engine.study.config import StudyConfig
from envace_engine.study.report import at_least, build_report, greater, markdown, write_report
from envace_engine.study.state import (
    ArmState,
    CheckpointEval,
    FidelityResult,
    SettingResult,
    StudyState,
)
from envace_engine.study.stats import Estimate

TASKS = [f"t{i}" for i in range(8)]


def _setting(label: str, budget: int, mode: str, wins: int) -> SettingResult:
    """``wins`` of the 8 tasks succeed on both repeats, the rest on none."""
    success = {t: 1.0 if i < wins else 0.0 for i, t in enumerate(TASKS)}
    return SettingResult(label, budget, mode, success, 0.5, 1.0, 20.0, 10.0 * budget, 5.0, 1.0)


def _eval(name: str, plain: int, parallel2: int, rehearsed: int, exact: float) -> CheckpointEval:
    settings = {
        "plain N=0": _setting("plain N=0", 0, "none", plain),
        "parallel N=2": _setting("parallel N=2", 2, "parallel", parallel2),
    }
    fid = FidelityResult(
        rehearsed_success={t: 1.0 if i < rehearsed else 0.0 for i, t in enumerate(TASKS)},
        pairs=16,
        exact=exact,
        status_agree=0.9,
        score=0.8,
        real_nll=0.4,
        wall_s=1.0,
        exact_by_task={t: exact for t in TASKS},
    )
    return CheckpointEval(name, f"s--eval-{name}", settings, fid)


@pytest.fixture
def report():
    config = build(StudyConfig, {"model": "tiny", "eval": {"bootstrap": 300}})
    state = StudyState("s", status="done")
    state.arms = {a: ArmState(f"s--{a}", "done", 40) for a in config.arms}
    # sft: 4/8 real, 1/8 in its rehearsed world (gap 3/8); envace: 6/8 real, 5/8 rehearsed
    state.evals = {
        "sft": _eval("sft", 4, 4, 1, 0.3),
        "envace": _eval("envace", 6, 8, 5, 0.7),
        "real-grpo": _eval("real-grpo", 5, 5, 1, 0.3),
        "act-only": _eval("act-only", 5, 5, 2, 0.3),
        "shared-baseline": _eval("shared-baseline", 6, 6, 4, 0.6),
    }
    state.curves = {
        "envace": {"0": {"heldout/fidelity_exact": 0.3}, "40": {"heldout/fidelity_exact": 0.7}}
    }
    return build_report(config, state)


def test_table_rows_and_deltas(report):
    rows = {(r["checkpoint"], r["setting"]): r for r in report["table"]}
    assert rows[("sft", "plain N=0")]["success"]["mean"] == 0.5
    assert rows[("sft", "plain N=0")]["delta"] is None
    assert rows[("envace", "parallel N=2")]["delta"]["mean"] == pytest.approx(0.25)  # 8/8 - 6/8
    assert rows[("envace", "parallel N=2")]["rehearsal_tokens"] == 25.0  # 10 x 2 + 5 memory


def test_world_gap(report):
    world = {w["checkpoint"]: w for w in report["world"]}
    assert world["sft"]["gap"]["mean"] == pytest.approx(3 / 8)
    assert world["envace"]["gap"]["mean"] == pytest.approx(1 / 8)


def test_verdicts(report):
    v = {x["claim"][:3]: x for x in report["verdicts"]}
    assert v["(a)"]["verdict"] == "supported"  # exact 0.3 -> 0.7 on every task
    assert v["(b)"]["verdict"] in ("supported", "inconclusive")
    assert v["(c)"]["verdict"] in ("supported", "inconclusive")
    assert v["(e)"]["verdict"] == "met"  # gap 3/8 -> 1/8 (closed 2/3), exact 0.7, no drop
    assert "closed 0.667" in v["(e)"]["evidence"]
    text = markdown(report)
    assert "## Test-time rehearsal" in text and "| envace | parallel N=2 | 100.0" in text


def test_rules_by_hand():
    assert greater(Estimate(0.1, 0.02, 0.2, 8)) == "supported"
    assert greater(Estimate(0.1, -0.02, 0.2, 8)) == "inconclusive"
    assert greater(Estimate(-0.1, -0.2, -0.01, 8)) == "not supported"
    assert at_least(Estimate(0.0, -0.04, 0.04, 8)) == "supported"  # within the 5-point margin
    assert at_least(Estimate(0.01, -0.08, 0.1, 8)) == "inconclusive"
    assert at_least(Estimate(-0.1, -0.2, -0.01, 8)) == "not supported"


def test_missing_arms_are_not_run():
    config = build(StudyConfig, {"model": "tiny"})
    report = build_report(config, StudyState("s"))
    assert {v["verdict"] for v in report["verdicts"]} == {"not run"}


def test_study_page_reads_the_report(report, tmp_path: Path):
    from storage.shards import RunWriter
    from studio.auth import AuthPolicy
    from studio.context import Studio
    from studio.pages import study

    with RunWriter.create(tmp_path, "study", model="tiny", suite="toy", run_id="s") as writer:
        write_report(report, writer.path)
    ctx = Studio.open(tmp_path, AuthPolicy.from_settings(None, space_id=""))
    try:
        assert study.study_runs(ctx) == ["s"]
        summary, table, world, _chart = study.show(ctx, "s", "held-out fidelity exact")
        assert "**met**" in summary and "(e) target" in summary
        assert len(table) == 10 and set(table["checkpoint"]) == set(report["arms"]) | {"sft"}
        assert list(world["checkpoint"])[:2] == ["sft", "envace"]
        frame = study.curve_frame(report, "heldout/fidelity_exact")
        assert frame.sort_values("step")["value"].tolist() == [0.3, 0.7]
        assert "no report yet" in study.header(None, "other")
    finally:
        ctx.store.close()
