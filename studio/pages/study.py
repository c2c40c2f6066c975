"""Study: the reproduction study's report — verdicts, the test-time table, curves, world model.

A study run (kind ``study``, written by ``envace study``) keeps ``report.json`` in its folder,
rewritten as arms and evaluations finish. This page only reads that file: the table is shaped
like the paper's test-time rehearsal table (checkpoint × setting: success, Δ vs N = 0, 95 %
bootstrap CIs over tasks), the curves put every arm on shared axes, and one verdict line per
claim says what came out. Deep link: ``/?tab=study&study=RUN_ID``.
"""

from __future__ import annotations

import json
from typing import Any

import altair as alt
import gradio as gr
import pandas as pd

from studio import charts
from studio.context import Studio
from studio.lazy import PageLoads, when_shown
from studio.pages import home

REPORT = "report.json"
# Curves the page offers: (label, metric name in report["curves"]).
CURVES = {
    "reward (training rollouts)": "reward/mean",
    "real success (training rollouts)": "success/real",
    "fidelity exact (training rollouts)": "fidelity/exact",
    "held-out real success": "heldout/success",
    "held-out rehearsed success": "heldout/rehearsed_success",
    "held-out fidelity exact": "heldout/fidelity_exact",
    "held-out real-response NLL": "heldout/real_nll",
    "rows with advantage ≠ 0 (act)": "adv/act/nonzero",
    "seconds per step": "perf/step_s",
}


def study_runs(ctx: Studio) -> list[str]:
    """Run ids of study runs, newest first."""
    df = ctx.store.runs()
    return [] if df.empty else list(df.loc[df["kind"] == "study", "run_id"])


def load_report(ctx: Studio, run_id: str | None) -> dict[str, Any] | None:
    """The study's ``report.json``, or None (no such run, or no report written yet)."""
    if not run_id:
        return None
    try:
        path = ctx.store.run_path(run_id) / REPORT
    except (KeyError, ValueError):
        return None
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def _pct(e: dict[str, float] | None, signed: bool = True) -> str:
    """An estimate in % with its CI; ``signed`` for differences (a level has no sign)."""
    if not e:
        return ""
    f = "+.1f" if signed else ".1f"
    return f"{e['mean'] * 100:{f}} [{e['low'] * 100:{f}}, {e['high'] * 100:{f}}]"


def _rounded(value: float | None) -> Any:
    """A number as every table shows it (``charts.round_number``; None stays None: an empty
    cell)."""
    return None if value is None else charts.round_number(float(value))


def header(report: dict[str, Any] | None, run_id: str | None) -> str:
    """Markdown: what the study is, its status, and one line per claim."""
    if report is None:
        if not run_id:
            return "No study selected. Run one with `envace study --config configs/study-toy.toml`."
        return f"Study `{run_id}` has no report yet: it appears when its first arm finishes."
    lines = [
        f"**{report['study_id']}** ({report['status']}) — suite `{report['suite']}`, "
        f"{report['steps']} steps per arm from `{report['model']}`. "
        + home.link_docs(report.get("cost", "")),  # "see docs/study.md": a link to the doc
        "",
    ]
    for v in report["verdicts"]:
        lines.append(f"* **{v['verdict']}** — {v['claim']}: {v['evidence']}")
    failed = [f"`{a}`: {s['reason']}" for a, s in report["arms"].items() if s["status"] == "failed"]
    if failed:
        lines += ["", "Failed arms: " + "; ".join(failed)]
    if "costs" in report:  # reports written before costs were recorded lack it
        so_far = "" if report.get("status") == "done" else " so far"
        costs = report["costs"]
        lines += ["", f"Measured cost{so_far}: {costs['total_h']:.2f} h."]
        if costs.get("lanes", 1) > 1:  # units ran side by side: the wall time is less
            lines[-1] += f" Run in {costs['lanes']} lanes: {costs['wall_h']:.2f} h wall time."
    return "\n".join(lines)


def table_frame(report: dict[str, Any] | None) -> pd.DataFrame:
    """The test-time table: one row per checkpoint and setting (success in %)."""
    columns = [
        "checkpoint",
        "setting",
        "success %",
        "95% CI",
        "Δ vs N=0 [CI]",
        "effect",
        "real calls",
        "invalid calls",
    ]
    if report is None or not report["table"]:
        return pd.DataFrame(columns=columns)
    rows = []
    for r in report["table"]:
        s = r["success"]
        rows.append(
            {
                "checkpoint": r["checkpoint"],
                "setting": r["setting"],
                "success %": round(s["mean"] * 100, 1),
                "95% CI": f"[{s['low'] * 100:.1f}, {s['high'] * 100:.1f}]",
                "Δ vs N=0 [CI]": _pct(r["delta"]),
                "effect": r.get("effect") or "",  # reports before effects were judged lack it
                "real calls": _rounded(r["real_calls"]),
                "invalid calls": _rounded(r.get("invalid_calls")),
            }
        )
    frame = pd.DataFrame(rows, columns=columns)
    # real calls the tools rejected: studies evaluated before they were counted lack them
    return frame if frame["invalid calls"].notna().any() else frame.drop(columns="invalid calls")


def world_frame(report: dict[str, Any] | None) -> pd.DataFrame:
    """Per checkpoint: fidelity, real-response NLL and success real vs rehearsed."""
    columns = ["checkpoint", "exact", "status agree", "real NLL", "real %", "rehearsed %", "gap"]
    if report is None or not report["world"]:
        return pd.DataFrame(columns=columns)
    rows = []
    for w in report["world"]:
        rows.append(
            {
                "checkpoint": w["checkpoint"],
                "exact": _rounded(w["exact"]),
                "status agree": _rounded(w["status_agree"]),
                "real NLL": _rounded(w["real_nll"]),
                "real %": _pct(w.get("real_success"), signed=False),
                "rehearsed %": _pct(w["rehearsed_success"], signed=False),
                "gap": _pct(w.get("gap")),
            }
        )
    return pd.DataFrame(rows, columns=columns)


def curve_frame(report: dict[str, Any] | None, metric: str) -> pd.DataFrame:
    """Long frame (arm, step, value) of one curve metric over every arm."""
    rows = []
    for arm, points in (report or {}).get("curves", {}).items():
        for step, values in points.items():
            if metric in values:
                rows.append({"arm": arm, "step": int(step), "value": values[metric]})
    return pd.DataFrame(rows, columns=["arm", "step", "value"])


def curve_chart(frame: pd.DataFrame, label: str) -> alt.Chart:
    """Every arm's curve of one metric on shared axes, each arm in its app-wide colour."""
    if frame.empty:
        return charts.empty(f"no {label} yet: it appears as the arms train")
    return charts.series(frame, "arm", label, label, charts.WIDTH + 180, "arm")


def show(ctx: Studio, run_id: str | None, label: str) -> tuple[str, Any, Any, Any]:
    """Everything the page shows for one study and one curve."""
    report = load_report(ctx, run_id)
    metric = CURVES.get(label, "reward/mean")
    chart = curve_chart(curve_frame(report, metric), label)
    return header(report, run_id), table_frame(report), world_frame(report), chart


def refresh(ctx: Studio, run_id: str | None, label: str) -> tuple[Any, ...]:
    """The page when its tab is shown: the study menu lists studies started since the page
    loaded, and the shown study is drawn again (its report grows as arms and evaluations end)."""
    fresh = study_runs(ctx)
    chosen = run_id or (fresh[0] if fresh else None)
    return (gr.update(choices=fresh, value=chosen), *show(ctx, chosen, label))


def build(ctx: Studio, tab: gr.Tab, loads: PageLoads) -> None:
    """Lay out the study page and wire it (``loads``: for the ``?study=`` deep link on load)."""
    runs = study_runs(ctx)
    # The landing page: say what the demo is and what its words mean before the verdicts.
    with gr.Accordion("What this demo is", open=True, elem_id="study-about"):
        about = gr.Markdown()
    when_shown(loads, tab, "study", lambda: home.about_demo(ctx, heading=False), [about])
    home.glossary("study-glossary")
    with gr.Row():
        pick = gr.Dropdown(
            runs,
            value=runs[0] if runs else None,
            label="study",
            allow_custom_value=True,
            elem_id="study-pick",
        )
        curve = gr.Dropdown(
            list(CURVES), value="held-out real success", label="curve", elem_id="study-curve"
        )
    summary = gr.Markdown(elem_id="study-verdicts")
    gr.Markdown("### Test-time rehearsal on held-out tasks (real tools)")
    table = gr.Dataframe(interactive=False, elem_id="study-table", max_height=420)
    plot = gr.Plot(label="arms on shared axes", elem_id="study-curves", show_label=False)
    gr.Markdown("### World model: held-out rehearsal without references")
    world = gr.Dataframe(interactive=False, elem_id="study-world")
    outputs = [summary, table, world, plot]
    # .input: a user's pick; the load's own update of the menu must not draw the page again
    pick.input(lambda r, c: show(ctx, r, c), [pick, curve], outputs)
    curve.input(lambda r, c: show(ctx, r, c), [pick, curve], outputs)
    tab.select(lambda r, c: refresh(ctx, r, c), [pick, curve], [pick, *outputs])

    def deep_link(c: str, request: gr.Request) -> tuple[Any, ...]:
        params = request.query_params if request is not None else {}
        return refresh(ctx, params.get("study"), c)

    loads.on("study", deep_link, [curve], [pick, *outputs])
