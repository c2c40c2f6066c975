"""``python -m recipes.study``: the same command as ``envace study`` (``recipes.study.cli``)."""

from envace_engine.cli import setup_logging
from recipes.study.cli import app

if __name__ == "__main__":
    setup_logging()
    app(prog_name="envace study")
