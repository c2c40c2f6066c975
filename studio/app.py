"""The Gradio app: builds the pages and launches the server.

Heavy work (rollouts, training) runs in job subprocesses; this process only reads storage, so it
never imports torch.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: Hugging Face Spaces uses `app_file: studio/app.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gradio as gr

from studio.pages import home

TITLE = "EnvACE Studio"


def data_root(root: str | None = None) -> Path:
    """The studio's data folder: runs, the DuckDB file, job logs."""
    return Path(root or os.environ.get("ENVACE_HOME") or "runs").resolve()


def build_app(root: str | None = None) -> gr.Blocks:
    """Assemble every page into one Blocks app."""
    folder = data_root(root)
    with gr.Blocks(title=TITLE) as demo:
        gr.Markdown(f"# {TITLE}\nWorld-rehearsal RL for LLM tool-use agents.", elem_id="title")
        with gr.Tabs(), gr.Tab("Home", id="home"):
            home.build(folder)
    return demo


def launch(
    host: str = "127.0.0.1", port: int = 7860, auth: str | None = None, root: str | None = None
) -> None:
    """Serve the studio (blocking)."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    credentials = None
    if auth:
        user, sep, password = auth.partition(":")
        if not sep or not user or not password:
            raise SystemExit("--auth must look like user:pass")
        credentials = [(user, password)]
    demo = build_app(root)
    demo.queue(default_concurrency_limit=4).launch(
        server_name=host, server_port=port, auth=credentials, show_error=True
    )


if __name__ == "__main__":
    launch(host="0.0.0.0", port=int(os.environ.get("PORT", "7860")))
