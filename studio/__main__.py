"""``python -m studio [--host H] [--port P]``: same as ``envace studio``."""

import typer

from envace_engine.cli.studio import studio

typer.run(studio)
