"""Home: what the studio holds and where to start."""

from __future__ import annotations

import gradio as gr

from envace_engine.models import registry
from studio.context import Studio

GUIDE = """\
## Where to start
1. **Runs & jobs** — launch a rollout, SFT, EnvACE training, the real-env baseline, an
   evaluation or a sweep; follow its progress and curves live.
2. **Trajectory inspector** — read an episode turn by turn: every tool call with the rehearsed
   response nested under it and the real one beside it; *Next failure* jumps to what went wrong.
3. **Rehearsed vs real** — where the internal world model disagrees with the real tools, by
   tool and by status.
4. **Annotate** — label rehearsals and episodes (keys 1–5); export the labels.
5. **Rehearsal budget** — success against rehearsal tokens per mode; save a budget per model.
6. **Live rehearse** — ask the model to rehearse a tool call and compare with the real tool.
"""


def overview(ctx: Studio) -> str:
    """Markdown summary: runs and episodes in storage, the models, the data folder."""
    runs = ctx.store.runs()
    episodes = ctx.store.count_episodes()
    lines = [
        "## Data",
        "",
        f"Data folder: `{ctx.root}` — {len(runs)} run(s), {episodes} episode(s)."
        if len(runs)
        else f"Data folder: `{ctx.root}` — no runs yet: launch one on *Runs & jobs*.",
        "",
        "## Models",
        "",
        "| name | what |",
        "|---|---|",
    ]
    lines += [f"| `{name}` | {about} |" for name, about in registry().items()]
    return "\n".join(lines)


def build(ctx: Studio) -> None:
    """Lay out the home page."""
    with gr.Row():
        gr.Markdown(GUIDE)
        # a callable value is re-run on every page load, so new runs show without a restart
        gr.Markdown(lambda: overview(ctx), elem_id="home-overview")
