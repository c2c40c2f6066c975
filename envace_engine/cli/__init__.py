"""The ``envace`` command line: one Typer app, one module per command group, plus the command
groups recipes register (the ``envace.commands`` entry point).

Heavy libraries (torch, transformers) are imported inside commands, never at import time, so
``envace --help`` and ``envace studio`` start fast and the studio never imports torch.
"""

from __future__ import annotations

import logging
from importlib.metadata import entry_points

import typer

from envace_engine.cli import data as _data
from envace_engine.cli import eval as _eval
from envace_engine.cli import models as _models
from envace_engine.cli import push as _push
from envace_engine.cli import rollout as _rollout
from envace_engine.cli import studio as _studio
from envace_engine.cli import tasks as _tasks
from envace_engine.cli import train as _train
from envace_engine.cli import world as _world

app = typer.Typer(
    name="envace",
    help="EnvACE Studio: world-rehearsal RL for LLM tool-use agents.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(_models.app, name="models")
app.add_typer(_tasks.app, name="tasks")
app.add_typer(_world.app, name="world")
app.command("studio")(_studio.studio)
app.command("rollout")(_rollout.rollout_command)
app.add_typer(_data.runs_app, name="runs")
app.command("export")(_data.export)
app.command("import")(_data.import_)
app.command("push")(_push.push)
app.command("sft")(_train.sft)
app.command("train")(_train.train)
app.command("eval")(_eval.eval_command)
app.command("sweep")(_eval.sweep_command)

# Recipes (experiments built on the engine, e.g. ``recipes.study``: ``envace study``) add their
# command groups through this entry point; the engine never imports them itself.
COMMANDS_GROUP = "envace.commands"
for _entry in entry_points(group=COMMANDS_GROUP):
    app.add_typer(_entry.load(), name=_entry.name)


def setup_logging() -> None:
    """The engine's INFO lines (which compute path the sampler runs, and the like) go to
    stderr; libraries stay at their own levels."""
    engine = logging.getLogger("envace_engine")
    if not engine.handlers:  # once per process, however often it is called
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        engine.addHandler(handler)
    engine.setLevel(logging.INFO)


def main() -> None:
    """Console-script entry point."""
    setup_logging()
    app()


if __name__ == "__main__":
    main()
