"""The ``envace`` command line: one Typer app, one module per command group.

Heavy libraries (torch, transformers) are imported inside commands, never at import time, so
``envace --help`` and ``envace studio`` start fast and the studio never imports torch.
"""

from __future__ import annotations

import typer

from envace_engine.cli import models as _models
from envace_engine.cli import studio as _studio

app = typer.Typer(
    name="envace",
    help="EnvACE Studio: world-rehearsal RL for LLM tool-use agents.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(_models.app, name="models")
app.command("studio")(_studio.studio)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
