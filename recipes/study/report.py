"""The study report: the paper-shaped test-time table, the world-model table, curves, verdicts.

Everything is computed from ``study.json`` (``state``) alone, so ``envace study report`` and the
studio page need no model. Estimates are means over held-out tasks with 95 % bootstrap
intervals over tasks (``stats``); every difference is paired by task.

Verdict rules (stated in the report too):

* a "≥" claim is **supported** when the paired difference's mean is ≥ 0 and its interval lies
  above −0.05 (non-inferiority by 5 points), **not supported** when the interval lies below 0,
  else **inconclusive**;
* a "more than" / "rises" claim is **supported** when the interval lies above 0, **not
  supported** when it lies below 0, else **inconclusive**;
* a claim whose arms did not run or failed is **not run**.

Every test-time setting's Δ vs N = 0 also gets an **effect** (``effect``): *helps* (interval
above 0), *hurts* (interval below 0), *harmless* (interval above −0.05: non-inferior), else
*inconclusive* — the question "is test-time rehearsal at least harmless for this policy?"
answered per setting.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any, TypeVar

from envace_engine.fidelity.collusion import COLLUSION_RATES
from envace_engine.stats import Estimate, bootstrap_mean, paired_by_task, paired_difference
from recipes.study.claims import world_claims
from recipes.study.config import StudyConfig
from recipes.study.state import ArmState, CheckpointEval, SettingResult, StudyState

T = TypeVar("T")
REPORT_JSON = "report.json"
REPORT_MD = "report.md"
MARGIN = 0.05  # non-inferiority margin of "≥" claims
PLAIN = "plain N=0"


def _values(by_task: dict[str, float], tasks: list[str]) -> list[float]:
    return [by_task[t] for t in tasks]


def _common(*maps: dict[str, float]) -> list[str]:
    keys = set(maps[0])
    for m in maps[1:]:
        keys &= set(m)
    return sorted(keys)


def _in_order(items: dict[str, T], first: list[str]) -> list[tuple[str, T]]:
    """``items`` with the keys in ``first`` leading, in that order, then the rest by name:
    ``study.json`` is written with sorted keys, so the order a study ran in is not kept."""
    rank = {name: i for i, name in enumerate(first)}
    return sorted(items.items(), key=lambda kv: (rank.get(kv[0], len(rank)), kv[0]))


class Builder:
    """Computes every table row and verdict from a study's state."""

    def __init__(self, config: StudyConfig, state: StudyState) -> None:
        self.config, self.state = config, state
        self.resamples = config.eval.bootstrap
        self.seed = config.seed

    def est(self, values: list[float]) -> Estimate:
        return bootstrap_mean(values, self.resamples, self.seed)

    def diff(self, a: list[float], b: list[float]) -> Estimate:
        return paired_difference(a, b, self.resamples, self.seed)

    def diff_by_task(self, a: dict[str, float], b: dict[str, float]) -> Estimate | None:
        """``a - b`` paired over the tasks both have (None when they share none)."""
        return paired_by_task(a, b, self.resamples, self.seed)

    def plain(self, name: str) -> dict[str, float] | None:
        record = self.state.evals.get(name)
        result = record.settings.get(PLAIN) if record else None
        return result.success if result else None

    def evals(self) -> list[tuple[str, CheckpointEval]]:
        """The evaluated checkpoints in the paper's order: base, sft, the arms as configured,
        then the rest (earlier runs of redone arms) by name."""
        return _in_order(self.state.evals, ["base", "sft", *self.config.arms])

    def arms(self) -> list[tuple[str, ArmState]]:
        """The study's arms in the config's order."""
        return _in_order(self.state.arms, list(self.config.arms))

    def settings(self, record: CheckpointEval) -> list[tuple[str, SettingResult]]:
        """A checkpoint's settings in the plan's order (study.evaluation.plan_settings): N = 0,
        then each configured mode by ascending budget, then select."""
        modes = ["none", *self.config.eval.modes, "select"]

        def key(item: tuple[str, SettingResult]) -> tuple[int, int, str]:
            mode = item[1].mode
            return (modes.index(mode) if mode in modes else len(modes), item[1].budget, item[0])

        return sorted(record.settings.items(), key=key)

    def table(self) -> list[dict[str, Any]]:
        """One row per (checkpoint, setting): success, Δ vs N = 0, costs."""
        rows = []
        for name, record in self.evals():
            base = self.plain(name)
            for label, result in self.settings(record):
                tasks = sorted(result.success)
                row = {
                    "checkpoint": name,
                    "setting": label,
                    "budget": result.budget,
                    "mode": result.mode,
                    "success": self.est(_values(result.success, tasks)).as_dict(),
                    "delta": None,
                    "effect": None,
                    "reward": result.reward,
                    "real_calls": result.real_calls,
                    "invalid_calls": result.invalid_calls,
                    "rehearsal_tokens": result.rehearsal_tokens + result.memory_tokens,
                    "wall_s": result.wall_s,
                }
                d = self.diff_by_task(result.success, base) if base and label != PLAIN else None
                if d is not None:
                    row["delta"] = d.as_dict()
                    row["effect"] = effect(d)
                rows.append(row)
        return rows

    def world(self) -> list[dict[str, Any]]:
        """Per checkpoint: fidelity, real-response NLL, success real vs rehearsed, the gap."""
        rows = []
        for name, record in self.evals():
            fid, real = record.fidelity, self.plain(name)
            if fid is None:
                continue
            row: dict[str, Any] = {
                "checkpoint": name,
                "pairs": fid.pairs,
                "exact": fid.exact,
                "status_agree": fid.status_agree,
                "real_nll": fid.real_nll,
                "collusion": dict(fid.collusion),
                # tasks in sorted order: a reloaded study.json has them so (sort_keys), a
                # running study in the order its episodes ended; the bootstrap must not care
                "rehearsed_success": self.est(
                    _values(fid.rehearsed_success, sorted(fid.rehearsed_success))
                ).as_dict(),
            }
            if real is not None:
                common = _common(real, fid.rehearsed_success)
                row["real_success"] = self.est(_values(real, common)).as_dict()
                row["gap"] = self.diff(
                    _values(real, common), _values(fid.rehearsed_success, common)
                ).as_dict()
            rows.append(row)
        return rows

    def costs(self) -> dict[str, Any]:
        """What the study cost: per arm the banked wall time and its steps' own times (the
        per-step figures survive a killed process, whose unbanked wall time is lost), per
        checkpoint the evaluation's wall time, and the total in hours."""
        arms: dict[str, dict[str, float | None]] = {}
        total = 0.0
        for name, arm in self.arms():
            points = self.state.curves.get(name, {}).values()
            steps = [p["perf/step_s"] for p in points if "perf/step_s" in p]
            arms[name] = {
                "wall_s": arm.seconds,
                "steps_s": sum(steps),
                "median_step_s": statistics.median(steps) if steps else None,
            }
            total += max(arm.seconds, sum(steps))
        evals: dict[str, float] = {}
        for name, record in self.evals():
            fid = record.fidelity.wall_s if record.fidelity is not None else 0.0
            evals[name] = sum(r.wall_s for r in record.settings.values()) + fid
        total += sum(evals.values())
        return {
            "arms": arms,
            "evals_s": evals,
            "total_h": total / 3600,
            "lanes": self.config.lanes,
            "wall_h": self.state.wall_s / 3600,  # start to end with lanes (units side by side)
        }

    def verdicts(self) -> list[dict[str, Any]]:
        """One verdict per claim: (a′)–(d′) of ``study.claims`` for a study with a ``fidelity``
        arm, else (a)–(e) of docs/study.md."""
        if "fidelity" in self.config.arms:
            return world_claims(self)
        return [
            self.claim_a(),
            self.claim_b(),
            self.claim_c(),
            self.claim_d(),
            self.claim_e(),
        ]

    def _ready(self, *names: str) -> bool:
        return all(n in self.state.evals and self.state.evals[n].settings for n in names)

    def _fid(self, name: str) -> Any:
        record: CheckpointEval | None = self.state.evals.get(name)
        return record.fidelity if record else None

    def claim_a(self) -> dict[str, Any]:
        text = "(a) held-out rehearsal fidelity rises during EnvACE training"
        sft, env = self._fid("sft"), self._fid("envace")
        if sft is None or env is None:
            return not_run(text, "needs the sft and envace fidelity evaluations")
        d = self.diff_by_task(env.exact_by_task, sft.exact_by_task)
        if d is None:
            return not_run(text, "no held-out task has rehearsed-vs-real pairs for both")
        curve = [
            p["heldout/fidelity_exact"]
            for _, p in sorted(
                self.state.curves.get("envace", {}).items(), key=lambda kv: int(kv[0])
            )
            if "heldout/fidelity_exact" in p
        ]
        evidence = (
            f"exact match {fmt(sft.exact)} (sft) -> {fmt(env.exact)} (envace); per-task paired "
            f"Δ {fmt_est(d)}; probe curve {' -> '.join(fmt(v) for v in curve) or 'n/a'}"
        )
        return verdict(text, greater(d), evidence)

    def _plain_diff(self, a: str, b: str) -> Estimate:
        pa, pb = self.plain(a), self.plain(b)
        assert pa is not None and pb is not None
        d = self.diff_by_task(pa, pb)
        if d is None:
            raise ValueError(f"{a} and {b} were evaluated on no common task")
        return d

    def claim_b(self) -> dict[str, Any]:
        text = "(b) real-env success of envace ≥ real-grpo at equal steps"
        if not self._ready("envace", "real-grpo"):
            return not_run(text, "needs the envace and real-grpo arms")
        d = self._plain_diff("envace", "real-grpo")
        return verdict(text, at_least(d), f"success Δ (envace − real-grpo) {fmt_est(d)}")

    def _setting(self, name: str, label: str) -> dict[str, float] | None:
        record = self.state.evals.get(name)
        result = record.settings.get(label) if record else None
        return result.success if result else None

    def claim_c(self) -> dict[str, Any]:
        text = "(c) parallel rehearsal at N = 2 helps the envace policy more than the SFT policy"
        label = "parallel N=2"
        found = [self._setting(n, lab) for n in ("envace", "sft") for lab in (label, PLAIN)]
        maps = [m for m in found if m is not None]
        if len(maps) < len(found):
            return not_run(text, f"needs {label} and {PLAIN} of sft and envace")
        e2, e0, s2, s0 = maps
        common = _common(e2, e0, s2, s0)
        gains = [e2[t] - e0[t] - (s2[t] - s0[t]) for t in common]
        d = self.est(gains)
        de = self.diff(_values(e2, common), _values(e0, common))
        ds = self.diff(_values(s2, common), _values(s0, common))
        evidence = f"Δ envace {fmt_est(de)}, Δ sft {fmt_est(ds)}, difference {fmt_est(d)}"
        return verdict(text, greater(d), evidence)

    def claim_d(self) -> dict[str, Any]:
        text = "(d) role-wise vs shared baseline"
        if not self._ready("envace", "shared-baseline"):
            return not_run(text, "needs the envace and shared-baseline arms")
        d = self._plain_diff("envace", "shared-baseline")
        fe, fs = self._fid("envace"), self._fid("shared-baseline")
        exact = f"; exact match {fmt(fe.exact)} vs {fmt(fs.exact)}" if fe and fs else ""
        result = greater(d)
        label = {"supported": "role-wise better", "not supported": "shared better"}.get(
            result, "no difference detected"
        )
        return {
            "claim": text,
            "verdict": label,
            "evidence": f"success Δ (role-wise − shared) {fmt_est(d)}{exact}",
        }

    def claim_e(self) -> dict[str, Any]:
        text = (
            "(e) target: envace closes ≥ half of the SFT policy's rehearsed-vs-real success gap, "
            "held-out rehearsal exact match > 60 %, real-env success does not drop"
        )
        world = {r["checkpoint"]: r for r in self.world()}
        if "sft" not in world or "envace" not in world or "gap" not in world["sft"]:
            return not_run(text, "needs the sft and envace evaluations")
        gap_sft, gap_env = world["sft"]["gap"]["mean"], world["envace"].get("gap", {}).get("mean")
        closed = None if gap_env is None or gap_sft <= 0 else 1 - gap_env / gap_sft
        exact = world["envace"]["exact"] or 0.0
        drop = self._plain_diff("envace", "sft")
        parts = {
            "gap closed ≥ 50 %": closed is not None and closed >= 0.5,
            "exact > 60 %": exact > 0.6,
            "no drop": drop.high >= 0,
        }
        evidence = (
            f"gap {fmt(gap_sft)} (sft) -> {fmt(gap_env)} (envace), closed "
            f"{fmt(closed)}; exact {fmt(exact)}; success Δ (envace − sft) {fmt_est(drop)}; "
            + ", ".join(f"{k}: {'yes' if v else 'no'}" for k, v in parts.items())
        )
        return {
            "claim": text,
            "verdict": "met" if all(parts.values()) else "not met",
            "evidence": evidence,
        }


def greater(d: Estimate) -> str:
    if d.low > 0:
        return "supported"
    if d.high < 0:
        return "not supported"
    return "inconclusive"


def effect(d: Estimate) -> str:
    """What a test-time setting does to success (its paired Δ vs N = 0): module docstring."""
    if d.low > 0:
        return "helps"
    if d.high < 0:
        return "hurts"
    if d.low > -MARGIN:
        return "harmless"
    return "inconclusive"


def at_least(d: Estimate) -> str:
    if d.mean >= 0 and d.low > -MARGIN:
        return "supported"
    if d.high < 0:
        return "not supported"
    return "inconclusive"


def verdict(claim: str, result: str, evidence: str) -> dict[str, Any]:
    return {"claim": claim, "verdict": result, "evidence": evidence}


def not_run(claim: str, why: str) -> dict[str, Any]:
    return {"claim": claim, "verdict": "not run", "evidence": why}


def fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def fmt_est(e: Estimate) -> str:
    return f"{e.mean:+.3f} [{e.low:+.3f}, {e.high:+.3f}]"


def _portable(arm: dict[str, Any]) -> dict[str, Any]:
    """An arm's record with its checkpoint relative to the data folder (``RUN/checkpoints/…``):
    a report copied elsewhere (recipes/study/runs/) names no machine's paths."""
    path = Path(arm["checkpoint"])
    if arm["run_id"] in path.parts:
        path = Path(*path.parts[path.parts.index(arm["run_id"]) :])
    return {**arm, "checkpoint": str(path) if arm["checkpoint"] else ""}


def build_report(config: StudyConfig, state: StudyState) -> dict[str, Any]:
    """The whole report as JSON-ready data."""
    b = Builder(config, state)
    return {
        "study_id": state.study_id,
        "status": state.status,
        "suite": config.suite,
        "model": config.model,
        "cost": config.cost,
        "eval": config.eval.model_dump(mode="json"),
        "steps": config.train.steps,
        "seed": config.seed,
        "arms": {k: _portable(vars(v)) for k, v in b.arms()},
        "table": b.table(),
        "world": b.world(),
        "curves": state.curves,
        "costs": b.costs(),
        "verdicts": b.verdicts(),
        "rules": {
            "at_least": f"mean ≥ 0 and 95 % CI above −{MARGIN}",
            "greater": "95 % CI above 0",
            "effect": f"helps: Δ CI above 0; hurts: below 0; harmless: above −{MARGIN}",
        },
    }


def write_report(report: dict[str, Any], folder: Path) -> None:
    """``report.json`` and ``report.md`` in ``folder`` (each written atomically)."""
    for name, text in ((REPORT_JSON, json.dumps(report, indent=1)), (REPORT_MD, markdown(report))):
        path = Path(folder) / name
        tmp = path.with_name(f".{name}.tmp{os.getpid()}")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)


def _ci(e: dict[str, float] | None, signed: bool = True) -> str:
    """A percentage estimate with its CI; ``signed`` for a difference (``+1.6``), not a level."""
    if e is None:
        return "—"
    f = "+.1f" if signed else ".1f"
    return f"{e['mean'] * 100:{f}} [{e['low'] * 100:{f}}, {e['high'] * 100:{f}}]"


def _count(value: float | None) -> str:
    """A per-episode mean to two decimals; ``—`` where the study did not record it."""
    return "—" if value is None else f"{value:.2f}"


def _table_lines(table: list[dict[str, Any]]) -> list[str]:
    """The test-time table in Markdown. Its *invalid calls* column (real calls the tools
    rejected) appears when some row has it: studies evaluated before it was counted lack it."""
    invalid = any(r.get("invalid_calls") is not None for r in table)
    extra = " invalid calls |" if invalid else ""
    lines = [
        f"| checkpoint | setting | success | Δ vs N=0 | effect | real calls |{extra} "
        "rehearsal tokens |",
        "|---|---|---|---|---|---|---|" + ("---|" if invalid else ""),
    ]
    for r in table:
        count = f" {_count(r.get('invalid_calls'))} |" if invalid else ""
        lines.append(
            f"| {r['checkpoint']} | {r['setting']} | {_ci(r['success'], signed=False)} | "
            f"{_ci(r['delta'])} | {r.get('effect') or '—'} | {r['real_calls']:.2f} |{count} "
            f"{r['rehearsal_tokens']:.0f} |"
        )
    return lines


def markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: verdicts, the test-time table, the world-model table, arms."""
    lines = [f"# Study {report['study_id']} ({report['status']})", ""]
    lines += [
        f"Suite `{report['suite']}`, SFT checkpoint `{report['model']}`, "
        f"{report['steps']} steps per arm. {report['cost']}".rstrip(),
        "",
    ]
    lines += ["## Verdicts", ""]
    if report.get("seed") is not None:  # reports written before the seed was recorded lack it
        lines += [
            f"On this study's seed ({report['seed']}) alone: a protocol states a verdict only "
            "where two seeds agree.",
            "",
        ]
    lines += [f"* **{v['verdict']}** — {v['claim']}: {v['evidence']}" for v in report["verdicts"]]
    lines += [
        "",
        f"Rules: ≥ claims {report['rules']['at_least']}; others {report['rules']['greater']}. "
        f"Effect of a setting: {report['rules'].get('effect', 'n/a')}.",
        "",
    ]
    lines += ["## Test-time rehearsal (success %, 95 % CI over tasks)", ""]
    lines += _table_lines(report["table"])
    lines += ["", "## World model (held-out, ungrounded rehearsal)", ""]
    lines += [
        "| checkpoint | exact | status agree | real NLL | success real | success rehearsed | gap "
        "| echo | error recall | errors as success | answer from a wrong rehearsal |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for w in report["world"]:
        c = w.get("collusion") or {}
        lines.append(
            f"| {w['checkpoint']} | {fmt(w['exact'])} | {fmt(w['status_agree'])} | "
            f"{fmt(w['real_nll'])} | {_ci(w.get('real_success'), signed=False)} | "
            f"{_ci(w['rehearsed_success'], signed=False)} | {_ci(w.get('gap'))} | "
            + " | ".join(fmt(c.get(k)) for k in COLLUSION_RATES)
            + " |"
        )
    return "\n".join(lines + _cost_lines(report)) + "\n"


def _cost_lines(report: dict[str, Any]) -> list[str]:
    """The arms table (status, steps, what they cost) and the evaluations' wall times."""
    costs = report["costs"]
    lines = [
        "",
        "## Arms and cost",
        "",
        "| arm | status | steps | wall min | Σ step min | median s/step | reason |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, a in report["arms"].items():
        c = costs["arms"].get(name, {})
        median = c.get("median_step_s")
        lines.append(
            f"| {name} | {a['status']} | {a['steps_done']} | {a['seconds'] / 60:.1f} | "
            f"{c.get('steps_s', 0.0) / 60:.1f} | {'n/a' if median is None else f'{median:.1f}'} "
            f"| {a['reason']} |"
        )
    redone = [
        f"`{k}` (earlier: {', '.join(a['retired'])})"
        for k, a in report["arms"].items()
        if a.get("retired")
    ]
    if redone:
        lines += ["", "Redone from the start in a new run: " + "; ".join(redone) + "."]
    evals = ", ".join(f"{k} {v / 60:.1f}" for k, v in costs["evals_s"].items())
    total = "Total" if report["status"] == "done" else "Total so far"
    lines += [
        "",
        f"Evaluation minutes per checkpoint: {evals or 'none yet'}. {total}: "
        f"{costs['total_h']:.2f} h (per arm the larger of wall and Σ step time).",
    ]
    if costs.get("lanes", 1) > 1:
        lines[-1] += (
            f" Run in {costs['lanes']} lanes (units side by side, each on its share of the "
            f"cores): {costs['wall_h']:.2f} h from start to {'end' if total == 'Total' else 'now'}."
        )
    return lines
