"""Altair chart builders: pure functions from query DataFrames to charts (rendered by gr.Plot),
and the display conventions every page shares: one colour per arm, run or mode wherever it is
drawn, and numbers rounded the same way in tables, markdown, axes and tooltips.

Every builder accepts an empty frame and returns a chart that says there is nothing to draw yet,
so a page never shows a blank box or an exception while a job has not reported anything.
"""

from __future__ import annotations

import hashlib
import math
import textwrap
from collections.abc import Iterable

import altair as alt
import numpy as np
import pandas as pd

# Vega "container" width collapses inside gr.Plot: sizes are fixed pixels. A chart plus its
# y axis fits half of a 1200-pixel page, so pages lay charts out two per row.
WIDTH = 420
HEIGHT = 240
PLOT_MIN_WIDTH = 540  # a gr.Plot narrower than its chart clips it: its Row wraps instead

# The study's arms and checkpoints, and the rehearsal modes, keep these colours on every chart
# (Tableau 10, a palette readers with colour-vision deficiencies tell apart best among the
# common ones). Other names take a palette colour from a hash of the name: stable across
# charts and restarts (Python's own hash() is salted per process).
PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#e15759",
    "#76b7b2",
    "#59a14f",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)
FIXED_COLOURS = {
    "envace": "#f28e2b",
    "real-grpo": "#e15759",
    "act-only": "#4e79a7",
    "shared-baseline": "#76b7b2",
    "simulator": "#b07aa1",
    "sft": "#59a14f",
    "base": "#9c755f",
    "parallel": "#4e79a7",
    "sequential": "#e15759",
    "select": "#f28e2b",
}
DIGITS = 3


def colour_key(name: str) -> str:
    """The name a colour is looked up by: a study's arm run ``<study>--<arm>`` (or
    ``<study>--<arm>-rK``, a redone arm) is coloured as its arm, so the Study page's ``envace``
    and Compare runs' ``study-toy--envace`` are drawn alike."""
    arm = name.rsplit("--", 1)[-1]
    base = arm.rsplit("-r", 1)[0] if arm.rsplit("-r", 1)[-1].isdigit() else arm
    return base if base in FIXED_COLOURS else name


def colour(name: str) -> str:
    """The colour ``name`` (an arm, a run id, a mode, a metric) gets on every chart."""
    key = colour_key(name)
    if key in FIXED_COLOURS:
        return FIXED_COLOURS[key]
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return PALETTE[int.from_bytes(digest[:4], "big") % len(PALETTE)]


def colour_scale(names: Iterable[str]) -> alt.Scale:
    """An explicit scale giving each of ``names`` its ``colour``; two names of one chart that
    would share a colour (two studies' ``envace`` runs, a hash collision) get the next free
    palette colour, in sorted order, so a chart never draws two series alike."""
    domain = sorted({str(n) for n in names})
    used: set[str] = set()
    colours = []
    for name in domain:
        pick = colour(name)
        if pick in used:
            free = [c for c in PALETTE if c not in used]
            start = PALETTE.index(pick) if pick in PALETTE else 0
            pick = next((c for c in PALETTE[start:] + PALETTE[:start] if c in free), pick)
        used.add(pick)
        colours.append(pick)
    return alt.Scale(domain=domain, range=colours)


def round_number(value: object, digits: int = DIGITS) -> object:
    """``value`` rounded for display: ``digits`` decimal places, or ``digits`` significant
    digits when it is smaller than that (1e-17 stays visible, not 0.0). Anything that is not a
    float (ints, text, None, NaN) is returned as is."""
    if not isinstance(value, (float, np.floating)) or not math.isfinite(value):
        return value
    value = float(value)
    if value == 0 or abs(value) >= 10**-digits:
        return round(value, digits)
    return float(f"{value:.{digits}g}")


def fmt(value: object, digits: int = DIGITS) -> str:
    """``value`` as markdown text, rounded as ``round_number`` does (``-`` for missing)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return str(round_number(value, digits))


def rounded(df: pd.DataFrame, digits: int = DIGITS) -> pd.DataFrame:
    """A copy of ``df`` whose float columns are rounded for display (``round_number``)."""
    out = df.copy()
    for col in out.columns:
        if pd.api.types.is_float_dtype(out[col]) or out[col].dtype == object:
            out[col] = out[col].map(lambda v: round_number(v, digits))
    return out


def number_format(values: Iterable[float]) -> str:
    """A d3 format for an axis or tooltip over ``values``: three decimals, or three
    significant digits in exponent form when every value is below 0.001 (an advantage mean of
    1e-17 would otherwise print as a row of zeros)."""
    finite = [abs(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    if finite and 0 < max(finite) < 10**-DIGITS:
        return ".3~e"
    return ",.3~f"


def empty(message: str, width: int = WIDTH) -> alt.Chart:
    """A chart holding only ``message`` (what to do to get data), wrapped to the chart's width
    so a long reason is not cut off at its edges."""
    lines = textwrap.wrap(message, max(20, width // 8)) or [""]
    return (
        alt.Chart(pd.DataFrame({"text": ["\n".join(lines)]}))
        .mark_text(size=14, color="#666", lineBreak="\n")
        .encode(text="text:N")
        .properties(width=width, height=40 + 18 * len(lines))
    )


def legend(names: Iterable[str], title: str) -> alt.Legend:
    """A legend under the chart that wraps into columns instead of running off its edge, and
    never truncates a label."""
    count = len(set(names))
    return alt.Legend(
        orient="bottom", title=title, columns=min(count, 3) or 1, labelLimit=0, symbolLimit=0
    )


def series(
    df: pd.DataFrame, by: str, title: str, y_title: str, width: int = WIDTH, by_title: str = ""
) -> alt.Chart:
    """Lines of ``value`` over ``step``, one per ``by`` value, each in its app-wide colour."""
    names = df[by].astype(str)
    fmt_y = number_format(df["value"])
    return (
        alt.Chart(df[["step", by, "value"]], title=title)
        .mark_line(point=True)
        .encode(
            x=alt.X("step:Q", title="step", axis=alt.Axis(format="d", tickMinStep=1)),
            y=alt.Y("value:Q", title=y_title, axis=alt.Axis(format=fmt_y, labelLimit=0)),
            color=alt.Color(
                f"{by}:N", scale=colour_scale(names), legend=legend(names, by_title or by)
            ),
            tooltip=[f"{by}:N", "step:Q", alt.Tooltip("value:Q", format=fmt_y)],
        )
        .properties(width=width, height=HEIGHT)
    )


def curves(
    df: pd.DataFrame,
    prefixes: tuple[str, ...] = (),
    title: str = "",
    width: int = WIDTH,
    empty_message: str | None = None,
) -> alt.Chart:
    """Lines of ``value`` over ``step``, one colour per metric ``name``.

    ``prefixes`` keeps only metrics whose name starts with one of them (e.g. ``("reward/",)``
    for reward per role), so one page can show reward, fidelity and loss as separate charts.
    ``empty_message`` says why there is nothing to draw (the default suits a run in progress).
    """
    if prefixes and not df.empty:
        df = df[df["name"].astype(str).str.startswith(prefixes)]
    if df.empty:
        message = empty_message or f"no {title or 'metrics'} yet: they appear after the first step"
        return empty(message, width)
    return series(df, "name", title, title or "value", width, "metric")


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


def fitted_domain(low: Iterable[float], high: Iterable[float], pad: float = 0.05) -> list[float]:
    """A y domain around the data (error bars included) with ``pad`` of room, kept inside
    [0, 1]: success rates that differ by a few points stay apart instead of flat on a 0-1
    axis."""
    lo, hi = min(low), max(high)
    room = max(pad, (hi - lo) * 0.1)
    return [max(0.0, round(lo - room, 3)), min(1.0, round(hi + room, 3))]


def budget(df: pd.DataFrame) -> alt.Chart:
    """Success against rehearsal tokens per mode, one point per budget, ± 1 s.e. error bars,
    on a y axis fitted to the points and their error bars."""
    summary = budget_summary(df)
    if summary.empty:
        return empty("no sweep results yet: run a sweep job")
    scale = alt.Scale(domain=fitted_domain(summary["lo"], summary["hi"]), zero=False)
    modes = summary["mode"].astype(str)
    base = alt.Chart(summary, title="success vs rehearsal tokens (± 1 s.e.)").encode(
        x=alt.X("rehearsal_tokens:Q", title="rehearsal tokens per task (mean)"),
        color=alt.Color(
            "mode:N", scale=colour_scale(modes), legend=legend(modes, "rehearsal mode")
        ),
    )
    line = base.mark_line(point=alt.OverlayMarkDef(size=60), clip=True).encode(
        y=alt.Y("success:Q", title="success rate", scale=scale),
        tooltip=[
            "mode:N",
            "budget:Q",
            alt.Tooltip("success:Q", format=".3f"),
            alt.Tooltip("sem:Q", format=".3f"),
            "n:Q",
        ],
    )
    bars = base.mark_errorbar(clip=True).encode(
        y=alt.Y("lo:Q", title="success rate", scale=scale), y2="hi:Q"
    )
    labels = base.mark_text(dy=-12).encode(
        y=alt.Y("success:Q", scale=scale), text=alt.Text("budget:Q", format="d")
    )
    return (line + bars + labels).properties(width=WIDTH, height=HEIGHT)


COLLUSION_NAMES = {
    "echo_rate": "echo rate",
    "error_recall": "error recall",
    "errors_as_success": "errors rehearsed as success",
    "wrong_answer_taken": "answer from a wrong rehearsal",
}


def collusion(df: pd.DataFrame, gap: pd.DataFrame, run_id: str, width: int = WIDTH) -> alt.Chart:
    """The collusion rates over steps (``storage.collusion``) beside the rehearsed-vs-real
    success gap (the held-out probe's ``heldout/gap``, where the run has one); a click on a
    rate's point opens that step's worst episode in the inspector."""
    if df.empty:
        return empty("no rehearsed/real pairs: nothing to count collusion on", width)
    long = df.melt(
        id_vars=["step", "worst_episode", "worst_events"],
        value_vars=list(COLLUSION_NAMES),
        var_name="name",
        value_name="value",
    ).dropna(subset=["value"])
    long["name"] = long["name"].map(COLLUSION_NAMES)
    long["link"] = [
        f"?tab=inspector&run={run_id}&episode={e}" if isinstance(e, str) and e else ""
        for e in long["worst_episode"]
    ]
    if not gap.empty:
        extra = gap.assign(name="rehearsed − real success gap (held-out)", link="")
        extra = extra.assign(worst_episode="", worst_events=0)[list(long.columns)]
        long = pd.concat([long, extra], ignore_index=True)
    names = long["name"].astype(str)
    return (
        alt.Chart(long, title="collusion (click a point: the step's worst episode)")
        .mark_line(point=alt.OverlayMarkDef(size=60, cursor="pointer"))
        .encode(
            x=alt.X("step:Q", title="step", axis=alt.Axis(format="d", tickMinStep=1)),
            y=alt.Y("value:Q", title="rate", axis=alt.Axis(format=".2f", labelLimit=0)),
            color=alt.Color("name:N", scale=colour_scale(names), legend=legend(names, "")),
            href="link:N",
            tooltip=[
                "name:N",
                "step:Q",
                alt.Tooltip("value:Q", format=".3f"),
                alt.Tooltip("worst_episode:N", title="worst episode"),
                alt.Tooltip("worst_events:Q", title="its colluding events"),
            ],
        )
        .properties(width=width, height=HEIGHT)
    )
