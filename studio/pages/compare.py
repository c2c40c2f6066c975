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

from storage.queue import QueueFilter
from studio import charts
from studio.context import Studio
from studio.pages.inspector import PAGE_SIZE, address, clamp_page, lookup

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


def pair_count(
    ctx: Studio,
    run_id: str,
    tool: str | None,
    status: str | None,
    low: float | None,
    high: float | None,
) -> int:
    """How many pairs of the run pass the filters (the queue's count: the same filters)."""
    f = QueueFilter(
        run_id=run_id,
        author="",
        tool=tool,
        real_status=status,
        fidelity_min=low,
        fidelity_max=high,
        scope="all",
    )
    return ctx.store.queue.progress(f)[1]


def pairs_table(
    ctx: Studio,
    run_id: str | None,
    tool: str,
    status: str | None,
    fidelity_min: float | None,
    fidelity_max: float | None,
    page: Any = 1,
) -> tuple[pd.DataFrame, str, int]:
    """One page of the run's pairs matching the filters, a pager line and the page shown (an
    out-of-range page shows the nearest one, and the pager says so)."""
    if not run_id:  # a pair's address is (run, call): list one run's
        return pd.DataFrame(columns=PAIR_COLUMNS), "Pick a run to list its pairs.", 1
    # The slider ends mean "no bound", so pairs without a score are not dropped by default.
    low = fidelity_min if fidelity_min else None
    high = fidelity_max if fidelity_max is not None and fidelity_max < 1 else None
    chosen_tool, chosen_status = (tool or "").strip() or None, status or None
    total = pair_count(ctx, run_id, chosen_tool, chosen_status, low, high)
    shown, pages, note = clamp_page(page, total)
    df = ctx.store.pairs(
        run_id=run_id,
        tool=chosen_tool,
        status=chosen_status,
        fidelity_min=low,
        fidelity_max=high,
        limit=PAGE_SIZE,
        offset=(shown - 1) * PAGE_SIZE,
    )
    out = df.reindex(columns=PAIR_COLUMNS)
    out["open"] = OPEN
    for col in ("key_jaccard", "value_match", "text_similarity", "fidelity"):
        out[col] = out[col].astype(float).round(3)
    return out, f"{total} pair(s) · page {shown} of {pages}{note}", shown


def pair_detail(ctx: Studio, call_id: str, run_id: str | None) -> tuple[str, str]:
    """(header Markdown, diff HTML) for one pair: call ``<episode id>/<call index>`` of
    ``run_id`` (ids repeat across runs; without a run the episode must be in one only)."""
    episode = (call_id or "").rpartition("/")[0]
    view, why = lookup(ctx, episode, run_id)
    if view is None:
        return f"Call `{call_id}`: {why}", ""
    return pair_of(view, call_id)


def pair_of(view: Any, call_id: str) -> tuple[str, str]:
    """(header Markdown, diff HTML) for call ``call_id`` of an opened episode (an empty diff
    when the episode has no such call)."""
    run_id = str(view.episode["run_id"])
    episode, _, index = call_id.rpartition("/")
    calls = view.calls
    match = calls[calls["call_index"].astype(str) == index]
    if match.empty:
        return f"Episode `{episode}` of run `{run_id}` has no call {index}.", ""
    row = match.iloc[0].to_dict()
    left = _side(
        row.get("rehearsed_json"), row.get("rehearsed_error"), row.get("rehearsed_message")
    )
    right = _side(row.get("real_json"), row.get("real_error"), row.get("real_message"))
    fid = row.get("fidelity")
    score = f"{fid:.3f}" if isinstance(fid, float) and not math.isnan(fid) else "—"
    head = (
        f"run `{run_id}` · **{row.get('tool')}** `{row.get('arguments_json')}` · "
        f"fidelity **{score}** · status {row.get('rehearsed_status')} vs "
        f"{row.get('real_status')} · [open episode]({address('inspector', run_id, episode)}) · "
        f"[annotate]({address('annotate', run_id, call_id=call_id)})"
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
    """Lay out the page and wire its events; queries wait until the tab is opened
    (``?tab=compare&run=RUN`` opens on that run, ``&call=EP/IDX`` on that pair too)."""
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
        # no minimum: gradio would answer 0 with an error pill; pairs_table clamps and says so
        page = gr.Number(1, label="page", precision=0, elem_id="cmp-page")
    pager = gr.Markdown(elem_id="cmp-pager")
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
    charts_out = [tool_plot, conf_plot, step_plot, tool_table]
    listed = [table, pager, page]

    def first_page(
        run_id: str | None, tool: str, status: str | None, low: Any, high: Any, _page: Any
    ) -> tuple[pd.DataFrame, str, int]:
        return pairs_table(ctx, run_id, tool, status, low, high, 1)

    for control in filters[:-1]:
        # gradio adds the event methods at runtime; its types do not declare them on the
        # FormComponent base that mypy joins these components to.
        # .input: a user's edit (the tab's own fill, and the clamped page, must not list
        # again); new filters list from their first page
        control.input(first_page, filters, listed)  # type: ignore[attr-defined]
    page.input(lambda *v: pairs_table(ctx, *v), filters, listed)
    run.input(lambda r: aggregates(ctx, r), [run], charts_out)

    nav = gr.Textbox(visible=False)

    def pick(evt: gr.SelectData, df: pd.DataFrame, run_id: str | None) -> tuple[Any, ...]:
        row, col = evt.index if isinstance(evt.index, (list, tuple)) else (evt.index, 0)
        call_id = str(df.iloc[row]["call_id"])
        if df.columns[col] == "open" and run_id:  # go to the episode (the URL says where)
            episode_id = call_id.rpartition("/")[0]
            return gr.update(), gr.update(), address("inspector", run_id, episode_id)
        return (*pair_detail(ctx, call_id, run_id), "")  # the listed run's pair

    table.select(pick, [table, run], [head, diff, nav]).then(
        None, [nav], None, js="(q) => { if (q) window.location.search = q; }"
    )

    def first_view(current_run: str | None, request: gr.Request) -> tuple[object, ...]:
        fresh = ctx.store.runs()
        choices = list(fresh["run_id"])  # runs may have appeared since the app was built
        if current_run:  # already filled: keep the user's choice
            return (gr.update(choices=choices), *(gr.update() for _ in range(5)))
        params = dict(request.query_params) if request else {}
        linked = params.get("run") if params.get("tab") == "compare" else None
        # Rehearsal pairs come from training runs; prefer one so the page opens on data.
        ranked = sorted(fresh.to_dict("records"), key=lambda r: r["kind"] not in ("train", "demo"))
        run_id = linked or (ranked[0]["run_id"] if ranked else None)
        call = params.get("call", "") if linked else ""
        detail = pair_detail(ctx, call, run_id) if call else (gr.update(), gr.update())
        return (
            gr.update(choices=choices, value=run_id),
            *pairs_table(ctx, run_id, "", "", 0, 1, 1),
            *detail,
        )

    drawn = gr.State(None)  # the run whose aggregates are on screen

    def first_aggregates(run_id: str | None, shown: str | None) -> tuple[object, ...]:
        if run_id == shown:  # a return to the tab: they are there already
            return (*(gr.update() for _ in charts_out), shown)
        return (*aggregates(ctx, run_id), run_id)

    # the pairs first, the aggregates after them: the page shows its table without waiting
    # for three charts and a table of per-tool means
    tab.select(first_view, [run], [run, table, pager, page, head, diff]).then(
        first_aggregates, [run, drawn], [*charts_out, drawn]
    )
