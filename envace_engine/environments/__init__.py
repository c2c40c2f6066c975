"""Executable environments and task suites (``toy``, ``toy-library``, ``bfcl``, ``bfcl-gen``,
``tau2-*``).

``get_suite(name, basis=None)`` returns a ``Suite`` (environments/base.py): ``tasks(split)``,
``make_env`` and ``score``. Splits: ``train`` / ``validation`` for the generated suites (``toy``,
``toy-library``, ``bfcl-gen``); ``test`` (or one category: ``base``, ``miss_func``, ``miss_param``,
``long_context``) for ``bfcl``; ``train`` / ``test`` / ``base`` for ``tau2-airline``,
``tau2-retail`` and ``tau2-mock`` (tests). ``basis`` picks a scoring basis where a suite has
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
from envace_engine.environments.reference import reference_match

__all__ = ["Environment", "Suite", "get_suite", "reference_match", "suite_names"]


def _bfcl(basis: str | None) -> Suite:
    from envace_engine.environments.bfcl.suite import BfclSuite

    return BfclSuite(basis or "official")


def _bfcl_gen(basis: str | None) -> Suite:
    from envace_engine.environments.bfcl.gen import BfclGenSuite

    _one_basis("bfcl-gen", basis)
    return BfclGenSuite()


def _toy(basis: str | None) -> Suite:
    from envace_engine.environments.toy.suite import ToySuite

    _one_basis("toy", basis)
    return ToySuite()


def _toy_library(basis: str | None) -> Suite:
    from envace_engine.environments.toy.library import LibrarySuite

    _one_basis("toy-library", basis)
    return LibrarySuite()


def _tau2(domain: str) -> Callable[[str | None], Suite]:
    def make(basis: str | None) -> Suite:
        from envace_engine.environments.tau2.suite import Tau2Suite

        return Tau2Suite(domain, basis or "official")

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
