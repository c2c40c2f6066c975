"""Real run directories for studio tests: Episode objects written by storage's RunWriter.

The episodes are built by hand (plain dataclasses from envace_engine.types) so tests know every
value they should see on a page: a rehearsal-mode episode whose first call was rehearsed right
and whose second was rehearsed as a success while the real tool failed.
"""

from __future__ import annotations

from pathlib import Path

from envace_engine.types import (
    CallRecord,
    Episode,
    Mode,
    Rehearsal,
    Role,
    Segment,
    StopReason,
    ToolCall,
    ToolError,
    ToolResult,
)
from storage.shards import RunWriter


def seg(role: Role, text: str, ids: tuple[int, ...]) -> Segment:
    """A segment; sampled roles get log-probs."""
    return Segment(role, ids, text, tuple(-0.5 for _ in ids) if role.trained else None)


def episode(
    index: int,
    step: int,
    reward: float,
    fail_second: bool = True,
    mode: Mode = Mode.REHEARSAL,
    prefix: str = "ep",
) -> Episode:
    """A two-call rehearsal-mode episode on the toy warehouse world."""
    look = ToolCall("get_stock", {"item": "bolts"}, '{"name": "get_stock", ...}')
    ship = ToolCall("ship", {"item": "bolts", "qty": 500}, '{"name": "ship", ...}')
    real_ship = (
        ToolResult(error=ToolError("TOOL_EXECUTION_ERROR", "only 40 bolts in stock"))
        if fail_second
        else ToolResult(value={"shipped": 500})
    )
    calls = (
        CallRecord(  # step: agent replies so far, as the rollout records it (1-based)
            0,
            1,
            look,
            "rehearsed",
            rehearsed=ToolResult(value={"item": "bolts", "qty": 40}),
            real=ToolResult(value={"item": "bolts", "qty": 40}),
        ),
        CallRecord(
            0, 2, ship, "rehearsed", rehearsed=ToolResult(value={"shipped": 500}), real=real_ship
        ),
    )
    segments = (
        seg(Role.PROMPT, "system: warehouse tools\nuser: ship 500 bolts", (1, 2, 3, 4)),
        seg(
            Role.ACT,
            '<tool_call>{"name": "get_stock", "arguments": {"item": "bolts"}}</tool_call>',
            (5, 6, 7),
        ),
        seg(Role.TOOL, '{"item": "bolts", "qty": 40}', (8, 9)),
        seg(
            Role.ACT,
            '<tool_call>{"name": "ship", "arguments": {"item": "bolts", "qty": 500}}</tool_call>',
            (10, 11, 12),
        ),
        seg(Role.TOOL, '{"shipped": 500}', (13, 14)),
        seg(Role.ACT, "Shipped 500 bolts.", (15, 16)),
    )
    rehearsals = (
        Rehearsal(
            0,
            (1, 2, 3, 20, 21),
            seg(
                Role.REHEARSE,
                '<execution_result>{"item": "bolts", "qty": 40}</execution_result>',
                (22, 23),
            ),
            grounded=True,
        ),
        Rehearsal(
            1,
            (1, 2, 3, 24, 25),
            seg(Role.REHEARSE, '<execution_result>{"shipped": 500}</execution_result>', (26, 27)),
            grounded=True,
        ),
    )
    return Episode(
        id=f"{prefix}-{step}-{index}",
        task_id=f"warehouse-{index % 3}",
        suite="toy",
        mode=mode,
        group_id=f"g-{step}-{index // 2}",
        segments=segments,
        rehearsals=rehearsals,
        calls=calls,
        reward=reward,
        stop_reason=StopReason.DONE,
        final_answers=("Shipped 500 bolts.",),
        meta={"advantages": {"act": reward - 0.5, "rehearse": reward - 0.25}},
    )


def make_run(root: Path, run_id: str = "train-demo", steps: int = 2, per_step: int = 4) -> str:
    """A finished train run with ``steps`` steps of ``per_step`` episodes and curves."""
    writer = RunWriter.create(root, "train", model="tiny", suite="toy", run_id=run_id)
    for step in range(steps):
        rewards = [1.0 if (i + step) % 2 == 0 else 0.0 for i in range(per_step)]
        writer.episodes(
            step, [episode(i, step, r, fail_second=r < 1) for i, r in enumerate(rewards)]
        )
        writer.metrics(
            step,
            {
                "reward/act": 0.2 + 0.1 * step,
                "reward/rehearse": 0.1 * step,
                "fidelity/score": 0.6 + 0.05 * step,
                "loss": 1.0 - 0.2 * step,
                "rollout/logprob_diff": 0.01 + 0.002 * step,
                "rollout/mismatch_kl": 1e-4,
            },
        )
        writer.progress(step + 1, steps, f"step {step + 1}")
    writer.finish("done")
    return run_id


def make_sweep(root: Path, run_id: str = "sweep-demo", config: dict | None = None) -> str:
    """A finished sweep run laid out as testtime.evaluate.run_sweep writes it: plain N=0
    once, then parallel and sequential N=2; three tasks each; committed episodes are real-mode,
    imagined ones rehearsal-mode (they must not count)."""
    writer = RunWriter.create(
        root, "sweep", model="tiny", suite="toy", run_id=run_id, config=config
    )
    settings = [(0, 0, [0.0, 0.0, 1.0]), (2, 0, [1.0, 0.0, 1.0]), (2, 1, [1.0, 1.0, 0.5])]
    for step, (budget, sequential, rewards) in enumerate(settings):
        eps = [episode(i, step, r, mode=Mode.REAL, prefix="sw") for i, r in enumerate(rewards)]
        eps.append(episode(9, step, 0.0, prefix="sw"))  # an imagined episode
        writer.episodes(step, eps)
        writer.metrics(
            step,
            {
                "sweep/budget": budget,
                "sweep/sequential": sequential,
                "sweep/rehearsal_tokens": 120.0 * budget + 10 * sequential,
                "sweep/checkpoint": 0,
            },
        )
    writer.finish("done")
    return run_id


def study_state(config):
    """A hand-made finished study: 8 tasks; sft solves 4 (1 in its rehearsed world, exact 0.3),
    envace 6 (5 rehearsed, exact 0.7; 8 at parallel N=2), and so on for the other arms."""
    from recipes.study.state import (
        ArmState,
        CheckpointEval,
        FidelityResult,
        SettingResult,
        StudyState,
    )

    tasks = [f"t{i}" for i in range(8)]

    def setting(label, budget, mode, wins, invalid):
        success = {t: 1.0 if i < wins else 0.0 for i, t in enumerate(tasks)}
        costs = (0.5, 1.0, 20.0, 10.0 * budget, 5.0, 1.0, invalid)
        return SettingResult(label, budget, mode, success, *costs)

    def evaluated(name, plain, parallel2, rehearsed, exact):
        # sft's settings lack invalid_calls, as those of a study run before it was counted
        invalid = None if name == "sft" else 0.25
        settings = {
            "plain N=0": setting("plain N=0", 0, "none", plain, invalid),
            "parallel N=2": setting("parallel N=2", 2, "parallel", parallel2, invalid),
        }
        fid = FidelityResult(
            rehearsed_success={t: 1.0 if i < rehearsed else 0.0 for i, t in enumerate(tasks)},
            pairs=16,
            exact=exact,
            status_agree=0.9,
            score=0.8,
            real_nll=0.4,
            wall_s=1.0,
            exact_by_task={t: exact for t in tasks},
        )
        return CheckpointEval(name, f"s--eval-{name}", settings, fid)

    state = StudyState("study-demo", status="done")
    state.arms = {a: ArmState(f"study-demo--{a}", "done", 40) for a in config.arms}
    state.evals = {
        "sft": evaluated("sft", 4, 4, 1, 0.3),
        "envace": evaluated("envace", 6, 8, 5, 0.7),
        "real-grpo": evaluated("real-grpo", 5, 5, 1, 0.3),
        "act-only": evaluated("act-only", 5, 5, 2, 0.3),
        "shared-baseline": evaluated("shared-baseline", 6, 6, 4, 0.6),
    }
    state.curves = {
        arm: {
            str(s): {"heldout/fidelity_exact": 0.3 + 0.01 * s * k, "reward/mean": 0.5}
            for s in (0, 10, 20)
        }
        for k, arm in enumerate(config.arms)
    }
    return state


def make_study(root: Path, run_id: str = "study-demo") -> str:
    """A study run folder holding the report of ``study_state`` (what the Study page reads)."""
    from envace_engine.config import build
    from recipes.study.config import StudyConfig
    from recipes.study.report import build_report, write_report

    config = build(StudyConfig, {"model": "tiny", "eval": {"bootstrap": 300}})
    with RunWriter.create(root, "study", model="tiny", suite="toy", run_id=run_id) as writer:
        write_report(build_report(config, study_state(config)), writer.path)
    return run_id
