"""The study report from a hand-made study state: table, world model, verdicts, studio page."""

from __future__ import annotations

from pathlib import Path

import pytest

from envace_engine.config import build
from envace_engine.stats import Estimate
from recipes.study.config import StudyConfig
from recipes.study.report import at_least, build_report, effect, greater, markdown
from recipes.study.state import StudyState
from tests.studio_data import make_study, study_state


@pytest.fixture
def report():
    config = build(StudyConfig, {"model": "tiny", "eval": {"bootstrap": 300}})
    return build_report(config, study_state(config))


def test_table_rows_and_deltas(report):
    rows = {(r["checkpoint"], r["setting"]): r for r in report["table"]}
    assert rows[("sft", "plain N=0")]["success"]["mean"] == 0.5
    assert rows[("sft", "plain N=0")]["delta"] is None
    assert rows[("envace", "parallel N=2")]["delta"]["mean"] == pytest.approx(0.25)  # 8/8 - 6/8
    assert rows[("envace", "parallel N=2")]["rehearsal_tokens"] == 25.0  # 10 x 2 + 5 memory
    assert rows[("sft", "plain N=0")]["effect"] is None
    assert rows[("sft", "plain N=0")]["invalid_calls"] is None  # not recorded by that study
    assert rows[("envace", "plain N=0")]["invalid_calls"] == 0.25
    assert rows[("envace", "parallel N=2")]["effect"] in ("helps", "harmless")


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
    lines = text.splitlines()
    sft = next(x for x in lines if x.startswith("| sft | plain N=0 |"))
    envace = next(x for x in lines if x.startswith("| envace | plain N=0 |"))
    assert sft.endswith("| 1.00 | — | 5 |") and envace.endswith("| 1.00 | 0.25 | 5 |")


def test_a_study_without_invalid_call_counts_has_no_such_column(report):
    from studio.pages.study import table_frame

    older = {**report, "table": [{**r, "invalid_calls": None} for r in report["table"]]}
    assert "invalid calls" not in markdown(older) and "invalid calls" in markdown(report)
    assert "invalid calls" not in table_frame(older).columns
    assert "invalid calls" in table_frame(report).columns


def test_rules_by_hand():
    assert greater(Estimate(0.1, 0.02, 0.2, 8)) == "supported"
    assert greater(Estimate(0.1, -0.02, 0.2, 8)) == "inconclusive"
    assert greater(Estimate(-0.1, -0.2, -0.01, 8)) == "not supported"
    assert at_least(Estimate(0.0, -0.04, 0.04, 8)) == "supported"  # within the 5-point margin
    assert at_least(Estimate(0.01, -0.08, 0.1, 8)) == "inconclusive"
    assert at_least(Estimate(-0.1, -0.2, -0.01, 8)) == "not supported"
    assert effect(Estimate(0.1, 0.02, 0.2, 8)) == "helps"
    assert effect(Estimate(-0.02, -0.04, -0.01, 8)) == "hurts"  # significant, if small
    assert effect(Estimate(0.0, -0.04, 0.04, 8)) == "harmless"
    assert effect(Estimate(0.0, -0.2, 0.2, 8)) == "inconclusive"


def test_missing_arms_are_not_run():
    config = build(StudyConfig, {"model": "tiny"})
    report = build_report(config, StudyState("s"))
    assert {v["verdict"] for v in report["verdicts"]} == {"not run"}


def test_a_study_run_in_lanes_reports_its_wall_time_beside_the_units_total():
    config = build(StudyConfig, {"model": "tiny", "lanes": 2})
    state = StudyState("s", wall_s=5400.0)
    report = build_report(config, state)
    assert report["costs"]["lanes"] == 2 and report["costs"]["wall_h"] == 1.5
    assert "Run in 2 lanes (units side by side" in markdown(report)
    assert "1.50 h from start to now." in markdown(report)
    alone = build_report(build(StudyConfig, {"model": "tiny"}), state)
    assert "lanes" not in markdown(alone).split("## Arms and cost")[1]
    from studio.pages import study

    assert "Run in 2 lanes: 1.50 h wall time." in study.header(report, "s")
    assert "lanes" not in study.header(alone, "s")


def test_study_page_reads_the_report(report, tmp_path: Path):
    from studio.auth import AuthPolicy
    from studio.context import Studio
    from studio.pages import study

    make_study(tmp_path)
    ctx = Studio.open(tmp_path, AuthPolicy.from_settings(None, space_id=""))
    try:
        assert study.study_runs(ctx) == ["study-demo"]
        summary, table, world, _chart = study.show(ctx, "study-demo", "held-out fidelity exact")
        assert "**met**" in summary and "(e) target" in summary
        assert "Measured cost: 0.00 h." in summary  # a finished study
        assert len(table) == 10 and set(table["checkpoint"]) == set(report["arms"]) | {"sft"}
        assert list(world["checkpoint"])[:2] == ["sft", "envace"]
        invalid = table.set_index(["checkpoint", "setting"])["invalid calls"]
        assert invalid["envace", "plain N=0"] == 0.25 and invalid.isna()["sft", "plain N=0"]
        frame = study.curve_frame(report, "heldout/fidelity_exact")
        envace = frame[frame["arm"] == "envace"].sort_values("step")
        assert envace["value"].tolist() == [0.3, 0.3, 0.3]
        assert "no report yet" in study.header(None, "other")
        make_study(tmp_path, "study-later")  # started after the page loaded
        menu, summary, *_ = study.refresh(ctx, "study-demo", "held-out fidelity exact")
        assert set(menu["choices"]) == {"study-demo", "study-later"}
        assert menu["value"] == "study-demo" and "study-demo" in summary
    finally:
        ctx.store.close()


def test_costs_by_hand():
    config = build(StudyConfig, {"model": "tiny", "eval": {"bootstrap": 300}})
    state = study_state(config)
    state.arms["envace"].seconds = 30.0  # a killed process lost the rest of its wall time
    for step, seconds in (("0", 10.0), ("10", 20.0), ("20", 30.0)):
        state.curves["envace"][step]["perf/step_s"] = seconds
    costs = build_report(config, state)["costs"]
    assert costs["arms"]["envace"] == {"wall_s": 30.0, "steps_s": 60.0, "median_step_s": 20.0}
    assert costs["arms"]["real-grpo"]["median_step_s"] is None
    assert costs["evals_s"]["sft"] == 3.0  # two settings of 1 s and the world evaluation's 1 s
    assert costs["total_h"] == pytest.approx((60.0 + 5 * 3.0) / 3600)
    text = markdown(build_report(config, state))
    assert "| envace | done | 40 | 0.5 | 1.0 | 20.0 |  |" in text
    assert "Evaluation minutes per checkpoint: sft 0.1" in text
    assert "Total: 0.02 h" in text  # study_state is a finished study
    state.status = "running"
    assert "Total so far: 0.02 h" in markdown(build_report(config, state))


def test_table_keeps_the_papers_order_after_a_save_and_load(tmp_path: Path):
    """study.json is written with sorted keys; the table still reads base, sft, the arms, and
    within each checkpoint N = 0, the configured modes by budget, then select."""
    config = build(StudyConfig, {"model": "tiny", "eval": {"bootstrap": 100}})
    study_state(config).save(tmp_path)
    loaded = StudyState.load(tmp_path)
    assert loaded is not None
    rows = build_report(config, loaded)["table"]
    names = list(dict.fromkeys(r["checkpoint"] for r in rows))
    order = ["base", "sft", *config.arms]
    assert names == [n for n in order if n in names]
    for name in names:
        settings = [(r["mode"], r["budget"]) for r in rows if r["checkpoint"] == name]
        modes = ["none", *config.eval.modes, "select"]
        assert settings == sorted(settings, key=lambda s: (modes.index(s[0]), s[1])), name
        assert settings[0] == ("none", 0)
    report = build_report(config, loaded)
    assert [a for a in report["arms"] if a in config.arms] == list(config.arms)
    assert list(report["costs"]["arms"]) == list(report["arms"])


def test_report_does_not_depend_on_the_order_tasks_were_recorded_in():
    """A running study holds per-task results in the order its episodes ended, a reloaded
    study.json in sorted order: the bootstrap must resample the same task order either way."""
    config = build(StudyConfig, {"model": "tiny", "eval": {"bootstrap": 300}})
    state = study_state(config)
    flipped = study_state(config)
    for record in flipped.evals.values():
        fid = record.fidelity
        if fid is not None:
            fid.rehearsed_success = dict(reversed(fid.rehearsed_success.items()))
            fid.exact_by_task = dict(reversed(fid.exact_by_task.items()))
        for result in record.settings.values():
            result.success = dict(reversed(result.success.items()))
    assert build_report(config, flipped) == build_report(config, state)
