"""Executable environments and task suites (``toy``, ``bfcl``, ``bfcl-gen``).

``get_suite(name)`` returns a ``Suite`` (environments/base.py): ``tasks(split)``, ``make_env``
and ``score``. Splits: ``train`` / ``validation`` for the generated suites (``toy``,
``bfcl-gen``); ``test`` (or one category: ``base``, ``miss_func``, ``miss_param``,
``long_context``) for ``bfcl``. ``reference_match`` is the execution-free ``reference`` reward.
Suites are created once per process and cache their tasks. Schema of task files: docs/tasks.md.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from envace_engine.environments.base import Environment, Suite
from envace_engine.environments.reference import reference_match

__all__ = ["Environment", "Suite", "get_suite", "reference_match", "suite_names"]


def _bfcl() -> Suite:
    from envace_engine.environments.bfcl.suite import BfclSuite

    return BfclSuite()


def _bfcl_gen() -> Suite:
    from envace_engine.environments.bfcl.gen import BfclGenSuite

    return BfclGenSuite()


def _toy() -> Suite:
    from envace_engine.environments.toy.suite import ToySuite

    return ToySuite()


# bfcl-eval is imported only when a bfcl suite is asked for.
_FACTORIES: dict[str, Callable[[], Suite]] = {"toy": _toy, "bfcl": _bfcl, "bfcl-gen": _bfcl_gen}


def suite_names() -> list[str]:
    """Names accepted by ``get_suite``."""
    return list(_FACTORIES)


@cache
def get_suite(name: str) -> Suite:
    """The suite called ``name`` (one shared instance per process)."""
    if name not in _FACTORIES:
        raise ValueError(f"unknown suite {name!r}; valid suites: {', '.join(_FACTORIES)}")
    return _FACTORIES[name]()
