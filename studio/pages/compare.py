"""Rehearsed vs real: every (rehearsed, real) pair with its fidelity tiers, a side-by-side JSON
diff of the selected pair, aggregates by tool and by status (error/success confusion matrix),
and fidelity over training steps."""

from __future__ import annotations

import difflib
import html
import json
import math
from typing import Any

import gradio as gr
import pandas as pd

from studio import charts
from studio.context import Studio

PAGE_SIZE = 50
OPEN = "inspector ↗"  # the cell that opens the pair's episode in the inspector
PAIR_COLUMNS = [
    "open",
    "call_id",
    "step",
    "tool",
    "rehearsed_status",
    "real_status",
    "parse_valid",
    "status_agree",
    "exact",
    "key_jaccard",
    "value_match",
    "text_similarity",
    "fidelity",
]


def _side(value: Any, error: Any, message: Any) -> str:
    """Canonical display text of one response: indented JSON, or ``error CODE: message``."""
    if isinstance(error, str) and error:
        return (
            f"error {error}: {message}"
            if isinstance(message, str) and message
            else f"error {error}"
        )
    if not isinstance(value, str):
        return "(none)"
    try:
        return json.dumps(json.loads(value), indent=2, sort_keys=True, ensure_ascii=False)
    except ValueError:
        return value


def diff_rows(left: str, right: str) -> list[tuple[str, str, str]]:
    """Aligned lines (kind, left line, right line); kind is ``same``, ``changed``, ``left`` or
    ``right`` (a line present only on that side)."""
    a, b = left.splitlines(), right.splitlines()
    rows: list[tuple[str, str, str]] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op == "equal":
            rows += [("same", x, y) for x, y in zip(a[i1:i2], b[j1:j2], strict=True)]
        elif op == "replace":
            n = max(i2 - i1, j2 - j1)
            left_part = a[i1:i2] + [""] * (n - (i2 - i1))
            right_part = b[j1:j2] + [""] * (n - (j2 - j1))
            rows += [("changed", x, y) for x, y in zip(left_part, right_part, strict=True)]
        elif op == "delete":
            rows += [("left", x, "") for x in a[i1:i2]]
        else:
            rows += [("right", "", y) for y in b[j1:j2]]
    return rows


def diff_html(left: str, right: str) -> str:
    """Side-by-side HTML table: rehearsed on the left, real on the right, differences marked."""
    cells = []
    for kind, x, y in diff_rows(left, right):
        lcls = "del" if kind in ("changed", "left") else ""
        rcls = "add" if kind in ("changed", "right") else ""
        cells.append(
            f'<tr><td class="{lcls}">{html.escape(x)}</td>'
            f'<td class="{rcls}">{html.escape(y)}</td></tr>'
        )
    return (
        '<div class="json-diff"><table><tr><th>rehearsed</th><th>real</th></tr>'
        + "".join(cells)
        + "</table></div>"
    )


def pairs_table(
    ctx: Studio,
    run_id: str | None,
    tool: str,
    status: str | None,
    fidelity_min: float | None,
    fidelity_max: float | None,
    page: float = 1,
) -> pd.DataFrame:
    """One page of pairs matching the filters."""
    # The slider ends mean "no bound", so pairs without a score are not dropped by default.
    low = fidelity_min if fidelity_min else None
    high = fidelity_max if fidelity_max is not None and fidelity_max < 1 else None
    df = ctx.store.pairs(
        run_id=run_id or None,
        tool=(tool or "").strip() or None,
        status=status or None,
        fidelity_min=low,
        fidelity_max=high,
        limit=PAGE_SIZE,
        offset=max(0, int(page or 1) - 1) * PAGE_SIZE,
    )
    out = df.reindex(columns=PAIR_COLUMNS)
    out["open"] = OPEN
    for col in ("key_jaccard", "value_match", "text_similarity", "fidelity"):
        out[col] = out[col].astype(float).round(3)
    return out


def pair_detail(ctx: Studio, call_id: str) -> tuple[str, str]:
    """(header Markdown, diff HTML) for one pair, by call id ``<episode id>/<call index>``."""
    episode, _, index = call_id.rpartition("/")
    try:
        calls = ctx.store.episode(episode).calls
    except KeyError:
        return f"No episode `{episode}` for call `{call_id}`.", ""
    match = calls[calls["call_index"].astype(str) == index]
    if match.empty:
        return f"Episode `{episode}` has no call {index}.", ""
    row = match.iloc[0].to_dict()
    left = _side(
        row.get("rehearsed_json"), row.get("rehearsed_error"), row.get("rehearsed_message")
    )
    right = _side(row.get("real_json"), row.get("real_error"), row.get("real_message"))
    fid = row.get("fidelity")
    score = f"{fid:.3f}" if isinstance(fid, float) and not math.isnan(fid) else "—"
    head = (
        f"**{row.get('tool')}** `{row.get('arguments_json')}` · fidelity **{score}** · "
        f"status {row.get('rehearsed_status')} vs {row.get('real_status')} · "
        f"[open episode](?tab=inspector&episode={episode}) · "
        f"[annotate](?tab=annotate&call={call_id})"
    )
    return head, diff_html(left, right)


def aggregates(ctx: Studio, run_id: str | None) -> tuple[object, object, object, pd.DataFrame]:
    """(by-tool chart, confusion chart, fidelity-over-steps chart, by-tool table)."""
    if not run_id:
        blank = charts.empty("pick a run to see its aggregates")
        return blank, blank, blank, pd.DataFrame()
    tools = ctx.store.fidelity_by_tool(run_id)
    steps = ctx.store.fidelity_over_steps(run_id)
    tiers = ["mean_fidelity", "status_agree", "exact", "value_match"]
    long = (
        steps.melt(id_vars=["step"], value_vars=tiers, var_name="name", value_name="value")
        if not steps.empty
        else pd.DataFrame(columns=["step", "name", "value"])
    )
    return (
        charts.by_tool(tools, "mean_fidelity"),
        charts.confusion(ctx.store.status_confusion(run_id)),
        charts.curves(long, (), "fidelity over training steps", 760),
        tools.round(3),
    )


def build(ctx: Studio, tab: gr.Tab) -> None:
    """Lay out the page and wire its events; queries wait until the tab is opened."""
    runs = ctx.store.runs()
    with gr.Row():
        run = gr.Dropdown(
            [] if runs.empty else list(runs["run_id"]),
            value=None,  # filled when the tab is opened (see first_view)
            label="run",
            allow_custom_value=True,
            elem_id="cmp-run",
        )
        tool = gr.Textbox(label="tool")
        status = gr.Dropdown(["", "ok", "error"], value="", label="real status")
        fmin = gr.Slider(0, 1, 0, step=0.05, label="fidelity ≥")
        fmax = gr.Slider(0, 1, 1, step=0.05, label="fidelity ≤")
        page = gr.Number(1, label="page", precision=0, minimum=1)
    table = gr.Dataframe(
        pd.DataFrame(columns=PAIR_COLUMNS), interactive=False, max_height=260, elem_id="pairs-table"
    )
    head = gr.Markdown("Click a pair to compare its responses.", elem_id="pair-head")
    diff = gr.HTML(elem_id="pair-diff")
    with gr.Row():
        tool_plot = gr.Plot(label="fidelity by tool")
        conf_plot = gr.Plot(label="status confusion", elem_id="cmp-confusion")
    step_plot = gr.Plot(label="fidelity over steps")
    tool_table = gr.Dataframe(interactive=False, label="by tool", max_height=200)
    filters = [run, tool, status, fmin, fmax, page]
    for control in filters:
        # gradio adds the event methods at runtime; its types do not declare them on the
        # FormComponent base that mypy joins these components to.
        control.change(lambda *v: pairs_table(ctx, *v), filters, table)  # type: ignore[attr-defined]
    run.change(lambda r: aggregates(ctx, r), [run], [tool_plot, conf_plot, step_plot, tool_table])

    nav = gr.Textbox(visible=False)

    def pick(evt: gr.SelectData, df: pd.DataFrame, run_id: str | None) -> tuple[Any, ...]:
        row, col = evt.index if isinstance(evt.index, (list, tuple)) else (evt.index, 0)
        call_id = str(df.iloc[row]["call_id"])
        if df.columns[col] == "open":  # go to the episode (a deep link: the URL says where)
            episode_id = call_id.rpartition("/")[0]
            return gr.update(), gr.update(), f"?tab=inspector&run={run_id}&episode={episode_id}"
        return (*pair_detail(ctx, call_id), "")

    table.select(pick, [table, run], [head, diff, nav]).then(
        None, [nav], None, js="(q) => { if (q) window.location.search = q; }"
    )

    def first_view(current_run: str | None) -> tuple[object, ...]:
        fresh = ctx.store.runs()
        choices = list(fresh["run_id"])  # runs may have appeared since the app was built
        if current_run:  # already filled: keep the user's choice
            return (gr.update(choices=choices), *(gr.update() for _ in range(5)))
        # Rehearsal pairs come from training runs; prefer one so the page opens on data.
        ranked = sorted(fresh.to_dict("records"), key=lambda r: r["kind"] not in ("train", "demo"))
        run_id = ranked[0]["run_id"] if ranked else None
        return (
            gr.update(choices=choices, value=run_id),
            pairs_table(ctx, run_id, "", "", 0, 1, 1),
            *aggregates(ctx, run_id),
        )

    tab.select(first_view, [run], [run, table, tool_plot, conf_plot, step_plot, tool_table])
