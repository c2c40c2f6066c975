"""Executable environments and task suites (``toy``, ``toy-library``, ``bfcl``, ``bfcl-gen``,
``tau2-*``, ``vita-*``).

``get_suite(name, basis=None)`` returns a ``Suite`` (environments/base.py): ``tasks(split)``,
``make_env`` and ``score``. Splits: ``train`` / ``validation`` for the generated suites (``toy``,
``toy-library``, ``bfcl-gen``); ``test`` (or one category: ``base``, ``miss_func``, ``miss_param``,
``long_context``) for ``bfcl``; ``train`` / ``test`` / ``base`` for ``tau2-airline``,
``tau2-retail`` and ``tau2-mock`` (tests); ``test`` for ``vita-delivery-zh``,
``vita-delivery-en`` and ``vita-instore`` (VitaBench, judged by an LLM: environments/vita).
``basis`` picks a scoring basis where a suite has
several (``ScoringBasis``: bfcl ``official``|``strict``, τ² ``official``|``legacy``; None is the
suite's default). ``reference_match`` is the execution-free ``reference`` reward. Suites are
created once per (name, basis) and per process and cache their tasks. Task files: docs/tasks.md.

``mcp:PATH`` names a suite file of tasks against a real MCP server (environments/mcp,
docs/mcp.md): ``get_suite("mcp:envace_engine/environments/mcp/example/suite.toml")``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from envace_engine.environments.base import Environment, Suite
from envace_engine.environments.bfcl.gen import BfclGenSuite
from envace_engine.environments.bfcl.suite import BfclSuite
from envace_engine.environments.reference import reference_match
from envace_engine.environments.tau2.suite import Tau2Suite
from envace_engine.environments.toy.library import LibrarySuite
from envace_engine.environments.toy.suite import ToySuite
from envace_engine.environments.vita.suite import VitaSuite
from envace_engine.types import Task

__all__ = [
    "Environment",
    "Suite",
    "example_pool",
    "get_suite",
    "held_out_split",
    "reference_match",
    "suite_names",
    "whole_splits",
]


def _bfcl(basis: str | None) -> Suite:
    return BfclSuite(basis or "official")


def _bfcl_gen(basis: str | None) -> Suite:
    _one_basis("bfcl-gen", basis)
    return BfclGenSuite()


def _toy(basis: str | None) -> Suite:
    _one_basis("toy", basis)
    return ToySuite()


def _toy_library(basis: str | None) -> Suite:
    _one_basis("toy-library", basis)
    return LibrarySuite()


def _tau2(domain: str) -> Callable[[str | None], Suite]:
    def make(basis: str | None) -> Suite:
        return Tau2Suite(domain, basis or "official")

    return make


def _vita(domain: str, language: str) -> Callable[[str | None], Suite]:
    def make(basis: str | None) -> Suite:
        return VitaSuite(domain, language, basis or "official")

    return make


def _one_basis(name: str, basis: str | None) -> None:
    if basis is not None:
        raise ValueError(
            f"suite {name!r} has one way to score; --basis applies to bfcl and the tau2 suites"
        )


# bfcl-eval is imported only when a bfcl suite is asked for; τ² data only for a τ² suite.
_FACTORIES: dict[str, Callable[[str | None], Suite]] = {
    "toy": _toy,
    "toy-library": _toy_library,
    "bfcl": _bfcl,
    "bfcl-gen": _bfcl_gen,
    "tau2-airline": _tau2("airline"),
    "tau2-retail": _tau2("retail"),
    "tau2-mock": _tau2("mock"),
    "vita-delivery-zh": _vita("delivery", "zh"),
    "vita-delivery-en": _vita("delivery", "en"),
    "vita-instore": _vita("instore", "en"),
}


# Suites named by a prefix and a path rather than listed: ``mcp:path/to/suite.toml``.
MCP_PREFIX = "mcp:"


def _mcp(name: str, basis: str | None) -> Suite:
    from envace_engine.environments.mcp.suite import load_suite

    _one_basis("mcp", basis)
    return load_suite(name)


def suite_names() -> list[str]:
    """Names accepted by ``get_suite`` (and any ``mcp:PATH``)."""
    return list(_FACTORIES)


@cache
def get_suite(name: str, basis: str | None = None) -> Suite:
    """The suite called ``name`` scoring by ``basis`` (one shared instance per process)."""
    if name.startswith(MCP_PREFIX):
        return _mcp(name, basis)
    if name not in _FACTORIES:
        valid = ", ".join([*_FACTORIES, f"{MCP_PREFIX}PATH"])
        raise ValueError(f"unknown suite {name!r}; valid suites: {valid}")
    return _FACTORIES[name](basis)


def _family(name: str) -> str:
    return name.split("-")[0] if name.startswith(("tau2-", "vita-")) else name


def held_out_split(name: str) -> str:
    """The split an evaluation of suite ``name`` uses unless told: ``test`` for the τ² and
    VitaBench suites, ``base`` (multi_turn_base) for bfcl, ``validation`` for the others."""
    return {"tau2": "test", "vita": "test", "bfcl": "base"}.get(_family(name), "validation")


def whole_splits(name: str) -> tuple[str, ...]:
    """The splits that hold every task of suite ``name`` exactly once."""
    named = {"tau2": ("base",), "vita": ("test",), "bfcl": ("test",)}
    return named.get(_family(name), ("train", "validation"))


def example_pool(suite: Suite) -> list[Task]:
    """The tasks worked examples come from: the suite's ``train`` split; for bfcl (held out,
    no train split) bfcl-gen's, whose backends are the same; none for VitaBench, whose every
    task is a test task (its prompts carry no worked examples)."""
    if suite.name == "bfcl":
        return get_suite("bfcl-gen").tasks("train")
    if _family(suite.name) == "vita":
        return []
    return suite.tasks("train")
