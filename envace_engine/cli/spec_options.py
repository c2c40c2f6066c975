"""A command's flags derived from its job spec (``specs``): one declaration per setting.

``spec_command(EvalSpec, run)`` is a Typer command taking ``--config FILE`` (a TOML job file
of the spec's keys, as the studio writes it) and one flag per field; flags given on the command
line override the file. ``run`` receives the validated spec and the command's own options
(where to write, not what to compute: ``--root``, ``--run-dir``, ...).
"""

from __future__ import annotations

import inspect
import tomllib
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Any, Literal

import typer
from pydantic import ValidationError
from pydantic.fields import FieldInfo

from envace_engine.specs import JobSpec

_CONFIG = "config_file"  # the parameter holding --config (not a field of any spec)


def flag(name: str) -> str:
    """A field's flag: ``n_tasks`` -> ``--n-tasks``."""
    return "--" + name.replace("_", "-")


def _inner(annotation: Any) -> Any:
    """``X`` of ``X | None``."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return annotation


def _cli_type(annotation: Any) -> Any:
    """The type Typer parses a field's flag as (the spec validates the value after)."""
    inner = _inner(annotation)
    origin = typing.get_origin(inner)
    if origin in (tuple, list):
        return list[str]  # repeatable; each value may hold a comma-separated list
    if origin is Literal or (isinstance(inner, type) and issubclass(inner, Enum)):
        return str
    return inner if inner in (bool, int, float, str, Path) else str


def _choices(annotation: Any) -> str:
    inner = _inner(annotation)
    if typing.get_origin(inner) in (tuple, list):
        inner = typing.get_args(inner)[0]
    if typing.get_origin(inner) is Literal:
        return " | ".join(map(str, typing.get_args(inner)))
    if isinstance(inner, type) and issubclass(inner, Enum):
        return " | ".join(str(m.value) for m in inner)
    return ""


def _help(field: FieldInfo) -> str:
    text = field.description or ""
    choices = _choices(field.annotation)
    if choices and choices not in text:
        text += f" ({choices})"
    if not field.is_required() and field.default is not None:
        default = field.default
        if isinstance(default, tuple):
            default = ",".join(map(str, default))
        elif isinstance(default, Enum):
            default = default.value
        text += f" (default: {default})"  # not [..]: Typer's rich help reads that as markup
    elif field.is_required():
        text += " (required, here or in --config)"
    return text


def _decls(name: str, field: FieldInfo, extra: Sequence[str]) -> list[str]:
    if _inner(field.annotation) is bool:
        return [f"{flag(name)}/--no-{name.replace('_', '-')}"]
    return [flag(name), *extra]


def _option(
    name: str, decls: Sequence[str], annotation: Any, text: str, hidden: bool = False
) -> inspect.Parameter:
    info = typer.Option(None, *decls, help=text, show_default=False, hidden=hidden)
    kind = inspect.Parameter.KEYWORD_ONLY
    return inspect.Parameter(name, kind, default=info, annotation=annotation | None)


def _deprecated_name(old: str) -> str:
    return "deprecated_" + old.split("/")[0].lstrip("-").replace("-", "_")


def spec_params(spec: type[JobSpec]) -> list[inspect.Parameter]:
    """``--config`` and one option per field (plus a hidden one per deprecated flag)."""
    params = [
        _option(
            _CONFIG,
            ["--config"],
            Path,
            f"TOML job file of {spec.__name__}'s keys; flags given here override it",
        )
    ]
    fields = sorted(spec.model_fields.items(), key=lambda kv: not kv[1].is_required())
    for name, field in fields:  # the required ones first, then in the spec's order
        decls = _decls(name, field, spec.FLAGS.get(name, ()))
        params.append(_option(name, decls, _cli_type(field.annotation), _help(field)))
    for old, name in spec.DEPRECATED.items():
        field = spec.model_fields[name]
        text = f"deprecated: use {_decls(name, field, ())[0].split('/')[0]}"
        params.append(
            _option(_deprecated_name(old), [old], _cli_type(field.annotation), text, hidden=True)
        )
    return params


def read_spec(spec: type[JobSpec], given: Mapping[str, Any]) -> JobSpec:
    """The spec of ``--config`` (if any) plus the flags in ``given`` (parameter -> value, None
    where not given); a bad value is a ``BadParameter`` naming its flag or key."""
    values = dict(given)
    data: dict[str, Any] = _job_file(values.pop(_CONFIG, None))
    for old, name in spec.DEPRECATED.items():
        value = values.pop(_deprecated_name(old), None)
        if value is not None:
            now = _decls(name, spec.model_fields[name], ())[0].split("/")[0]
            typer.echo(f"warning: {old.split('/')[0]} is deprecated: use {now}", err=True)
            if values.get(name) is None:  # the current flag wins when both are given
                values[name] = value
    data.update({k: v for k, v in values.items() if v is not None})
    try:
        return spec.model_validate(data)
    except ValidationError as err:
        errors = err.errors()
        # an item's error explains its list's: skip the list's (a tuple "with 0 items")
        inner = {tuple(e["loc"][:-1]) for e in errors if len(e["loc"]) > 1}
        lines = [_explain(spec, e) for e in errors if tuple(e["loc"]) not in inner]
        raise typer.BadParameter("\n".join(lines)) from None


def _job_file(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    if not path.is_file():
        raise typer.BadParameter(f"{path} does not exist", param_hint="--config")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise typer.BadParameter(
            f"{path} is not valid TOML: {err}", param_hint="--config"
        ) from None


def _explain(spec: type[JobSpec], error: Mapping[str, Any]) -> str:
    """One line per problem: the flag (and job-file key), what is wrong, what was given."""
    loc = [str(p) for p in error.get("loc", ())]
    if error.get("type") == "extra_forbidden":
        return f"unknown key {loc[0]!r} in the job file; valid keys: {', '.join(spec.model_fields)}"
    message = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
    if not loc:
        return message
    got = error.get("input")
    shown = "" if isinstance(got, Mapping) else f" (got {got!r})"
    return f"{flag(loc[0])} ({'.'.join(loc)}): {message}{shown}"


def spec_command(
    spec: type[JobSpec],
    run: Callable[..., None],
    own: Sequence[inspect.Parameter] = (),
) -> Callable[..., None]:
    """A Typer command: the spec's flags (``spec_params``) and ``own``; it calls
    ``run(job, **own_values)`` with the validated spec."""
    params = [*spec_params(spec), *own]
    names = {p.name for p in own}

    def command(**values: Any) -> None:
        mine = {k: values.pop(k) for k in names}
        run(read_spec(spec, values), **mine)

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__doc__ = run.__doc__
    command.__name__ = run.__name__
    return command


def own_option(
    name: str, decls: Sequence[str], annotation: Any, default: Any, text: str
) -> inspect.Parameter:
    """A command's own option (not a job setting): where to write, what to print."""
    info = typer.Option(default, *decls, help=text)
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=annotation
    )
