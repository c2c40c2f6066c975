"""What a new researcher meets first, as plain handler functions: charts that keep one colour per
arm or run, rounded numbers, a run's real step count, empty charts that say why, the curve read
first on Compare runs, the budget saved for the sweep's own checkpoint, a fitted budget axis,
clamped page numbers, a cheap first job with the host's limits beside it, and the demo's header,
glossary and doc links."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from envace_engine.types import Mode
from storage.shards import RunWriter
from studio import charts, forms
from studio.auth import AuthPolicy
from studio.context import Studio
from studio.pages import budget, home, runs, runs_compare, study
from studio.space import HostLimits
from tests.studio_data import episode, make_run, make_sweep


@pytest.fixture
def ctx(tmp_path):
    make_run(tmp_path)
    make_sweep(tmp_path)
    studio = Studio.open(tmp_path, AuthPolicy.from_settings(None, space_id=""))
    yield studio
    studio.store.close()


@pytest.fixture
def demo(tmp_path, monkeypatch):
    """A studio opened on an empty folder: the bundled demo (the reproduction study) copied in."""
    monkeypatch.setenv("ENVACE_DEMO", "1")
    studio = Studio.open(tmp_path / "fresh", AuthPolicy.from_settings(None, space_id=""))
    yield studio
    studio.store.close()


def colours(spec: dict) -> dict[str, str]:
    """name -> colour of a chart's colour scale (layered or not)."""
    encoding = spec["layer"][0]["encoding"] if "layer" in spec else spec["encoding"]
    scale = encoding["color"]["scale"]
    return dict(zip(scale["domain"], scale["range"], strict=True))


def curve_frame(by: str, names: list[str]) -> pd.DataFrame:
    rows = [{by: n, "step": s, "value": 0.1 * s} for n in names for s in range(3)]
    return pd.DataFrame(rows)


# -- one colour per arm or run ---------------------------------------------------------------


def test_an_arm_keeps_its_colour_across_charts():
    arms = study.curve_chart(curve_frame("arm", ["act-only", "envace", "real-grpo"]), "reward")
    runs_frame = pd.DataFrame(
        [{"name": "reward/act", "step": s, "value": 0.5} for s in range(3) for _ in range(1)]
    )
    compared = runs_compare.shared_curves(
        {"study-toy--envace": runs_frame, "study-toy--real-grpo": runs_frame}, "reward/act"
    )
    by_arm, by_run = colours(arms.to_dict()), colours(compared.to_dict())
    assert by_arm["envace"] == by_run["study-toy--envace"] == charts.colour("envace")
    assert by_arm["real-grpo"] == by_run["study-toy--real-grpo"]
    assert len(set(by_arm.values())) == 3  # one chart never draws two arms alike


def test_other_runs_and_modes_keep_a_stable_colour():
    assert charts.colour("train-20260101-abc") == charts.colour("train-20260101-abc")
    assert charts.colour("study-toy--envace-r2") == charts.colour("envace")  # a redone arm
    sweep = pd.DataFrame(
        {
            "mode": ["parallel", "sequential"] * 2,
            "budget": [0, 0, 2, 2],
            "success": [0.5, 0.5, 0.7, 0.6],
            "rehearsal_tokens": [0.0, 0.0, 200.0, 210.0],
        }
    )
    assert colours(charts.budget(sweep).to_dict())["parallel"] == charts.colour("parallel")


def test_names_that_share_a_colour_are_told_apart_in_one_chart():
    scale = charts.colour_scale(["a--envace", "b--envace", "c"]).to_dict()
    assert len(set(scale["range"])) == 3


# -- rounded numbers ---------------------------------------------------------------------------


def test_numbers_are_rounded_to_three_places_or_three_digits():
    assert charts.round_number(0.123456789012345) == 0.123
    assert charts.round_number(1.234567e-17) == 1.23e-17  # visible, not 0.0
    assert charts.round_number(7) == 7 and charts.round_number("text") == "text"
    assert charts.fmt(0.6666666666666666) == "0.667" and charts.fmt(None) == "-"
    frame = charts.rounded(pd.DataFrame({"x": [2 / 3, 1e-17 / 3], "n": [1, 2], "s": ["a", "b"]}))
    assert list(frame["x"]) == [0.667, 3.33e-18] and list(frame["n"]) == [1, 2]


def test_tables_show_rounded_numbers(ctx):
    writer = RunWriter.create(ctx.root, "train", model="tiny", suite="toy", run_id="thirds")
    writer.episodes(0, [episode(i, 0, r) for i, r in enumerate([1.0, 0.0, 0.0])])
    writer.finish("done")
    table = runs.runs_table(ctx).set_index("run_id")
    assert table.loc["thirds", "mean reward"] == 0.333
    sweep = budget.per_task(
        pd.DataFrame(
            {
                "task_id": ["t"] * 3,
                "mode": ["parallel"] * 3,
                "budget": [2] * 3,
                "success": [1.0, 0.0, 0.0],
            }
        )
    )
    assert sweep.loc[0, "parallel N=2"] == 0.333


def test_tiny_curves_print_in_exponent_form():
    frame = pd.DataFrame({"name": ["adv/act/mean"] * 2, "step": [0, 1], "value": [1e-17, -2e-17]})
    spec = runs_compare.shared_curves({"a": frame, "b": frame}, "adv/act/mean").to_dict()
    assert spec["encoding"]["y"]["axis"]["format"] == ".3~e"
    assert charts.number_format([0.5, 0.25]) == ",.3~f"


# -- the runs table: real step counts, key columns first ---------------------------------------


def test_a_run_shows_its_own_step_count_not_its_stored_steps(ctx):
    """A study arm keeps the episodes of its last steps only: 40 steps, 3 with episodes."""
    writer = RunWriter.create(ctx.root, "train", model="tiny", suite="toy", run_id="arm")
    for step in (37, 38, 39):
        writer.episodes(step, [episode(0, step, 1.0)])
    writer.progress(40, 40, "step 40/40")
    writer.finish("done")
    table = runs.runs_table(ctx)
    assert list(table.columns[:4]) == ["run_id", "status", "steps", "mean reward"]
    row = table.set_index("run_id").loc["arm"]
    assert (row["steps"], row["episode steps"]) == (40, 3)
    assert runs.progress_text(ctx, "arm") == "**arm**: done — step 40 of 40"


def test_an_evaluations_progress_counts_episodes(ctx):
    """An eval run's progress counts its real episodes, not steps (it has one step)."""
    writer = RunWriter.create(ctx.root, "eval", model="tiny", suite="toy", run_id="ev")
    writer.episodes(0, [episode(0, 0, 1.0)])
    writer.progress(128, 128, "episodes ended")
    writer.finish("done")
    assert runs.progress_text(ctx, "ev") == "**ev**: done — episode 128 of 128 episodes ended"


# -- empty charts say why ----------------------------------------------------------------------


def test_a_finished_run_without_fidelity_says_why_not_yet(ctx):
    writer = RunWriter.create(
        ctx.root, "train", model="tiny", suite="toy", run_id="real", config={"mode": "real-grpo"}
    )
    writer.metrics(0, {"reward/act": 0.5, "loss": 1.0})
    writer.progress(1, 1)
    writer.finish("done")
    _, fidelity, _, _, collusion = (c.to_dict() for c in runs.curve_charts(ctx, "real"))
    text = next(iter(fidelity["datasets"].values()))[0]["text"].replace("\n", " ")
    assert "yet" not in text and "no rehearsed/real pairs" in text and "real tools" in text
    said = next(iter(collusion["datasets"].values()))[0]["text"].replace("\n", " ")
    assert "real tools" in said  # the collusion panel gives the same reason


def test_empty_chart_messages_follow_the_run_status():
    assert "yet" in runs.empty_reason("fidelity", "train", "envace", "running")
    ended = runs.empty_reason("fidelity", "train", "envace", "done")
    assert "yet" not in ended and "recorded no rehearsed/real pairs" in ended
    assert "trains nothing" in runs.empty_reason("loss", "eval", "", "done")
    assert "SFT" in runs.empty_reason("fidelity", "sft", "", "failed")


# -- compare runs: the curve read first, sorted and grouped ------------------------------------


def test_compare_opens_on_a_reward_curve_with_metrics_grouped():
    names = ["adv/act/mean", "loss", "fidelity/exact", "reward/rehearse", "reward/act", "perf/s"]
    frame = pd.DataFrame({"name": names, "step": 0, "value": 0.5})
    ordered = runs_compare.metrics_of({"a": frame, "b": frame})
    assert ordered == [
        "reward/act",
        "reward/rehearse",
        "fidelity/exact",
        "loss",
        "adv/act/mean",
        "perf/s",
    ]
    assert runs_compare.default_metric(ordered) == "reward/act"
    assert runs_compare.default_metric(["adv/x", "reward/mean"]) == "reward/mean"
    assert runs_compare.default_metric(["adv/x", "loss"]) == "loss"
    assert runs_compare.default_metric(["adv/x"]) == "adv/x"


# -- the budget page ---------------------------------------------------------------------------


def test_save_budget_records_the_sweeps_checkpoint(ctx):
    """The budget belongs to the model the sweep on screen evaluated, whatever the sweep-launch
    form's model menu says."""
    checkpoint = "runs/study-toy--envace/checkpoints/step-000040"
    writer = RunWriter.create(ctx.root, "sweep", model=checkpoint, suite="toy", run_id="sw")
    writer.episodes(0, [episode(0, 0, 1.0, mode=Mode.REAL, prefix="sw")])
    writer.metrics(0, {"sweep/budget": 0, "sweep/sequential": 0, "sweep/rehearsal_tokens": 0})
    writer.finish("done")
    assert checkpoint in budget.target_text(ctx, "sw")
    message, saved = budget.save_choice(ctx, "ana", "sw", 2, "select", "")
    assert message.startswith("Saved budget N=2 (select)")
    assert (saved.iloc[0]["model"], saved.iloc[0]["mode"]) == (checkpoint, "select")
    message, _ = budget.save_choice(ctx, "ana", None, 2, "select", "")
    assert "Not saved" in message and "pick the sweep run" in message


def test_budget_axis_is_fitted_to_the_data(ctx):
    chart, *_ = budget.show_sweep(ctx, "sweep-demo")
    y = chart.to_dict()["layer"][0]["encoding"]["y"]["scale"]
    assert y["zero"] is False
    summary = charts.budget_summary(budget.sweep_frame(ctx, "sweep-demo"))
    low, high = y["domain"]
    assert 0 <= low <= summary["lo"].min() + 1e-9 and summary["hi"].max() - 1e-9 <= high <= 1
    close = pd.DataFrame(
        {
            "mode": ["parallel"] * 2,
            "budget": [0, 2],
            "success": [0.80, 0.84],
            "rehearsal_tokens": [0.0, 100.0],
        }
    )
    low, high = charts.budget(close).to_dict()["layer"][0]["encoding"]["y"]["scale"]["domain"]
    assert high - low < 0.5  # a 4-point difference is not flattened on a 0-1 axis


# -- pagination --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("asked", "page", "needle"),
    [
        (999, 2, "only 2 page(s)"),
        (0, 1, "pages start at 1"),
        (-3, 1, "pages start at 1"),
        ("x", 1, "not a number"),
        (None, 1, "not a number"),
        (2, 2, ""),
    ],
)
def test_out_of_range_pages_are_clamped_with_a_message(asked, page, needle):
    got, message = forms.clamp_page(asked, 2)
    assert got == page
    assert (needle in message) if needle else message == ""


# -- safe defaults -----------------------------------------------------------------------------


def test_the_launch_form_opens_on_the_cheapest_job():
    request = forms.parse(
        {"kind": forms.DEFAULT_KIND, "model": forms.DEFAULT_MODEL, "suite": "toy"}
    )
    assert (request.kind, request.model) == ("rollout", "tiny")
    assert request.argv()[3] == "rollout"


def test_the_form_says_the_hosts_limits_before_the_click(monkeypatch):
    monkeypatch.delenv("ENVACE_MAX_JOBS", raising=False)
    monkeypatch.delenv("ENVACE_MAX_MODEL_PARAMS", raising=False)
    hosted = forms.limits_note(HostLimits.for_space())
    assert "one job at a time" in hosted and "500 M parameters" in hosted
    assert "Limits" not in forms.limits_note(HostLimits())


def test_the_runs_page_shows_the_defaults_and_the_limits(tmp_path, monkeypatch):
    monkeypatch.setenv("ENVACE_DEMO", "0")
    from studio.app import build_app

    app = build_app(str(tmp_path), limits=HostLimits(max_jobs=1, max_model_params=10**9))
    by_id = {b.elem_id: b for b in app.blocks.values() if getattr(b, "elem_id", None)}
    assert by_id["launch-kind"].value == "rollout"
    assert by_id["launch-model"].value == "tiny"
    assert "one job at a time" in by_id["launch-limits"].value
    assert "one job at a time" in by_id["bud-limits"].value
    assert by_id["bud-model"].value == "tiny"


# -- first visit -------------------------------------------------------------------------------


def test_the_demo_header_says_what_the_demo_is(demo):
    about = home.about_demo(demo)
    assert "SmolLM2-135M" in about and "study-toy" in about and "toy tool worlds" in about
    assert "| `envace` |" in about and "role-wise GRPO" in about
    assert "| `act-only` |" in about and "world role is frozen" in about
    assert "(?tab=home&doc=study.md)" in about


def test_without_a_study_the_header_says_so(ctx):
    assert "No reproduction study" in home.about_demo(ctx)


@pytest.mark.parametrize(
    "term",
    ["arm", "select", "gap", "exact", "status agree", "real NLL", "fidelity", "rehearsal budget"],
)
def test_the_glossary_defines_the_studys_terms(term):
    assert (
        f"**{term}" in home.GLOSSARY
        or f"/ {term}" in home.GLOSSARY
        or f"{term}, N" in (home.GLOSSARY)
    )


def test_doc_links_open_the_doc_in_the_app():
    linked = home.link_docs("Measured cost: see docs/study.md. ```docs/study.md```")
    assert linked.startswith("Measured cost: see [docs/study.md](?tab=home&doc=study.md).")
    assert linked.endswith("```docs/study.md```")  # code is left alone
    assert home.link_docs("docs/no-such.md") == "docs/no-such.md"
    assert "study.md" in home.doc_names() and home.doc_names()[0] == "study.md"
    assert "# The reproduction study" in home.read_doc("study.md")
    assert home.read_doc("../README.md").startswith("No doc")
    update, text = home.from_link({"tab": "home", "doc": "rehearsal.md"})
    assert update["value"] == "rehearsal.md" and "Test-time private rehearsal" in text
    assert home.from_link({"tab": "study", "doc": "rehearsal.md"})[1] == ""


def test_the_study_header_links_its_doc(demo):
    report = study.load_report(demo, "study-toy")
    assert "[docs/study.md](?tab=home&doc=study.md)" in study.header(report, "study-toy")


def test_unreadable_runs_are_named_on_the_runs_and_home_pages(tmp_path):
    import json
    import shutil

    from storage import SCHEMA_VERSION, Store
    from studio.pages import home, runs

    fixtures = Path(__file__).parent / "fixtures" / "schema"
    for run in sorted(fixtures.glob("v*/schema-v*")):
        shutil.copytree(run, tmp_path / "runs" / run.name)
    newer = tmp_path / "runs" / "schema-v1" / "run.json"
    manifest = json.loads(newer.read_text())
    newer.write_text(json.dumps({**manifest, "schema_version": SCHEMA_VERSION + 1}))

    class Ctx:
        root = tmp_path
        store = Store(tmp_path, url="duckdb:///:memory:")

    note = runs.unreadable_note(Ctx())  # type: ignore[arg-type]
    assert "`schema-v1` · run.json" in note and "newer than this build's" in note
    assert "Could not read `schema-v1`" in home.overview(Ctx())  # type: ignore[arg-type]
    newer.write_text(json.dumps(manifest))
    assert runs.unreadable_note(Ctx()) == ""  # type: ignore[arg-type]
    Ctx.store.close()
