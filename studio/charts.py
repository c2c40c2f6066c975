"""Altair chart builders: pure functions from query DataFrames to charts (rendered by gr.Plot).

Every builder accepts an empty frame and returns a chart that says there is nothing to draw yet,
so a page never shows a blank box or an exception while a job has not reported anything.
"""

from __future__ import annotations

import math

import altair as alt
import pandas as pd

WIDTH = 420  # vega "container" width collapses inside gr.Plot: sizes are fixed pixels
HEIGHT = 240


def empty(message: str, width: int = WIDTH) -> alt.Chart:
    """A chart holding only ``message`` (what to do to get data)."""
    return (
        alt.Chart(pd.DataFrame({"text": [message]}))
        .mark_text(size=14, color="#666")
        .encode(text="text:N")
        .properties(width=width, height=60)
    )


def curves(
    df: pd.DataFrame, prefixes: tuple[str, ...] = (), title: str = "", width: int = WIDTH
) -> alt.Chart:
    """Lines of ``value`` over ``step``, one colour per metric ``name``.

    ``prefixes`` keeps only metrics whose name starts with one of them (e.g. ``("reward/",)``
    for reward per role), so one page can show reward, fidelity and loss as separate charts.
    """
    if prefixes and not df.empty:
        df = df[df["name"].astype(str).str.startswith(prefixes)]
    if df.empty:
        return empty(f"no {title or 'metrics'} yet: they appear after the first step", width)
    return (
        alt.Chart(df[["step", "name", "value"]], title=title)
        .mark_line(point=True)
        .encode(
            x=alt.X("step:Q", title="step", axis=alt.Axis(format="d", tickMinStep=1)),
            y=alt.Y("value:Q", title=title or "value"),
            # legend below: three curve charts share one row on the runs page
            color=alt.Color("name:N", title="metric", legend=alt.Legend(orient="bottom")),
            tooltip=["step:Q", "name:N", alt.Tooltip("value:Q", format=".3f")],
        )
        .properties(width=width, height=HEIGHT)
    )


def confusion(df: pd.DataFrame) -> alt.Chart:
    """Heatmap of predicted (rehearsed) status against real status, with pair counts.

    Columns: ``predicted_status``, ``real_status``, ``n`` (storage's ``status_confusion``).
    """
    if df.empty:
        return empty("no rehearsed/real pairs in this run")
    base = alt.Chart(df, title="rehearsed vs real status").encode(
        x=alt.X("real_status:N", title="real response"),
        y=alt.Y("predicted_status:N", title="rehearsed response"),
    )
    cells = base.mark_rect().encode(
        color=alt.Color("n:Q", scale=alt.Scale(scheme="blues"), title="pairs")
    )
    text = base.mark_text(fontSize=16).encode(text="n:Q")
    return (cells + text).properties(width=300, height=200)


def by_tool(df: pd.DataFrame, value: str = "mean_fidelity") -> alt.Chart:
    """Horizontal bars of mean fidelity ``value`` per tool, with the pair count in the tooltip."""
    if df.empty:
        return empty("no tool calls with both a rehearsed and a real response")
    return (
        alt.Chart(df, title=f"mean fidelity ({value}) by tool")
        .mark_bar()
        .encode(
            x=alt.X(f"{value}:Q", scale=alt.Scale(domain=[0, 1]), title=value),
            y=alt.Y("tool:N", sort="-x", title="tool"),
            tooltip=list(df.columns),
        )
        .properties(width=WIDTH, height=max(80, 22 * len(df)))
    )


def budget_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per (mode, budget): mean success, its standard error, mean rehearsal tokens, n.

    Standard error = sample std / sqrt(n) (0 for one sample): the error bar is mean ± 1 s.e.
    """
    cols = ["mode", "budget", "success", "sem", "rehearsal_tokens", "n"]
    if df.empty:
        return pd.DataFrame(columns=cols)
    grouped = df.groupby(["mode", "budget"], as_index=False).agg(
        success=("success", "mean"),
        std=("success", "std"),
        rehearsal_tokens=("rehearsal_tokens", "mean"),
        n=("success", "size"),
    )
    grouped["sem"] = [
        0.0 if n < 2 or math.isnan(s) else s / math.sqrt(n)
        for s, n in zip(grouped["std"], grouped["n"], strict=True)
    ]
    grouped["lo"] = grouped["success"] - grouped["sem"]
    grouped["hi"] = grouped["success"] + grouped["sem"]
    return grouped[[*cols, "lo", "hi"]]


def budget(df: pd.DataFrame) -> alt.Chart:
    """Success against rehearsal tokens per mode, one point per budget, ± 1 s.e. error bars."""
    summary = budget_summary(df)
    if summary.empty:
        return empty("no sweep results yet: run a sweep job")
    base = alt.Chart(summary, title="success vs rehearsal tokens").encode(
        x=alt.X("rehearsal_tokens:Q", title="rehearsal tokens per task (mean)"),
        color=alt.Color("mode:N", title="rehearsal mode"),
    )
    line = base.mark_line(point=alt.OverlayMarkDef(size=60)).encode(
        y=alt.Y("success:Q", title="success rate", scale=alt.Scale(domain=[0, 1])),
        tooltip=[
            "mode:N",
            "budget:Q",
            alt.Tooltip("success:Q", format=".2f"),
            alt.Tooltip("sem:Q", format=".2f"),
            "n:Q",
        ],
    )
    bars = base.mark_errorbar().encode(y=alt.Y("lo:Q", title="success rate"), y2="hi:Q")
    labels = base.mark_text(dy=-12).encode(y="success:Q", text=alt.Text("budget:Q", format="d"))
    return (line + bars + labels).properties(width=WIDTH, height=HEIGHT)
