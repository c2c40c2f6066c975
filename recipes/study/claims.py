"""The world-model claims (a′)–(d′) of a study with a ``fidelity`` arm, and their rules.

The rules are fixed here, before any run; every interval is a 95 % bootstrap over held-out
tasks, paired by task (``stats``), on the ungrounded world evaluation (each checkpoint in
its own rehearsed world with a shadow real environment) and the plain real-tool evaluation.

* (a′) **the fidelity signal teaches the world** — per task, the mean rehearsed-vs-real pair
  score (``fidelity.metrics``: status agreement, then fields) of the ``fidelity`` checkpoint
  minus the SFT checkpoint's. *Supported* when its interval is above 0 *and* the task-only
  ``envace`` arm's interval is not (low ≤ 0); *not supported* when the fidelity arm's interval
  is not above 0; *inconclusive* when both arms' are above 0 (the signal is then not what made
  the difference). Status agreement and error recall deltas are shown as evidence.
* (b′) **without giving up the task** — real-tool success at N = 0, ``fidelity`` minus
  ``real-grpo``: *supported* when its low end is above −5 points and ``fidelity`` minus
  ``simulator`` is above 0; *not supported* when the first interval is entirely below −5 points
  or the second entirely below 0; else inconclusive.
* (c′) **the collusion instruments separate the arms** — per task, echo rate of ``envace``
  minus ``fidelity``, and error recall of ``fidelity`` minus ``envace``: *supported* when either
  interval is above 0; *not supported* when both are below 0 or (one below, the other
  including 0); else inconclusive.
* (d′) **its world flags bad calls itself** — the ``fidelity`` checkpoint's ``select N=2``
  success minus its N = 0 success (no schema check in either): supported above 0, not
  supported below 0, else inconclusive.

One study is one seed: a protocol states a verdict only where two seeds agree (the recipe's
README puts their reports side by side).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from envace_engine.stats import Estimate

if TYPE_CHECKING:
    from recipes.study.report import Builder

MARGIN_B = 0.05  # (b′): within 5 points of real-grpo
SELECT = "select N=2"


def _by_task(builder: Builder, name: str, key: str) -> dict[str, float] | None:
    record = builder.state.evals.get(name)
    fid = record.fidelity if record else None
    if fid is None or not fid.by_task:
        return None
    return {task: row[key] for task, row in fid.by_task.items() if key in row}


def _delta(builder: Builder, a: str, b: str, key: str) -> Estimate | None:
    got_a, got_b = _by_task(builder, a, key), _by_task(builder, b, key)
    if got_a is None or got_b is None:
        return None
    return builder.diff_by_task(got_a, got_b)


def _show(d: Estimate | None) -> str:
    from recipes.study.report import fmt_est

    return "n/a" if d is None else fmt_est(d)


def claim_a(builder: Builder) -> dict[str, Any]:
    """(a′): module docstring."""
    from recipes.study.report import not_run, verdict

    text = (
        "(a′) with the fidelity signal, held-out rehearsal fidelity rises over sft; without it not"
    )
    fid, env = (
        _delta(builder, "fidelity", "sft", "score"),
        _delta(builder, "envace", "sft", "score"),
    )
    if fid is None or env is None:
        return not_run(text, "needs the world evaluations of sft, fidelity and envace")
    if fid.low > 0 and env.low <= 0:
        result = "supported"
    elif fid.low <= 0:
        result = "not supported"
    else:
        result = "inconclusive"
    evidence = (
        f"pair score Δ vs sft: fidelity {_show(fid)}, envace {_show(env)}; status agree Δ: "
        f"fidelity {_show(_delta(builder, 'fidelity', 'sft', 'status_agree'))}, envace "
        f"{_show(_delta(builder, 'envace', 'sft', 'status_agree'))}; error recall Δ: fidelity "
        f"{_show(_delta(builder, 'fidelity', 'sft', 'error_recall'))}"
    )
    return verdict(text, result, evidence)


def claim_b(builder: Builder) -> dict[str, Any]:
    """(b′): module docstring."""
    from recipes.study.report import not_run, verdict

    text = "(b′) fidelity's real-tool success within 5 points of real-grpo and above simulator"
    if not builder._ready("fidelity", "real-grpo", "simulator"):
        return not_run(text, "needs the fidelity, real-grpo and simulator arms")
    vs_real = builder._plain_diff("fidelity", "real-grpo")
    vs_sim = builder._plain_diff("fidelity", "simulator")
    if vs_real.low > -MARGIN_B and vs_sim.low > 0:
        result = "supported"
    elif vs_real.high < -MARGIN_B or vs_sim.high < 0:
        result = "not supported"
    else:
        result = "inconclusive"
    evidence = (
        f"Δ (fidelity − real-grpo) {_show(vs_real)}; Δ (fidelity − simulator) {_show(vs_sim)}"
    )
    return verdict(text, result, evidence)


def claim_c(builder: Builder) -> dict[str, Any]:
    """(c′): module docstring."""
    from recipes.study.report import not_run, verdict

    text = "(c′) the collusion instruments separate the task-only arm from the fidelity arm"
    echo = _delta(builder, "envace", "fidelity", "echo_rate")
    recall = _delta(builder, "fidelity", "envace", "error_recall")
    if echo is None and recall is None:
        return not_run(text, "needs the world evaluations of envace and fidelity, with pairs")
    found = [d for d in (echo, recall) if d is not None]
    if any(d.low > 0 for d in found):
        result = "supported"
    elif any(d.high < 0 for d in found) and all(d.low <= 0 for d in found):
        result = "not supported"
    else:
        result = "inconclusive"
    evidence = (
        f"echo rate Δ (envace − fidelity) {_show(echo)}; "
        f"error recall Δ (fidelity − envace) {_show(recall)}"
    )
    return verdict(text, result, evidence)


def claim_d(builder: Builder) -> dict[str, Any]:
    """(d′): module docstring."""
    from recipes.study.report import PLAIN, not_run, verdict

    text = "(d′) select N=2 without the schema check helps the fidelity-trained policy"
    sel, plain = builder._setting("fidelity", SELECT), builder._setting("fidelity", PLAIN)
    if sel is None or plain is None:
        return not_run(text, f"needs {SELECT} and {PLAIN} of the fidelity checkpoint")
    d = builder.diff_by_task(sel, plain)
    if d is None:
        return not_run(text, "no task has both settings")
    result = "supported" if d.low > 0 else "not supported" if d.high < 0 else "inconclusive"
    return verdict(text, result, f"Δ ({SELECT} − N=0) {_show(d)}")


def world_claims(builder: Builder) -> list[dict[str, Any]]:
    """(a′)–(d′) in order."""
    return [claim_a(builder), claim_b(builder), claim_c(builder), claim_d(builder)]
