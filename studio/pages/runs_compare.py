"""Compare runs: two or more runs' curves on shared axes, and per task who solved it.

Pick runs (deep link ``?tab=runs-compare&runs=A,B``); one curve metric is drawn for every run
on the same axes (a reward first; the menu is grouped by prefix and searchable); the task table
gives each run's success rate per task and, for the first two runs, which solved it (``A
only``, ``B only``, ``both``, ``neither``); a click on a task opens the first two runs' episodes
on it side by side (each run's first success, else first try).
"""

from __future__ import annotations

from typing import Any

import altair as alt
import gradio as gr
import pandas as pd

from studio import charts
from studio.context import Studio
from studio.lazy import PageLoads
from studio.pages import inspector
from studio.pages.runs import run_choices

OUTCOMES = ("all", "A only", "B only", "both", "neither")


def shared_curves(curves: dict[str, pd.DataFrame], metric: str) -> alt.Chart:
    """One line per run for ``metric`` over steps (``curves``: each run's ``store.curves``),
    each run in its app-wide colour."""
    frames = [df[df["name"] == metric].assign(run=run_id) for run_id, df in curves.items()]
    data = pd.concat(frames) if frames else pd.DataFrame()
    if data.empty:
        return charts.empty(f"no {metric} in these runs")
    return charts.series(data, "run", metric, metric, charts.WIDTH + 200)


# Curves a reader looks at first, in this order; every other metric follows, grouped by its
# prefix (``adv/``, ``fidelity/``, ...) with the groups read first leading.
FIRST_CURVES = ("reward/act", "reward/mean", "success/real", "loss")
FIRST_GROUPS = ("reward", "success", "fidelity", "heldout", "loss")


def group_of(metric: str) -> str:
    """A metric's group: the part of its name before the first ``/``."""
    return metric.split("/", 1)[0]


def metric_order(metric: str) -> tuple[int, str, str]:
    """Sort key: groups read first lead, then the other groups alphabetically; by name within."""
    group = group_of(metric)
    rank = FIRST_GROUPS.index(group) if group in FIRST_GROUPS else len(FIRST_GROUPS)
    return rank, group, metric


def metrics_of(curves: dict[str, pd.DataFrame]) -> list[str]:
    """Curve metrics every chosen run logged, grouped by prefix (``metric_order``)."""
    names = [set(df["name"]) for df in curves.values()]
    return sorted(set.intersection(*names), key=metric_order) if names else []


def default_metric(names: list[str]) -> str:
    """The curve shown first: a reward, else a success rate, else the loss, else the first."""
    for wanted in FIRST_CURVES:
        if wanted in names:
            return wanted
    for prefix in ("reward/", "success/"):
        found = next((n for n in names if n.startswith(prefix)), None)
        if found:
            return found
    return next(iter(names), "")


def outcome(a: float | None, b: float | None) -> str:
    """Who solved a task at least once: ``A only``, ``B only``, ``both`` or ``neither``."""
    solved_a, solved_b = bool(a and a > 0), bool(b and b > 0)
    return {(True, True): "both", (True, False): "A only", (False, True): "B only"}.get(
        (solved_a, solved_b), "neither"
    )


def task_table(ctx: Studio, run_ids: list[str], which: str) -> tuple[pd.DataFrame, str]:
    """(per-task success % per run with the A/B outcome, message)."""
    try:
        wide = ctx.store.comparison.task_outcomes(run_ids)
    except ValueError as err:
        return pd.DataFrame(columns=["task_id"]), f"**Compare:** {err}"
    a, b = run_ids[0], run_ids[1]
    wide["outcome"] = [outcome(x, y) for x, y in zip(wide[a], wide[b], strict=True)]
    counts = wide["outcome"].value_counts().to_dict()
    if which != "all":
        wide = wide[wide["outcome"] == which]
    for r in run_ids:
        wide[r] = (wide[r] * 100).round(1)
    summary = ", ".join(f"{k}: {counts.get(k, 0)}" for k in OUTCOMES[1:])
    return wide, f"A = `{a}`, B = `{b}` · {summary} tasks · success % per run"


def side_by_side(ctx: Studio, run_ids: list[str], task_id: str) -> tuple[Any, ...]:
    """(header A, chat A, header B, chat B) for one task."""
    out: list[Any] = []
    for run_id in run_ids[:2]:
        episode_id = ctx.store.comparison.task_episode(run_id, task_id)
        if episode_id is None:
            out += [f"`{run_id}` never tried `{task_id}`.", []]
            continue
        chat, summary, _, _ = inspector.open_episode(ctx, episode_id, run_id)
        link = f"[open in inspector](?tab=inspector&run={run_id}&episode={episode_id})"
        out += [f"**{run_id}** · {link}\n\n{summary}", chat]
    return tuple(out)


def build(ctx: Studio, loads: PageLoads) -> None:
    """Lay out the page and wire its events. A deep link (``?tab=runs-compare&runs=A,B``) fills
    it with the page load; the run menu is filled then too."""
    runs = gr.Dropdown(
        run_choices(ctx), multiselect=True, label="runs (A, B, …)", elem_id="cmp-runs"
    )
    with gr.Row():
        metric = gr.Dropdown(
            [],
            label="curve (type to search)",
            filterable=True,
            elem_id="cmp-metric",
            scale=2,
        )
        which = gr.Radio(list(OUTCOMES), value="all", label="tasks", elem_id="cmp-which")
    plot = gr.Plot(label="curves on shared axes", elem_id="cmp-plot", show_label=False)
    message = gr.Markdown(elem_id="cmp-message")
    table = gr.Dataframe(interactive=False, max_height=300, elem_id="cmp-tasks")
    with gr.Row():
        with gr.Column():
            head_a = gr.Markdown(elem_id="cmp-head-a")
            chat_a = gr.Chatbot(label="A", height=420, elem_id="cmp-chat-a")
        with gr.Column():
            head_b = gr.Markdown(elem_id="cmp-head-b")
            chat_b = gr.Chatbot(label="B", height=420, elem_id="cmp-chat-b")

    def refresh(run_ids: list[str] | None, chosen: str | None, kind: str) -> tuple[Any, ...]:
        run_ids = list(run_ids or [])
        if len(run_ids) < 2:
            return gr.update(), None, "Pick two or more runs.", pd.DataFrame()
        curves = {r: ctx.store.curves(r) for r in run_ids}  # read once, for the menu and chart
        names = metrics_of(curves)
        pick = chosen if chosen in names else default_metric(names)
        df, msg = task_table(ctx, run_ids, kind)
        chart = shared_curves(curves, pick) if pick else charts.empty("no shared curves")
        return gr.update(choices=names, value=pick or None), chart, msg, df

    for control in (runs, metric, which):
        control.input(refresh, [runs, metric, which], [metric, plot, message, table])

    def pick(evt: gr.SelectData, df: pd.DataFrame, run_ids: list[str]) -> tuple[Any, ...]:
        row = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        return side_by_side(ctx, list(run_ids), str(df.iloc[row]["task_id"]))

    table.select(pick, [table, runs], [head_a, chat_a, head_b, chat_b])

    def from_link(request: gr.Request) -> tuple[Any, ...]:
        params = request.query_params if request else {}
        wanted = params.get("runs", "")
        run_ids = [r for r in wanted.split(",") if r]
        if len(run_ids) < 2:
            return (gr.update(),) * 5
        return (gr.update(choices=run_choices(ctx), value=run_ids), *refresh(run_ids, None, "all"))

    loads.on("runs-compare", from_link, (), [runs, metric, plot, message, table])
