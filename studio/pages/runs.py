"""Runs & jobs: every run with its status and key numbers, the launch form, live progress and
curves of the selected run, cancel and resume. A timer polls the job files every two seconds."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from typing import cast

import gradio as gr
import pandas as pd
import tomli_w

from envace_engine.environments.vita.comparable import comparability
from envace_engine.tracking import tracker_note
from studio import charts, forms
from studio.auth import AuthError
from studio.context import Studio
from studio.jobs import ACTIVE, JobError, format_duration
from studio.lazy import PageLoads, when_shown
from studio.space import LimitError

# Key columns first (the table scrolls sideways past them); ``run_id`` and ``status`` stay
# pinned. ``steps`` is the run's own count (progress.json: steps done); ``episode steps`` counts
# the steps whose episodes are stored, which for the bundled runs is only their last few.
RUN_COLUMNS = [
    "run_id",
    "status",
    "steps",
    "mean reward",
    "episodes",
    "kind",
    "suite",
    "model",
    "episode steps",
    "progress",
]
COLUMN_WIDTHS: list[str | int] = [
    "270px",
    "90px",
    "70px",
    "110px",
    "90px",
    "80px",
    "80px",
    "320px",
    "120px",
    "200px",
]
PINNED = 2
POLL_S = 2.0


def step_counts(df: pd.DataFrame) -> pd.Series:
    """A run's steps: its progress report's count when it has one (a study arm keeps episodes
    of its last steps only, so counting stored steps undercounts), else the stored steps."""
    episode_steps = df["steps"].fillna(0).astype(int)
    if "total" not in df or "done" not in df:
        return episode_steps
    total = df["total"].fillna(0).astype(int)
    done = df["done"].fillna(0).astype(int)
    return done.where(total > 0, episode_steps)


def runs_table(ctx: Studio) -> pd.DataFrame:
    """All runs, newest first, with status taken from the live job when the studio started it."""
    df = ctx.store.runs()
    if df.empty:
        return pd.DataFrame(columns=RUN_COLUMNS)
    live = {v.record.run_id: v for v in ctx.jobs.jobs()}
    df = df.copy()
    df["episode steps"] = df["steps"].fillna(0).astype(int)
    df["steps"] = step_counts(df)
    df["status"] = [
        live[r].record.status if r in live else s
        for r, s in zip(df["run_id"], df["status"], strict=True)
    ]
    df["progress"] = [live[r].label if r in live else "" for r in df["run_id"]]
    df["mean reward"] = df["mean_reward"].astype(float)
    return charts.rounded(df.reindex(columns=RUN_COLUMNS))


def unreadable_note(ctx: Studio) -> str:
    """A warning naming every run folder or shard this build could not read, and why (empty
    when everything was read): the pages then lack those rows, and say so here."""
    bad = ctx.store.unreadable()
    if bad.empty:
        return ""
    lines = [
        f"**⚠️ {len(bad)} thing(s) in the data folder could not be read** (left out of every page):"
    ]
    lines += [f"- `{r.run}` · {r.what}: {r.reason}" for r in bad.itertuples()]
    lines.append("`envace runs list` says the same from the command line.")
    return "\n".join(lines)


def jobs_table(ctx: Studio) -> pd.DataFrame:
    """Jobs the studio started (live and finished), newest first."""
    rows = [
        {
            "run_id": v.record.run_id,
            "kind": v.record.kind,
            "status": v.record.status,
            "progress": v.label,
            "pid": v.record.pid,
        }
        for v in ctx.jobs.jobs()
    ]
    return pd.DataFrame(rows, columns=["run_id", "kind", "status", "progress", "pid"])


def launch(ctx: Studio, user: str | None, values: dict[str, object]) -> tuple[str, str | None]:
    """Validate the form (``FORM_FIELDS`` names) and start the job; (message, run id)."""
    try:
        ctx.policy.author(user, "launch jobs")
        modes = cast(Iterable[object], values.get("modes") or ())  # a CheckboxGroup's list
        request = forms.parse({**values, "modes": tuple(modes)})
    except (AuthError, forms.FormError) as err:
        lines = "\n".join(f"- {line}" for line in str(err).splitlines())
        return f"**Cannot launch:**\n\n{lines}", None
    return start(ctx, request)


def start(ctx: Studio, request: forms.LaunchRequest) -> tuple[str, str | None]:
    """Start a validated request as a job: its job file first, then the command on it."""
    try:
        for model in filter(None, (request.model, request.user)):
            if not model.startswith("openai+"):  # an outside endpoint runs nothing here
                ctx.limits.check_model(model)
    except LimitError as err:
        return f"**Cannot launch:** {err}", None

    run_id = ctx.jobs.new_run_id(request.kind)
    run_dir = ctx.jobs.run_dir(run_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(tomli_w.dumps(request.config(ctx.root, run_id)))
    try:
        record = ctx.jobs.launch(
            request.kind, request.argv(), run_id=run_id, resumable=request.kind in forms.RESUMABLE
        )
    except JobError as err:
        return f"**Cannot launch:** {err}", None
    return f"Launched **{record.run_id}** ({forms.KINDS[request.kind]}).", record.run_id


def is_active(ctx: Studio, run_id: str | None) -> bool:
    """Whether ``run_id`` is a studio job that is running or ended moments ago (so the last
    poll after it ends still draws its final numbers)."""
    if not run_id:
        return False
    try:
        view = ctx.jobs.get(run_id)
    except JobError:
        return False
    recent = view.record.ended_at is not None and time.time() - view.record.ended_at < 3 * POLL_S
    return view.record.status in ACTIVE or recent


# what a run's progress counts, by its kind (evaluations and rollouts count episodes)
COUNTED_IN = {"eval": "episode", "rollout": "episode"}


def progress_text(ctx: Studio, run_id: str | None) -> str:
    """Markdown progress line for the selected run: step x of N, ETA, or how it ended."""
    if not run_id:
        return "Select a run to follow its progress."
    try:
        view = ctx.jobs.get(run_id)
    except JobError:
        try:
            info = ctx.store.run(run_id)
        except KeyError:
            return f"No run `{run_id}` in the data folder."
        prog = info.progress
        unit = COUNTED_IN.get(info.manifest.kind, "step")
        where = f" — {unit} {prog.done} of {prog.total}" if prog.total else ""
        # "step 40/40" repeats the counts just given
        said = prog.message if prog.message != f"step {prog.done}/{prog.total}" else ""
        return f"**{run_id}**: {prog.status or 'no progress report'}{where} {said}".rstrip()
    elapsed = (view.record.ended_at or view.progress.updated_at or view.record.started_at) - (
        view.progress.started_at or view.record.started_at
    )
    return f"**{run_id}** — {view.label} (elapsed {format_duration(elapsed)})"


def tracker_text(ctx: Studio, run_id: str | None) -> str:
    """Where the selected run's tracker copy is, and what a VitaBench run's scores can be
    compared with, from its stored manifest (empty when neither applies)."""
    if not run_id:
        return ""
    try:
        manifest = ctx.store.run(run_id).manifest
    except (KeyError, ValueError):
        return ""
    notes = (tracker_note(manifest.config, run_id), comparability(manifest.suite, manifest.config))
    return "\n\n".join(n for n in notes if n)


# Rates in [0, 1] only: counts such as fidelity/pairs would flatten the scale.
REWARD_CURVES = ("reward/act", "reward/rehearse", "success/real")
FIDELITY_CURVES = (
    "fidelity/score",
    "fidelity/exact",
    "fidelity/parse_valid",
    "fidelity/status_agree",
)

# Sampler vs trainer log-probs on the trained tokens (training.optimize.Mismatch): numerics only.
MISMATCH_CURVES = ("rollout/logprob_diff", "rollout/mismatch_kl")
# (chart title, metric prefixes) of the run page's charts, two per row.
CURVE_CHARTS = (
    ("reward per role", REWARD_CURVES),
    ("fidelity", FIDELITY_CURVES),
    ("loss", ("loss",)),
    ("sampler vs trainer log-probs", MISMATCH_CURVES),
)
CURVE_WIDTH = 440  # with its axis and legend, half of a 1200-pixel page
COLLUSION_WIDTH = 900  # a row of its own: four rates, the gap and a long legend
ENDED = frozenset({"done", "failed", "cancelled", "lost", "paused"})
TRAINS_NOTHING = "it trains nothing, so it logs no {chart} per step"
# Why a finished run has no curves for a chart, by (chart, run kind or training mode).
WHY_EMPTY = {
    ("fidelity", "real-grpo"): "it ran the real tools and rehearsed no call, so it has no "
    "rehearsed/real pairs to compare",
    ("fidelity", "sft"): "SFT trains on reference trajectories: no rollouts, so no "
    "rehearsed/real pairs",
    ("fidelity", "eval"): "an evaluation scores fidelity once, not per step: see "
    "the Rehearsed vs real page",
    ("fidelity", "sweep"): "a sweep records results per setting: see the Rehearsal budget page",
    ("fidelity", "rollout"): "its rollouts recorded no rehearsed/real pairs",
    ("reward per role", "sweep"): "a sweep records success per setting: see the Rehearsal "
    "budget page",
    ("reward per role", "eval"): "an evaluation records its results once, not per step",
}


def run_state(ctx: Studio, run_id: str) -> tuple[str, str, str]:
    """(kind, training mode, status) of a run; the live job's status when the studio runs it."""
    try:
        info = ctx.store.run(run_id)
    except (KeyError, ValueError):
        return "", "", ""
    status = info.progress.status
    with contextlib.suppress(JobError):
        status = ctx.jobs.get(run_id).record.status
    return info.manifest.kind, str(info.manifest.config.get("mode", "")), status


def empty_reason(chart: str, kind: str, mode: str, status: str) -> str:
    """What an empty chart says: "not yet" while the run goes on; once it has ended, that it
    never will, and why where the run's kind or mode says so."""
    if status not in ENDED:
        return f"no {chart} yet: they appear after the first step"
    why = WHY_EMPTY.get((chart, mode)) or WHY_EMPTY.get((chart, kind))
    if why is None and kind in ("eval", "sweep", "rollout") and chart != "fidelity":
        why = TRAINS_NOTHING.format(chart=chart)
    ended = f"this {kind or 'run'} run ended ({status}) with no {chart} curves"
    if why is None and chart == "fidelity":
        why = "it recorded no rehearsed/real pairs"
    return f"{ended}: {why}" if why else ended


def curve_charts(ctx: Studio, run_id: str | None) -> tuple[object, ...]:
    """Reward per role, fidelity, loss and sampler/trainer mismatch curves of one run, and its
    collusion panel."""
    df = ctx.store.curves(run_id) if run_id else pd.DataFrame(columns=["step", "name", "value"])
    kind, mode, status = run_state(ctx, run_id) if run_id else ("", "", "")
    curves = tuple(
        charts.curves(df, prefixes, title, CURVE_WIDTH, empty_reason(title, kind, mode, status))
        for title, prefixes in CURVE_CHARTS
    )
    return (*curves, collusion_chart(ctx, run_id, df, kind, mode, status))


def collusion_chart(
    ctx: Studio, run_id: str | None, curves: pd.DataFrame, kind: str, mode: str, status: str
) -> object:
    """The run's collusion rates per step, computed from its stored calls (so runs recorded
    before the trainer logged them have them too), beside its held-out success gap."""
    if not run_id:
        return charts.empty("pick a run", COLLUSION_WIDTH)
    rates = ctx.store.collusion.over_steps(run_id)
    if rates.empty:
        return charts.empty(empty_reason("fidelity", kind, mode, status), COLLUSION_WIDTH)
    gap = curves[curves["name"] == "heldout/gap"][["step", "value"]]
    return charts.collusion(rates, gap, run_id, COLLUSION_WIDTH)


def cancel(ctx: Studio, user: str | None, run_id: str | None) -> str:
    """Cancel the selected run's job."""
    try:
        ctx.policy.author(user, "cancel jobs")
        if not run_id:
            return "Select a run first."
        record = ctx.jobs.cancel(run_id)
    except (AuthError, JobError) as err:
        return f"**Cannot cancel:** {err}"
    return f"**{run_id}** {record.message}."


def resume(ctx: Studio, user: str | None, run_id: str | None) -> str:
    """Resume the selected run's stopped job from its last checkpoint."""
    try:
        ctx.policy.author(user, "resume jobs")
        if not run_id:
            return "Select a run first."
        record = ctx.jobs.resume(run_id)
    except (AuthError, JobError) as err:
        return f"**Cannot resume:** {err}"
    return f"Resumed **{record.run_id}** (pid {record.pid})."


def run_choices(ctx: Studio) -> list[str]:
    """Run ids for the run selector, newest first."""
    df = ctx.store.runs()
    return [] if df.empty else list(df["run_id"])


def chart_plot(label: str, elem_id: str) -> gr.Plot:
    """A chart's box: at least as wide as the chart (a Row too narrow for two wraps them one
    per row instead of clipping axes and legends), its label badge hidden because it would sit
    over the chart's own title."""
    return gr.Plot(label=label, elem_id=elem_id, show_label=False, min_width=charts.PLOT_MIN_WIDTH)


def build(ctx: Studio, user: gr.State, tab: gr.Tab, loads: PageLoads) -> None:
    """Lay out the page and wire its events."""
    with gr.Row():
        with gr.Column(scale=3):
            gr.Markdown("### Runs")
            # drawn each time the page is shown: a fixed or new problem shows at once
            problems = gr.Markdown(elem_id="runs-unreadable")
            when_shown(loads, tab, "runs", lambda: unreadable_note(ctx), [problems])
            runs = gr.Dataframe(
                runs_table(ctx),
                elem_id="runs-table",
                interactive=False,
                max_height=320,
                column_widths=COLUMN_WIDTHS,
                pinned_columns=PINNED,
            )
            gr.Markdown("### Jobs started here")
            jobs = gr.Dataframe(
                jobs_table(ctx), elem_id="jobs-table", interactive=False, max_height=200
            )
        with gr.Column(scale=2), gr.Group():
            gr.Markdown("### Launch a job")
            kind = gr.Dropdown(
                [(f"{k}: {v}", k) for k, v in forms.KINDS.items()],
                value=forms.DEFAULT_KIND,
                label="job",
                elem_id="launch-kind",
            )
            with gr.Row():
                model = gr.Dropdown(
                    list(forms.MODEL_CHOICES),
                    value=forms.DEFAULT_MODEL,
                    allow_custom_value=True,
                    label="model",
                    elem_id="launch-model",
                )
                suite = gr.Dropdown(list(forms.SUITES), value="toy", label="task suite")
                sim_user = gr.Textbox(
                    "",
                    label="simulated user (tau2, vita eval)",
                    placeholder="model or openai+http://HOST:PORT; empty: scripted opening",
                    elem_id="launch-user",
                )
                judge = gr.Textbox(
                    "",
                    label="judge (tau2, vita eval or sweep)",
                    placeholder="model or http://HOST:PORT; empty: stored unscored",
                    elem_id="launch-judge",
                )
            with gr.Row():
                steps = gr.Number(
                    forms.default("steps"),
                    label="training steps",
                    precision=0,
                    elem_id="launch-steps",
                )
                episodes = gr.Number(
                    forms.default("episodes"),
                    label="episodes / repeats",
                    precision=0,
                    elem_id="launch-episodes",
                )
                group = gr.Number(forms.default("group"), label="group size", precision=0)
                tasks = gr.Number(
                    forms.default("tasks"), label="tasks", precision=0, elem_id="launch-tasks"
                )
            with gr.Row():
                max_turns = gr.Number(
                    forms.default("max_turns"),
                    label="max agent replies per turn",
                    precision=0,
                    elem_id="launch-turns",
                )
                max_new = gr.Number(
                    forms.default("max_new_tokens"),
                    label="max new tokens per reply",
                    precision=0,
                    elem_id="launch-tokens",
                )
            with gr.Row():
                budgets = gr.Textbox("0,1,2", label="budgets (sweep)")
                modes = gr.CheckboxGroup(
                    list(forms.MODES), value=["parallel"], label="rehearsal modes (sweep)"
                )
            gr.Markdown(forms.limits_note(ctx.limits), elem_id="launch-limits")
            go = gr.Button("Launch", variant="primary", elem_id="launch-button")
            launched = gr.Markdown(elem_id="launch-message")
    gr.Markdown("### Selected run")
    with gr.Row():
        pick = gr.Dropdown(
            run_choices(ctx), label="run", elem_id="run-pick", scale=3, allow_custom_value=True
        )
        stop = gr.Button("Cancel", variant="stop", scale=1, elem_id="cancel-button")
        again = gr.Button("Resume", scale=1, elem_id="resume-button")
    progress = gr.Markdown(progress_text(ctx, None), elem_id="run-progress")
    tracker = gr.Markdown(elem_id="run-tracker")
    # Two charts per row, each at least as wide as its chart (a narrower page wraps them one per
    # row rather than clipping axes and legends); the chart's own title names it, so the
    # component's label badge, which would sit over that title, is hidden.
    with gr.Row():
        reward_plot = chart_plot("reward per role", "run-reward")
        fidelity_plot = chart_plot("fidelity", "run-fidelity")
    with gr.Row():
        loss_plot = chart_plot("loss", "run-loss")
        gap_plot = chart_plot("sampler vs trainer log-probs (|Δ|, KL)", "run-mismatch")
    with gr.Row():
        collusion_plot = chart_plot("collusion", "run-collusion")
    timer = gr.Timer(POLL_S)

    form = {
        "kind": kind,
        "model": model,
        "suite": suite,
        "user": sim_user,
        "judge": judge,
        "steps": steps,
        "episodes": episodes,
        "group": group,
        "tasks": tasks,
        "max_turns": max_turns,
        "max_new_tokens": max_new,
        "budgets": budgets,
        "modes": modes,
    }

    def on_launch(u: str | None, *values: object) -> tuple[object, ...]:
        message, run_id = launch(ctx, u, dict(zip(form, values, strict=True)))
        if run_id is None:
            return message, gr.update()
        return message, gr.update(choices=run_choices(ctx) or [run_id], value=run_id)

    go.click(
        on_launch,
        [user, *form.values()],
        [launched, pick],
    )

    def refresh(run_id: str | None) -> tuple[object, ...]:
        return (
            runs_table(ctx),
            jobs_table(ctx),
            progress_text(ctx, run_id),
            *curve_charts(ctx, run_id),
            tracker_text(ctx, run_id),
        )

    drawn = gr.State(None)  # the run whose curves are on screen

    def tick(run_id: str | None, shown: str | None) -> tuple[object, ...]:
        # Charts are redrawn while the run's job is live, or once for a run not yet drawn (the
        # dropdown's initial value fires no change event): no flicker, no wasted queries.
        fresh = is_active(ctx, run_id) or shown != run_id
        charts_now = curve_charts(ctx, run_id) if fresh else (gr.update(),) * 5
        note = tracker_text(ctx, run_id) if fresh else gr.update()
        tables = (runs_table(ctx), jobs_table(ctx), progress_text(ctx, run_id))
        return (*tables, *charts_now, note, run_id)

    plots = [reward_plot, fidelity_plot, loss_plot, gap_plot, collusion_plot]
    outputs = [runs, jobs, progress, *plots, tracker]
    timer.tick(tick, [pick, drawn], [*outputs, drawn], show_progress="hidden")
    pick.change(refresh, [pick], outputs, show_progress="hidden")
    stop.click(lambda u, r: cancel(ctx, u, r), [user, pick], [launched])
    again.click(lambda u, r: resume(ctx, u, r), [user, pick], [launched])
