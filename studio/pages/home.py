"""Home: what the studio holds and how to start."""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from envace_engine.models import registry


def overview(folder: Path) -> str:
    """Markdown summary of the models and the data folder."""
    lines = ["## Models", "", "| name | what |", "|---|---|"]
    lines += [f"| `{name}` | {about} |" for name, about in registry().items()]
    lines += ["", "## Data", "", f"Runs folder: `{folder}`"]
    runs = sorted(p.name for p in folder.glob("*/") if p.is_dir()) if folder.exists() else []
    lines.append(f"{len(runs)} run(s) found." if runs else "No runs yet.")
    return "\n".join(lines)


def build(folder: Path) -> None:
    """Lay out the home page."""
    gr.Markdown(overview(folder), elem_id="home-overview")
