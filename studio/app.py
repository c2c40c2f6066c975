"""The Gradio app: builds the pages and launches the server.

Heavy work (rollouts, training, live rehearsal) runs in subprocesses; this process only reads
storage and files, so it never imports torch.

Deep links: ``/?tab=inspector&episode=EPISODE_ID`` opens the trajectory inspector on an episode,
``/?tab=study&study=RUN_ID`` the study page on a study, ``/?tab=home&doc=study.md`` a doc of
``docs/`` rendered on Home (every "docs/NAME.md" the pages mention links there); ``?tab=`` alone
selects a page (ids in ``PAGES``). The study page comes first: a fresh studio opens on the
bundled study's report, under a header saying what the demo is.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import gradio as gr

from studio import space
from studio.auth import AuthError, AuthPolicy
from studio.context import Studio
from studio.lazy import QUEUE_LOADS, PageLoads
from studio.pages import (
    annotate,
    budget,
    compare,
    home,
    inspector,
    rehearse,
    runs,
    runs_compare,
    study,
)
from studio.space import HostLimits

TITLE = "EnvACE Studio"
PAGES = {
    "home": "Home",
    "study": "Study",
    "runs": "Runs & jobs",
    "inspector": "Trajectory inspector",
    "compare": "Rehearsed vs real",
    "runs-compare": "Compare runs",
    "annotate": "Annotate",
    "budget": "Rehearsal budget",
    "rehearse": "Live rehearse",
}
CSS = """
#title h1 { margin-bottom: 0; }
.json-diff { font-family: ui-monospace, monospace; font-size: 12px; white-space: pre-wrap; }
.json-diff .del { background: #ffe0e0; } .json-diff .add { background: #dcffdc; }
.json-diff table { width: 100%; border-collapse: collapse; }
.json-diff td { vertical-align: top; width: 50%; padding: 4px; border: 1px solid #ddd; }
"""
# Keyboard labelling on the Annotate page: every label has a key, its number in the list (shown
# beside it: 1-5 for a call, 1-6 for an episode). While the queue shows a pair (its diff is on
# the page) the keys label the queue's pair, Enter saves and moves on, Alt+Left goes back;
# once the form below was last clicked or focused (#annot-form) they pick the form's label,
# as they do whenever the queue shows nothing. Ctrl+Enter saves the form. Ignored while typing
# in a text field, so notes can hold digits and new lines.
HEAD = """
<script>
// ?tab=PAGE opens that page: the app's config (set just above this script, read by the app's
// module script after it) gets the page as the selected tab, so the page mounts first; no
// other page mounts and fires its handlers before a switch.
(() => {
  const want = new URLSearchParams(location.search).get("tab");
  const config = window.gradio_config;
  if (!want || !config || !(__PAGE_IDS__).includes(want)) return;
  const tabs = (config.components || []).find(
    (c) => c.type === "tabs" && c.props && c.props.elem_id === "pages");
  if (tabs) tabs.props.selected = want;
})();
</script>
<script>
(() => {
  let inForm = false;  // where the user last worked: the queue (default) or the form below
  const track = (e) => { inForm = !!(e.target.closest && e.target.closest("#annot-form")); };
  document.addEventListener("pointerdown", track, true);
  document.addEventListener("focusin", track, true);
  document.addEventListener("keydown", (e) => {
    const page = document.querySelector("#annotate-page");
    if (!page || page.offsetParent === null) return;
    const typing = ["TEXTAREA", "INPUT", "SELECT"].includes(e.target.tagName)
      && e.target.type !== "radio";
    const queue = !!document.querySelector("#queue-diff table") && !inForm;
    const click = (sel) => { document.querySelector(sel)?.click(); e.preventDefault(); };
    if (e.ctrlKey && e.key === "Enter") return click("#annot-save");
    if (typing || e.ctrlKey || e.metaKey) return;
    if (queue && e.altKey && e.key === "ArrowLeft") return click("#queue-back");
    if (e.altKey) return;
    if (queue && e.key === "Enter") return click("#queue-save");
    if (!/^[1-9]$/.test(e.key)) return;
    const boxes = document.querySelectorAll(
      queue ? "#queue-label input[type=radio]" : "#annot-label input[type=radio]");
    const n = Number(e.key);
    if (n <= boxes.length) { boxes[n - 1].click(); e.preventDefault(); }
  });
})();
</script>
"""


HEAD = HEAD.replace("__PAGE_IDS__", json.dumps(list(PAGES)))


def data_root(root: str | None = None) -> Path:
    """The studio's data folder: runs, the DuckDB file, job logs."""
    return Path(root or os.environ.get("ENVACE_HOME") or "runs").resolve()


def sign_in(policy: AuthPolicy, name: str, password: str) -> tuple[str | None, str]:
    """Password-mode sign-in handler: (session user, banner)."""
    try:
        user = policy.sign_in((name or "").strip(), password or "")
    except AuthError as err:
        return None, f"**Sign-in failed:** {err}"
    return user, policy.banner(user)


def hf_identity(profile: gr.OAuthProfile | None) -> str | None:
    """The Hugging Face user name on Spaces (gradio injects the OAuth profile)."""
    return profile.username if profile is not None else None


def _auth_bar(ctx: Studio, demo: gr.Blocks, user: gr.State) -> None:
    banner = gr.Markdown(ctx.policy.banner(None), elem_id="auth-banner")
    if ctx.policy.mode == "password":
        with gr.Accordion("Sign in", open=False, elem_id="sign-in"), gr.Row():
            name = gr.Textbox(label="user", elem_id="sign-in-user", scale=2)
            secret = gr.Textbox(label="password", type="password", elem_id="sign-in-pass", scale=2)
            go = gr.Button("Sign in", elem_id="sign-in-button", scale=1)
        go.click(lambda n, p: sign_in(ctx.policy, n, p), [name, secret], [user, banner])
    elif ctx.policy.mode == "hf":
        gr.LoginButton()

        def identify(profile: gr.OAuthProfile | None) -> tuple[str | None, str]:
            who = hf_identity(profile)
            return who, ctx.policy.banner(who)

        demo.load(identify, None, [user, banner], queue=QUEUE_LOADS)


def build_app(
    root: str | None = None, policy: AuthPolicy | None = None, limits: HostLimits | None = None
) -> gr.Blocks:
    """Assemble every page into one Blocks app."""
    ctx = Studio.open(data_root(root), policy, limits)
    loads = PageLoads()  # every page's load handler, sent as one request (studio.lazy)
    with gr.Blocks(title=TITLE) as demo:
        user = gr.State(None)
        gr.Markdown(f"# {TITLE}\nWorld-rehearsal RL for LLM tool-use agents.", elem_id="title")
        _auth_bar(ctx, demo, user)
        with gr.Tabs(elem_id="pages"):
            # Home first: a new visitor lands on what the demo is; and the first tab is mounted
            # on every page load before ?tab= switches, so it must be light (text, no charts)
            with gr.Tab(PAGES["home"], id="home") as tab:
                home.build(ctx, tab, loads)
            with gr.Tab(PAGES["study"], id="study", elem_id="study-page") as tab:
                study.build(ctx, tab, loads)
            with gr.Tab(PAGES["runs"], id="runs", elem_id="runs-page") as tab:
                runs.build(ctx, user, tab, loads)
            with gr.Tab(PAGES["inspector"], id="inspector", elem_id="inspector-page") as tab:
                inspector.build(ctx, tab, loads)
            with gr.Tab(PAGES["compare"], id="compare", elem_id="compare-page") as tab:
                compare.build(ctx, tab)
            with gr.Tab(PAGES["runs-compare"], id="runs-compare", elem_id="cmp-page"):
                runs_compare.build(ctx, loads)
            with gr.Tab(PAGES["annotate"], id="annotate", elem_id="annotate-page"):
                annotate.build(ctx, user, loads)
            with gr.Tab(PAGES["budget"], id="budget", elem_id="budget-page") as tab:
                budget.build(ctx, user, tab)
            with gr.Tab(PAGES["rehearse"], id="rehearse", elem_id="rehearse-page") as tab:
                rehearse.build(ctx, tab)
        loads.install(demo)
    return demo


def launch(
    host: str = "127.0.0.1",
    port: int = 7860,
    auth: str | None = None,
    root: str | None = None,
    limits: HostLimits | None = None,
) -> None:
    """Serve the studio (blocking). ``auth`` = ``user:pass``: anonymous visitors read only."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    try:
        policy = AuthPolicy.from_settings(auth)
    except AuthError as err:
        raise SystemExit(str(err)) from None
    demo = build_app(root, policy, limits)
    demo.queue(default_concurrency_limit=4).launch(
        server_name=host,
        server_port=port,
        show_error=True,
        css=CSS,
        head=HEAD,
        theme=gr.themes.Soft(),
    )


def serve_space() -> None:
    """The Space's start (root ``app.py``): its data folder, writers and job limits
    (``studio.space``); off a Space, the same app with a researcher's defaults."""
    logging.basicConfig(level=logging.INFO)
    hosted = space.on_space()
    launch(
        host=os.environ.get("GRADIO_SERVER_NAME", "0.0.0.0"),
        port=int(os.environ.get("PORT") or os.environ.get("GRADIO_SERVER_PORT") or 7860),
        root=str(space.data_root()) if hosted else None,
        limits=HostLimits.for_space() if hosted else None,
    )


if __name__ == "__main__":
    serve_space()
