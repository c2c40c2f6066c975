"""``envace world``: a checkpoint's world role on its own (docs/mcp.md, "A checkpoint as an MCP
server").

``serve`` answers MCP ``tools/call`` requests with the policy's rehearse role
(``cli.world_serve``); ``card`` writes a per-tool fidelity card of the world role from a run's
stored rehearsed-vs-real pairs (``cli.world_card``). Models, storage and torch are imported
inside the commands so ``envace --help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from envace_engine.cli import compose
from envace_engine.cli import world_card as wc
from envace_engine.cli.data import _run_folder, data_root
from envace_engine.cli.models import DtypeOpt
from envace_engine.config import ROLLOUT_DEFAULTS, ConfigError, SamplerDtype, checkpoint_prompts

app = typer.Typer(help="A checkpoint's world role: serve it over MCP, or card its fidelity.")

ServeModelOpt = Annotated[
    str,
    typer.Option("--model", help="model name (tiny, smollm2-135m), checkpoint dir or BASE+ADAPTER"),
]
ToolsOpt = Annotated[
    str,
    typer.Option(
        "--tools",
        help="JSON file of OpenAI tool schemas, or an MCP suite (mcp:PATH/suite.toml) whose "
        "server's tools are listed once",
    ),
]


def _fail(err: Exception, hint: str) -> typer.BadParameter:
    return typer.BadParameter(str(err), param_hint=hint)


@app.command("serve")
def serve(
    model: ServeModelOpt,
    tools: ToolsOpt,
    stdio: Annotated[bool, typer.Option("--stdio", help="serve over stdin/stdout")] = False,
    http: Annotated[
        int | None, typer.Option("--http", min=1, max=65535, help="serve HTTP on this port")
    ] = None,
    temperature: Annotated[float, typer.Option("--temperature", min=0.0, help="0 = greedy")] = 0.0,
    seed: Annotated[int | None, typer.Option("--seed", help="sampling seed")] = None,
    max_new_tokens: Annotated[
        int | None,
        typer.Option("--max-new-tokens", min=1, help="tokens per answer (default: checkpoint's)"),
    ] = None,
    examples: Annotated[
        int | None,
        typer.Option(
            "--examples", min=0, help="worked examples (MCP suites only; default: checkpoint's)"
        ),
    ] = None,
    dtype: DtypeOpt = "auto",
) -> None:
    """Serve the policy's world role as an MCP server: each tools/call is rehearsed."""
    # here, not at the top: the server module loads the mcp SDK and uvicorn, which the other
    # commands (and `envace --help`) do not need
    from envace_engine.cli import world_serve as ws

    if stdio == (http is not None):
        raise typer.BadParameter(
            "give exactly one of --stdio and --http PORT", param_hint="--stdio"
        )
    try:
        offered = ws.load_tools(tools)
    except Exception as err:  # a bad file, or an MCP suite whose server does not start
        raise _fail(err, "--tools") from err
    settings = _serve_settings(model, offered, temperature, seed, max_new_tokens, examples)
    world = ws.World(*_load(model, dtype), offered, settings)
    server = ws.build_server(world)
    # stdout is the protocol's channel under --stdio: every word to the operator goes to stderr.
    where = "stdio" if stdio else f"http://127.0.0.1:{http}/mcp"
    typer.echo(f"world role of {model}: {len(offered.tools)} tools on {where}", err=True)
    if stdio:
        ws.serve_stdio(server)
    else:
        assert http is not None
        ws.serve_http(server, http)


def _serve_settings(
    model: str,
    offered: Any,
    temperature: float,
    seed: int | None,
    max_new_tokens: int | None,
    examples: int | None,
) -> Any:
    """Unset options from the checkpoint's recorded prompt settings, else the defaults (as
    ``envace eval``); worked examples need a pool, which only an MCP suite's tasks give."""
    from envace_engine.cli.world_serve import ServeSettings

    try:
        recorded = {**ROLLOUT_DEFAULTS.model_dump(), **checkpoint_prompts(model)}
    except ConfigError as err:
        raise _fail(err, "--model") from err
    n_examples = recorded["n_examples"] if examples is None else examples
    return ServeSettings(
        max_new_tokens=max_new_tokens or int(recorded["max_new_tokens_rehearse"]),
        temperature=temperature,
        seed=seed,
        n_examples=int(n_examples) if offered.pool else 0,
        context_limit=int(recorded["context_limit"]),
    )


def _load(model: str, dtype: SamplerDtype) -> tuple[Any, Any]:
    """The sampler and tokenizer for ``model``, as ``envace eval --model`` loads them."""
    sampler, tokenizer = compose.load(model, batch_size=1, dtype=dtype)
    return sampler, tokenizer


@app.command("card")
def card(
    run: Annotated[str, typer.Option("--run", help="run id (under --root) or run directory")],
    root: Annotated[
        str | None, typer.Option("--root", help="data folder ($ENVACE_HOME, ./runs)")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="write OUT.md and OUT.json (default: beside the checkpoint)"),
    ] = None,
) -> None:
    """A per-tool fidelity card of a run's world role (rehearsed vs real), Markdown + JSON."""
    from storage.layout import RUNS_DIR, read_manifest
    from storage.store import Store

    folder = _run_folder(run, data_root(root)).resolve()
    if folder.parent.name != RUNS_DIR:  # the store finds runs only in a data folder's runs/
        raise typer.BadParameter(
            f"{folder} is not in a data folder's {RUNS_DIR}/", param_hint="--run"
        )
    manifest = read_manifest(folder)
    # The run's own data root, in memory: a running studio may hold the root's database file.
    with Store(folder.parent.parent, url="duckdb:///:memory:") as store:
        rows = wc.read_pairs(store, manifest.run_id)
    try:
        made = wc.world_card(rows, wc.card_source(manifest, rows))
    except ValueError as err:
        raise _fail(err, "--run") from err
    base = out or (wc.checkpoint_dir(manifest, folder) or folder) / wc.CARD_NAME
    md, js = wc.write_card(made, base)
    typer.echo(wc.card_markdown(made))
    typer.echo(f"wrote {md} and {js}")
