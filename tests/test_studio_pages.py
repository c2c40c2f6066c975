"""Page handlers as plain functions, on real run directories read through storage's Store."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from envace_engine.config import SFTConfig, TrainConfig, build
from studio.auth import AuthPolicy
from studio.context import Studio
from studio.pages import annotate, budget, compare, home, inspector, rehearse, runs
from tests.studio_data import make_run, make_sweep


@pytest.fixture
def ctx(tmp_path):
    make_run(tmp_path)
    make_sweep(tmp_path)
    studio = Studio.open(tmp_path, AuthPolicy.from_settings(None, space_id=""))
    yield studio
    studio.store.close()


@pytest.fixture
def locked(tmp_path):
    """A studio started with --auth: anonymous visitors read only."""
    make_run(tmp_path)
    studio = Studio.open(tmp_path, AuthPolicy.from_settings("ana:pw", space_id=""))
    yield studio
    studio.store.close()


def test_runs_table_lists_runs_with_key_numbers(ctx):
    df = runs.runs_table(ctx).set_index("run_id")
    assert df.loc["train-demo", "episodes"] == 8
    assert df.loc["train-demo", "steps"] == 2
    assert df.loc["train-demo", "mean reward"] == 0.5
    assert df.loc["train-demo", "status"] == "done"
    assert "2 run(s), 20 episode(s)" in home.overview(ctx)  # 8 train + 12 sweep


def test_launch_form_errors_name_the_field(ctx):
    form = {"kind": "rollout", "model": "gpt-17", "suite": "toy", "episodes": 0}
    message, run_id = runs.launch(ctx, None, form)
    assert run_id is None
    assert "model: unknown model 'gpt-17'" in message
    assert "episodes: Input should be greater than or equal to 1" in message
    form = {"kind": "sweep", "model": "tiny", "suite": "toy", "budgets": "0,two"}
    message, _ = runs.launch(ctx, None, form)
    assert "budgets: must be whole numbers separated by commas" in message
    message, _ = runs.launch(ctx, None, {"kind": "train", "model": "tiny", "suite": "web"})
    assert "suite: Input should be 'toy', 'toy-library', 'bfcl-gen', 'bfcl'" in message


def _job(request) -> dict:
    """The job file the studio writes for ``request``."""
    return request.config(Path("runs"), "r0")


def test_launch_form_offers_every_suite_and_tau2_takes_a_user():
    from envace_engine.environments import suite_names

    assert set(runs.forms.SUITES) == set(suite_names())
    request = runs.forms.parse(
        {"kind": "eval", "model": "tiny", "suite": "tau2-airline", "user": " tiny "}
    )
    job = _job(request)
    assert (job["suite"], job["user"]) == ("tau2-airline", "tiny")
    scripted = runs.forms.parse({"kind": "eval", "model": "tiny", "suite": "tau2-retail"})
    assert "user" not in _job(scripted)
    with pytest.raises(runs.forms.FormError, match="training with a simulated user"):
        runs.forms.parse({"kind": "train", "model": "tiny", "suite": "tau2-airline"})
    with pytest.raises(runs.forms.FormError, match="user: a simulated user takes part only"):
        runs.forms.parse({"kind": "eval", "model": "tiny", "suite": "toy", "user": "tiny"})
    with pytest.raises(runs.forms.FormError, match="unknown model 'gpt-17'"):
        runs.forms.parse({"kind": "eval", "model": "tiny", "suite": "tau2-mock", "user": "gpt-17"})


def test_a_vita_eval_takes_a_user_and_a_judge_and_a_sweep_a_judge():
    form = {"kind": "eval", "model": "tiny", "suite": "vita-delivery-en", "user": "tiny"}
    job = _job(runs.forms.parse({**form, "judge": " http://127.0.0.1:30000 "}))
    assert job["judge"] == "http://127.0.0.1:30000"
    assert "judge" not in _job(runs.forms.parse(form))  # stored unscored
    assert _job(runs.forms.parse({**form, "judge": "tiny"}))["judge"] == "tiny"
    with pytest.raises(runs.forms.FormError, match="unknown model 'judge-llm'"):
        runs.forms.parse({**form, "judge": "judge-llm"})
    sweep = runs.forms.parse({**form, "kind": "sweep", "user": "", "judge": "tiny"})
    assert _job(sweep)["judge"] == "tiny"
    with pytest.raises(runs.forms.FormError, match="judge: a judge scores only eval and sweep"):
        runs.forms.parse({"kind": "eval", "model": "tiny", "suite": "toy", "judge": "http://h:1"})
    with pytest.raises(runs.forms.FormError, match="training with a simulated user"):
        runs.forms.parse({"kind": "train", "model": "tiny", "suite": "vita-instore"})


def test_the_sweep_form_passes_the_schema_check_on():
    form = {"kind": "sweep", "model": "tiny", "suite": "toy", "modes": ("select",)}
    assert _job(runs.forms.parse(form))["check_calls"] is False
    job = _job(runs.forms.parse({**form, "check_calls": True}))
    assert job["check_calls"] is True and job["modes"] == ["select"]


def test_launch_needs_sign_in_when_hosted(locked):
    message, run_id = runs.launch(
        locked, None, {"kind": "rollout", "model": "tiny", "suite": "toy"}
    )
    assert run_id is None
    assert "read-only: sign in" in message


def test_launch_runs_the_command_and_shows_progress(ctx):
    request = runs.forms.parse({"kind": "baseline", "model": "tiny", "suite": "toy", "steps": 3})
    assert request.argv()[3:] == ["train", "--config", "{run_dir}/config.toml"]
    config = request.config(ctx.root, "r1")
    assert (config["mode"], config["steps"], config["run_id"]) == ("real-grpo", 3, "r1")
    # the trainer's own config parser accepts what the form writes
    assert build(TrainConfig, config, []).mode == "real-grpo"
    sft = runs.forms.parse({"kind": "sft", "model": "tiny", "suite": "toy", "steps": 5})
    assert build(SFTConfig, sft.config(ctx.root, "s1"), []).max_steps == 5
    # Run a real command through the same path the form uses (the trainer CLI may not exist
    # yet): the job manager fills in {run_dir} and follows progress.json.
    script = (
        "import json,sys,time,os; d=sys.argv[1]; "
        "open(os.path.join(d,'progress.json'),'w').write(json.dumps("
        "{'done':3,'total':3,'status':'done','message':'trained'}))"
    )
    record = ctx.jobs.launch(
        "train", [sys.executable, "-c", script, "{run_dir}"], run_id="train-x", resumable=True
    )
    deadline = time.monotonic() + 20
    while ctx.jobs.get(record.run_id).record.status != "done" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert runs.progress_text(ctx, "train-x").startswith("**train-x** — done: trained")
    jobs = runs.jobs_table(ctx)
    assert list(jobs["run_id"]) == ["train-x"]
    mirrored = ctx.store.jobs("train-x")  # the store's jobs table follows job.json
    assert list(mirrored["status"]) == ["done"] and mirrored["exit_code"].iloc[0] == 0


def test_curves_for_reward_fidelity_loss_and_mismatch(ctx):
    charts = [c.to_dict() for c in runs.curve_charts(ctx, "train-demo")]
    reward, fidelity, loss, gap, collusion = charts

    def names(chart: dict) -> set[str]:
        return {row["name"] for row in next(iter(chart["datasets"].values()))}

    assert names(reward) == {"reward/act", "reward/rehearse"}
    assert names(loss) == {"loss"}
    assert names(gap) == {"rollout/logprob_diff", "rollout/mismatch_kl"}
    assert fidelity["mark"]["type"] == "line"
    rows = next(iter(collusion["datasets"].values()))  # from the run's stored calls
    assert "echo rate" in {r["name"] for r in rows} and collusion["encoding"]["href"]
    linked = [r["link"] for r in rows if r["link"]]
    assert all(link.startswith("?tab=inspector&run=train-demo&episode=") for link in linked)


def test_inspector_nests_rehearsed_and_real_under_each_call(ctx):
    messages, head, tokens, link = inspector.open_episode(ctx, "ep-0-1")
    calls = [m for m in messages if m.get("metadata", {}).get("id", "").startswith("call-")]
    assert [c["metadata"]["title"] for c in calls] == [
        "tool call 0: get_stock",
        "tool call 1: ship",
    ]
    children = [m for m in messages if m.get("metadata", {}).get("parent_id") == "call-1"]
    assert [c["metadata"]["title"] for c in children] == ["rehearsed response", "real response"]
    assert '"shipped": 500' in children[0]["content"]
    assert children[0]["content"].startswith("status **ok** · shown to the agent")
    assert children[1]["content"].startswith("status **error**")
    assert "error TOOL_EXECUTION_ERROR: only 40 bolts in stock" in children[1]["content"]
    assert "| 0.000 | done |" in head and "-0.500" in head  # reward 0, act advantage 0 - 0.5
    for kind in ("act (trained)", "rehearse (trained)", "not trained"):
        assert kind in tokens  # the token view's legend lists the kinds it draws
    here = "run=train-demo&episode=ep-0-1"
    assert link.startswith(f"Deep link: `?tab=inspector&{here}`")
    assert f"(?tab=rehearse&{here})" in link and f"(?tab=annotate&{here})" in link


def test_inspector_unknown_episode_and_next_failure(ctx):
    messages, head, _, _ = inspector.open_episode(ctx, "nope")
    assert messages == [] and "No episode `nope`" in head
    assert inspector.next_failure(ctx, "train-demo", "") == "ep-0-1"
    assert inspector.next_failure(ctx, "train-demo", "ep-0-1") == "ep-0-3"
    df, pager, page = inspector.episode_list(ctx, "train-demo", "1", "", "", 1)
    assert list(df["episode_id"]) == ["ep-1-0", "ep-1-1", "ep-1-2", "ep-1-3"]
    assert pager == "4 episode(s) · page 1 of 1" and page == 1
    df, pager, _ = inspector.episode_list(ctx, "train-demo", "one", "", "", 1)
    assert df.empty and "step** must be a whole number" in pager


def test_compare_pairs_diff_and_aggregates(ctx):
    df, pager, _ = compare.pairs_table(ctx, "train-demo", "ship", "error", 0, 1, 1)
    assert set(df["tool"]) == {"ship"} and set(df["real_status"]) == {"error"}
    assert pager == f"{len(df)} pair(s) · page 1 of 1"
    head, diff = compare.pair_detail(ctx, df.iloc[0]["call_id"], "train-demo")
    assert "status ok vs error" in head
    # success on the left, error on the right: every line differs, side by side
    assert '<td class="del">{</td><td class="add">error TOOL_EXECUTION_ERROR: only 40' in diff
    _, confusion, _, table = compare.aggregates(ctx, "train-demo")
    assert set(table["tool"]) == {"get_stock", "ship"}
    assert "layer" in confusion.to_dict()


def test_diff_rows_align_changed_lines():
    rows = compare.diff_rows('{\n  "a": 1,\n  "b": 2\n}', '{\n  "a": 1,\n  "b": 3\n}')
    assert rows == [
        ("same", "{", "{"),
        ("same", '  "a": 1,', '  "a": 1,'),
        ("changed", '  "b": 2', '  "b": 3'),
        ("same", "}", "}"),
    ]


def test_annotation_history_and_export(ctx):
    message, history = annotate.save(
        ctx, "ana", "call", "ep-0-1/1", "hallucinated-success", "said shipped; real tool refused"
    )
    assert message.startswith("Saved hallucinated-success")
    annotate.save(ctx, "bo", "call", "ep-0-1/1", "plausible-but-wrong", "")
    history = annotate.history(ctx, "ep-0-1/1")
    assert list(history["label"]) == ["plausible-but-wrong", "hallucinated-success"]
    assert list(history["author"]) == ["bo", "ana"]
    labels, agreement = annotate.export(ctx, "csv")
    assert "hallucinated-success" in Path(labels).read_text()
    # ana and bo labelled one call differently: 1 item, observed 0, kappa 0 (p_e = 0)
    rows = pd.read_csv(agreement)
    assert list(rows[["author_a", "author_b", "items", "observed", "kappa"]].iloc[0]) == [
        "ana",
        "bo",
        1,
        0.0,
        0.0,
    ]


@pytest.mark.parametrize(
    ("kind", "target", "label", "needle"),
    [
        ("call", "", "faithful", "enter a call id"),
        ("call", "ep-0-1", "faithful", "is not a call id"),
        ("call", "ep-0-1/0", None, "pick a label"),
        ("episode", "ep-0-1", "faithful", "unknown label"),
        ("episode", "ep-404", "success", "No episode `ep-404`"),
    ],
)
def test_bad_annotations_are_explained(ctx, kind, target, label, needle):
    message, _ = annotate.save(ctx, "ana", kind, target, label, "")
    assert message.startswith("**Not saved:**") and needle in message


def test_anonymous_cannot_annotate_when_hosted(locked):
    message, _ = annotate.save(locked, None, "episode", "ep-0-1", "success", "")
    assert "read-only: sign in" in message
    assert annotate.history(locked, "ep-0-1").empty


def test_budget_sweep_chart_table_and_saved_choice(ctx):
    frame = budget.sweep_frame(ctx, "sweep-demo")
    assert len(frame) == 12  # 3 committed per setting; plain N=0 counted under both modes
    chart, table, deltas, _ = budget.show_sweep(ctx, "sweep-demo")
    data = next(iter(chart.to_dict()["datasets"].values()))
    point = next(r for r in data if r["mode"] == "parallel" and r["budget"] == 2)
    assert point["success"] == pytest.approx(2 / 3) and point["rehearsal_tokens"] == 240
    point = next(r for r in data if r["mode"] == "sequential" and r["budget"] == 2)
    assert point["success"] == pytest.approx(2 / 3)  # reward 0.5 is not a success
    assert list(table.columns) == [
        "task_id",
        "parallel N=0",
        "parallel N=2",
        "sequential N=0",
        "sequential N=2",
    ]
    # Δ vs N = 0 per task: plain (0, 0, 1); parallel N=2 (1, 0, 1); sequential N=2 (1, 1, 0)
    # (reward 0.5 is no success): both +1/3 on average, paired as envace_engine.stats computes it.
    from envace_engine.stats import paired_difference

    assert list(deltas["mode"]) == ["parallel", "sequential"]
    assert list(deltas["delta"]) == [pytest.approx(1 / 3, abs=1e-3)] * 2
    est = paired_difference([1.0, 1.0, 0.0], [0.0, 0.0, 1.0], resamples=2000, seed=0)
    row = deltas.iloc[1]
    assert (row["low"], row["high"]) == (pytest.approx(est.low, abs=1e-3), pytest.approx(est.high))
    assert row["success"] == pytest.approx(2 / 3, abs=1e-3) and row["tasks"] == 3
    assert budget.sweep_runs(ctx) == ["sweep-demo"]
    assert "schema-checked" not in budget.show_sweep(ctx, "sweep-demo")[3]
    make_sweep(ctx.root, "sweep-checked", config={"check_calls": True})
    assert "imagined calls schema-checked" in budget.show_sweep(ctx, "sweep-checked")[3]
    message, saved = budget.save_choice(ctx, "ana", "sweep-demo", 2, "parallel", "best trade-off")
    assert message.startswith("Saved budget N=2")
    assert saved.iloc[0]["author"] == "ana"
    message, _ = budget.save_choice(ctx, "ana", "sweep-demo", -1, "parallel", "")
    assert "whole number of imagined episodes" in message


def test_budget_gives_each_checkpoint_its_own_plain_baseline(tmp_path):
    """A sweep of two checkpoints: each one's N = 0 is the baseline of its own curve only."""
    from envace_engine.types import Mode
    from storage.shards import RunWriter
    from tests.studio_data import episode

    writer = RunWriter.create(tmp_path, "sweep", model="a,b", suite="toy", run_id="two")
    grid = [(0, 0, [0.0, 0.0]), (0, 2, [1.0, 0.0]), (1, 0, [1.0, 1.0]), (1, 2, [1.0, 1.0])]
    for step, (ckpt, n, rewards) in enumerate(grid):
        eps = [episode(i, step, r, mode=Mode.REAL, prefix="sw") for i, r in enumerate(rewards)]
        writer.episodes(step, eps)
        metrics = {"sweep/budget": n, "sweep/sequential": 0, "sweep/rehearsal_tokens": 60.0 * n}
        writer.metrics(step, {**metrics, "sweep/checkpoint": ckpt})
    writer.finish("done")
    studio = Studio.open(tmp_path, AuthPolicy.from_settings(None, space_id=""))
    frame = budget.sweep_frame(studio, "two")
    assert len(frame) == 8  # each checkpoint's plain episodes once, under its own curve
    deltas = budget.deltas(frame).set_index("mode")
    assert deltas.loc["parallel ckpt 0", "delta"] == pytest.approx(0.5)
    assert deltas.loc["parallel ckpt 1", "delta"] == pytest.approx(0.0)


def test_budget_reads_each_steps_mode_from_its_flags():
    import pandas as pd

    steps = pd.DataFrame({"sweep/sequential": [0.0, 0.0, 1.0, 0.0], "sweep/select": [0, 0, 0, 1]})
    assert budget._modes(steps) == ["parallel", "parallel", "sequential", "select"]
    older = pd.DataFrame({"sweep/sequential": [0.0, 1.0]})  # a sweep from before select
    assert budget._modes(older) == ["parallel", "sequential"]


def test_rehearse_lists_only_rehearsed_calls(ctx):
    calls, status = rehearse.rehearsable_calls(ctx, "ep-0-0")
    assert list(calls["call_index"]) == [0, 1] and "2 rehearsed call(s)" in status
    calls, status = rehearse.rehearsable_calls(ctx, "missing")
    assert calls.empty and "No episode" in status


@pytest.mark.slow
def test_live_rehearse_with_the_tiny_model(ctx):
    client = rehearse.RehearseClient()
    try:
        live, stored, real, timing = rehearse.live_rehearse(ctx, client, "ep-0-1", 1, "tiny", 0.0)
    finally:
        client.close()
    assert "raw output" in live
    assert '"shipped": 500' in stored and "only 40 bolts" in real
    assert "tokens in" in timing and "5 prompt tokens" in timing


def test_unparseable_rehearsal_shows_the_raw_output(ctx, tmp_path):
    from envace_engine.types import Mode, Role, StopReason
    from storage.shards import RunWriter
    from tests.studio_data import episode

    base = episode(0, 0, 0.0, prefix="bad")
    calls = (
        base.calls[0].__class__(
            0, 1, base.calls[0].call, "rehearsed", rehearsed=None, real=base.calls[0].real
        ),
    )
    broken = base.__class__(
        id="bad-0",
        task_id="t",
        suite="toy",
        mode=Mode.REHEARSAL,
        group_id="g",
        segments=base.segments[:2],
        rehearsals=base.rehearsals[:1],
        calls=calls,
        stop_reason=StopReason.UNPARSEABLE_REHEARSAL,
        reward=0.0,
    )
    assert broken.rehearsals[0].completion.role is Role.REHEARSE
    with RunWriter.create(tmp_path, "train", run_id="broken") as writer:
        writer.episodes(0, [broken])
    messages, *_ = inspector.open_episode(ctx, "bad-0")
    titles = [m.get("metadata", {}).get("title") for m in messages]
    # the request, then the call (the reply held only the call: no bubble of its own)
    assert titles[1:] == [
        "tool call 0: get_stock",
        "rehearsed response (unparseable)",
        "real response",
    ]
    assert "<execution_result>" in messages[2]["content"]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("get_balance(dan)", "the tool call is not JSON"),
        ('{"arguments": {}}', '{"name": "tool_name", "arguments": {...}}'),
        ('{"name": "get_balance", "arguments": [1]}', '"arguments" must be a JSON object'),
    ],
)
def test_written_calls_are_validated(ctx, text, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        rehearse.parse_call(text)
    live, real, _timing = rehearse.rehearse_new_call(
        ctx, rehearse.RehearseClient(), "toy", "validation", "toy/s2-0", text, "tiny", 0.0
    )
    assert "Cannot rehearse" in live and needle in live and real == ""


def test_task_state_shows_the_initial_state():
    text = rehearse.task_state("toy", "validation", "toy/s2-0")
    assert "What is dan's balance?" in text and '"dan": 34' in text and "`get_balance`" in text
    assert "No task `nope`" in rehearse.task_state("toy", "validation", "nope")
    assert "split" in rehearse.task_state("toy", "no-such-split", "toy/s2-0")


@pytest.mark.slow
def test_rehearse_a_written_call_beside_the_real_tool(ctx):
    client = rehearse.RehearseClient()
    call = '{"name": "get_balance", "arguments": {"account": "dan"}}'
    try:
        live, real, timing = rehearse.rehearse_new_call(
            ctx, client, "toy", "validation", "toy/s2-0", call, "tiny", 0.0
        )
    finally:
        client.close()
    assert "raw output" in live
    assert '"balance": 34' in real  # executed for real on a fresh environment
    assert "prompt tokens" in timing
