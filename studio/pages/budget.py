"""Rehearsal budget: run a sweep (budget N x rehearsal mode) for a model on a suite, see success
against rehearsal tokens with error bars, per task and as a paired Δ vs N = 0 with its 95 % CI,
and save the budget chosen for the model.

How a sweep run is read (docs/studio.md): the sweep writes one *step* per setting. Its metrics
for that step name the setting — ``sweep/budget`` (N), ``sweep/sequential`` and
``sweep/select`` (1 in that mode; both 0: parallel; runs older than select have no
``sweep/select``) and ``sweep/rehearsal_tokens`` (mean imagined tokens per task) — and its episodes
are the committed real episodes of that setting, one per task and repeat, ``reward`` = success.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import gradio as gr
import pandas as pd

from envace_engine.stats import RESAMPLES, paired_by_task
from studio import charts, forms
from studio.auth import AuthError
from studio.context import Studio
from studio.pages import runs as runs_page

BUDGET_COLUMNS = ["created_at", "model", "suite", "budget", "mode", "author", "note"]


def sweep_runs(ctx: Studio) -> list[str]:
    """Run ids of sweep runs, newest first."""
    df = ctx.store.runs()
    return [] if df.empty else list(df.loc[df["kind"] == "sweep", "run_id"])


def launch_sweep(ctx: Studio, user: str | None, values: dict[str, object]) -> tuple[str, object]:
    """Validate and start a sweep job from the page's form values; (message, picker update)."""
    try:
        ctx.policy.author(user, "run sweeps")
        modes = cast(Iterable[object], values.get("modes") or ())  # a CheckboxGroup's list
        request = forms.parse({**values, "kind": "sweep", "modes": tuple(modes)})
    except (AuthError, forms.FormError) as err:
        lines = "\n".join(f"- {line}" for line in str(err).splitlines())
        return f"**Cannot start the sweep:**\n\n{lines}", gr.update()
    message, run_id = runs_page.start(ctx, request)
    if run_id is None:
        return message, gr.update()
    return message, gr.update(choices=[run_id, *sweep_runs(ctx)], value=run_id)


def per_task(results: pd.DataFrame) -> pd.DataFrame:
    """Success rate per task (rows) and ``mode N`` setting (columns)."""
    if results.empty:
        return pd.DataFrame(columns=["task_id"])
    settings = results["mode"].astype(str) + " N=" + results["budget"].astype(int).astype(str)
    table = (
        results.assign(setting=settings)
        .pivot_table(index="task_id", columns="setting", values="success", aggfunc="mean")
        .reset_index()
    )
    table.columns.name = None
    return charts.rounded(table)


SETTING_METRICS = ("sweep/budget", "sweep/sequential", "sweep/rehearsal_tokens")
MAX_EPISODES = 20_000


def _modes(steps: pd.DataFrame) -> list[str]:
    """Each step's rehearsal mode, from its ``sweep/sequential`` and ``sweep/select`` flags."""
    select = steps["sweep/select"] if "sweep/select" in steps else [0.0] * len(steps)
    return [
        "select" if sel >= 0.5 else "sequential" if seq >= 0.5 else "parallel"
        for seq, sel in zip(steps["sweep/sequential"], select, strict=True)
    ]


def _settings(ctx: Studio, run_id: str) -> pd.DataFrame:
    """Per step: mode, budget, mean rehearsal tokens (budget 0 is listed under every mode)."""
    steps = ctx.store.sweep_results(run_id)
    if steps.empty or not set(SETTING_METRICS) <= set(steps.columns):
        return pd.DataFrame(columns=["step", "mode", "budget", "rehearsal_tokens"])
    ckpt = steps["sweep/checkpoint"] if "sweep/checkpoint" in steps else pd.Series(0, steps.index)
    table = steps.assign(
        mode=_modes(steps),
        budget=steps["sweep/budget"].round().astype(int),
        rehearsal_tokens=steps["sweep/rehearsal_tokens"],
        ckpt=ckpt.fillna(0).round().astype(int),
    )
    if table["ckpt"].nunique() > 1:
        table["mode"] += " ckpt " + table["ckpt"].astype(str)
    rehearsed = table[table["budget"] > 0]
    rows = [rehearsed]
    # Plain N = 0 is listed under every mode of its own checkpoint (the baseline of each curve).
    for index, plain in table[table["budget"] == 0].groupby("ckpt"):
        modes = sorted(set(rehearsed.loc[rehearsed["ckpt"] == index, "mode"]))
        rows += [plain.assign(mode=m) for m in modes or list(plain["mode"].unique())]
    return pd.concat(rows, ignore_index=True)[["step", "mode", "budget", "rehearsal_tokens"]]


def sweep_frame(ctx: Studio, run_id: str) -> pd.DataFrame:
    """One row per committed episode: task_id, mode, budget, success, rehearsal_tokens.

    Committed episodes are the sweep's real-mode episodes (imagined ones are rehearsal-mode);
    success is full reward, as envace_engine.testtime.evaluate counts it by default.
    """
    cols = ["task_id", "mode", "budget", "success", "rehearsal_tokens"]
    settings = _settings(ctx, run_id)
    if settings.empty:
        return pd.DataFrame(columns=cols)
    episodes = ctx.store.episodes(run_id=run_id, limit=MAX_EPISODES)
    episodes = episodes[episodes["mode"] == "real"].drop(columns=["mode"])
    merged = episodes.merge(settings, on="step", how="inner")
    merged["success"] = (merged["reward"].fillna(0.0).astype(float) >= 1.0).astype(float)
    return merged[cols]


DELTA_COLUMNS = ["mode", "budget", "success", "delta", "low", "high", "tasks"]


def deltas(results: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Per rehearsal setting: success, its Δ vs N = 0 of the same mode's curve and the 95 %
    bootstrap CI over tasks, paired by task (a task's success rate over its repeats in both),
    as ``envace sweep`` prints and the study's test-time table computes (``stats``)."""

    rates = results.groupby(["mode", "budget", "task_id"])["success"].mean()
    by_setting = {key: dict(group.droplevel([0, 1])) for key, group in rates.groupby(level=[0, 1])}
    rows = []
    for (mode, n), mine in by_setting.items():
        plain = by_setting.get((mode, 0), {})
        est = paired_by_task(mine, plain, RESAMPLES, seed) if n else None
        if est is not None:
            success = sum(mine[t] for t in plain.keys() & mine.keys()) / est.n
            rows.append([mode, n, success, est.mean, est.low, est.high, est.n])
    return charts.rounded(pd.DataFrame(rows, columns=DELTA_COLUMNS))


def show_sweep(ctx: Studio, run_id: str | None) -> tuple[object, pd.DataFrame, pd.DataFrame, str]:
    """(chart, per-task table, Δ table, progress line) of one sweep run."""
    if not run_id:
        empty = pd.DataFrame()
        return charts.budget(empty), per_task(empty), _no_deltas(), "Pick or run a sweep."
    results = sweep_frame(ctx, run_id)
    progress = runs_page.progress_text(ctx, run_id) + _checked_note(ctx, run_id)
    return charts.budget(results), per_task(results), deltas(results), progress


def _checked_note(ctx: Studio, run_id: str) -> str:
    """Says so when the sweep's imagined calls passed the schema check first: a sweep with and
    one without it differ in what the imagined episodes show (docs/rehearsal.md)."""
    try:
        config = ctx.store.run(run_id).manifest.config
    except KeyError:
        return ""
    return " · imagined calls schema-checked (--check-calls)" if config.get("check_calls") else ""


def _no_deltas() -> pd.DataFrame:
    return pd.DataFrame(columns=DELTA_COLUMNS)


def sweep_target(ctx: Studio, run_id: str | None) -> tuple[str, str] | None:
    """(model, suite) a sweep run evaluated, from its manifest: the checkpoint a budget chosen
    from its results belongs to. None when no such run is picked."""
    if not run_id:
        return None
    try:
        manifest = ctx.store.run(run_id).manifest
    except (KeyError, ValueError):
        return None
    model = manifest.model or str(manifest.config.get("model", ""))
    return (model, manifest.suite) if model else None


def target_text(ctx: Studio, run_id: str | None) -> str:
    """The line above *Save budget*: which model and suite a save records."""
    target = sweep_target(ctx, run_id)
    if target is None:
        return "Pick a sweep run above: the budget is saved for the model that sweep evaluated."
    model, suite = target
    return f"Saves the budget for **`{model}`** on `{suite}`: the model sweep `{run_id}` evaluated."


def save_choice(
    ctx: Studio,
    user: str | None,
    run_id: str | None,
    budget: float | None,
    mode: str,
    note: str,
) -> tuple[str, pd.DataFrame]:
    """Record the budget chosen from sweep ``run_id``'s results for the model and suite that
    sweep evaluated (its manifest), not for whatever the sweep-launch form shows."""
    try:
        author = ctx.policy.author(user, "save a budget")
        target = sweep_target(ctx, run_id)
        if target is None:
            raise ValueError("pick the sweep run whose results you chose the budget from")
        if budget is None or int(budget) < 0:
            raise ValueError("budget must be a whole number of imagined episodes, 0 or more")
        model, suite = target
        ctx.store.save_budget(model, suite, int(budget), mode, author, (note or "").strip())
    except (AuthError, ValueError) as err:
        return f"**Not saved:** {err}", choices(ctx)
    return f"Saved budget N={int(budget)} ({mode}) for **{model}** on {suite}.", choices(ctx)


def choices(ctx: Studio) -> pd.DataFrame:
    """Saved budget choices, newest first (the first per model and suite is current)."""
    return ctx.store.budgets().reindex(columns=BUDGET_COLUMNS)


def poll(ctx: Studio, run_id: str | None) -> tuple[object, object, object, object]:
    """Timer handler: redraw only while the picked sweep's job is running (no flicker after)."""
    if run_id and runs_page.is_active(ctx, run_id):
        return show_sweep(ctx, run_id)
    return gr.update(), gr.update(), gr.update(), gr.update()


def build(ctx: Studio, user: gr.State, tab: gr.Tab) -> None:
    """Lay out the page and wire its events."""
    with gr.Row():
        model = gr.Dropdown(
            list(forms.MODEL_CHOICES),
            value=forms.DEFAULT_MODEL,
            allow_custom_value=True,
            label="model",
            elem_id="bud-model",
        )
        suite = gr.Dropdown(list(forms.SUITES), value="toy", label="suite")
        tasks = gr.Number(forms.default("tasks"), label="tasks", precision=0, elem_id="bud-tasks")
        budgets = gr.Textbox("0,1,2,4", label="budgets N", elem_id="bud-budgets")
        modes = gr.CheckboxGroup(
            list(forms.MODES), value=list(forms.MODES), label="modes", elem_id="bud-modes"
        )
        max_turns = gr.Number(
            forms.default("max_turns"),
            label="max replies per turn",
            precision=0,
            elem_id="bud-turns",
        )
        max_new = gr.Number(
            forms.default("max_new_tokens"),
            label="max new tokens",
            precision=0,
            elem_id="bud-tokens",
        )
    with gr.Row(equal_height=True):
        check = gr.Checkbox(
            forms.default("check_calls"),
            label="schema check before the world role",
            info="an imagined call the tool schemas refuse gets the real tools' error "
            "(docs/rehearsal.md, Checked calls)",
            elem_id="bud-check",
            scale=3,
        )
        go = gr.Button("Run sweep", variant="primary", elem_id="bud-run", scale=1)
    gr.Markdown(forms.limits_note(ctx.limits), elem_id="bud-limits")
    message = gr.Markdown(elem_id="bud-message")
    with gr.Row():
        pick = gr.Dropdown(
            sweep_runs(ctx),
            value=None,
            label="sweep run",
            allow_custom_value=True,
            elem_id="bud-pick",
            scale=3,
        )
        progress = gr.Markdown(elem_id="bud-progress")
    with gr.Row():
        plot = gr.Plot(
            label="success vs rehearsal tokens (± 1 s.e.)",
            elem_id="bud-chart",
            show_label=False,  # the chart's title says it; the badge would cover that title
            min_width=charts.PLOT_MIN_WIDTH,
        )
        table = gr.Dataframe(interactive=False, label="success per task", max_height=320)
    delta = gr.Dataframe(
        interactive=False,
        label="success Δ vs N = 0 (95 % CI over tasks, paired by task)",
        elem_id="bud-deltas",
    )
    gr.Markdown("### Choose a budget for this model")
    target = gr.Markdown(target_text(ctx, None), elem_id="bud-target")
    with gr.Row():
        chosen = gr.Number(2, label="budget N", precision=0, minimum=0)
        mode = gr.Radio(list(forms.MODES), value="parallel", label="mode")
        note = gr.Textbox(label="note", scale=2)
        save = gr.Button("Save budget", elem_id="bud-save")
    saved = gr.Markdown()
    history = gr.Dataframe(choices(ctx), interactive=False, label="saved budgets")
    timer = gr.Timer(3.0)
    form = {
        "model": model,
        "suite": suite,
        "tasks": tasks,
        "budgets": budgets,
        "modes": modes,
        "max_turns": max_turns,
        "max_new_tokens": max_new,
        "check_calls": check,
    }
    go.click(
        lambda u, *v: launch_sweep(ctx, u, dict(zip(form, v, strict=True))),
        [user, *form.values()],
        [message, pick],
    )
    shown = [plot, table, delta, progress]
    pick.change(lambda r: show_sweep(ctx, r), [pick], shown)
    pick.change(lambda r: target_text(ctx, r), [pick], [target])
    timer.tick(lambda r: poll(ctx, r), [pick], shown, show_progress="hidden")
    tab.select(lambda: (gr.update(choices=sweep_runs(ctx)), choices(ctx)), None, [pick, history])
    save.click(
        lambda u, *v: save_choice(ctx, u, *v),
        [user, pick, chosen, mode, note],
        [saved, history],
    )
