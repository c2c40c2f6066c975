"""``envace studio``: launch the Gradio app (imports no torch)."""

from __future__ import annotations

import typer


def studio(
    host: str = typer.Option("127.0.0.1", help="interface to bind (0.0.0.0 on a server)"),
    port: int = typer.Option(7860, min=1, max=65535, help="port to serve on"),
    auth: str | None = typer.Option(None, help="user:pass to require sign-in for writes"),
    root: str | None = typer.Option(
        None, help="studio data folder (default: $ENVACE_HOME or ./runs)"
    ),
) -> None:
    """Open the studio in the browser at http://HOST:PORT."""
    from studio.app import launch

    launch(host=host, port=port, auth=auth, root=root)
