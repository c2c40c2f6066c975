"""What the simulated user of a τ² task is told, and the scripted opening used without one.

The user model's system prompt is τ²'s: the global guidelines (``simulation_guidelines.md``:
play a customer, one message at a time, follow the scenario, invent nothing, disclose only when
asked, end with ``###STOP###`` / ``###TRANSFER###`` / ``###OUT-OF-SCOPE###``), then the task's
scenario inside ``<scenario>…</scenario>``. The sampler that plays the user lives in
``rollout/user.py``; it reads this text from ``Task.meta["user_system"]``.
"""

from __future__ import annotations

from envace_engine.environments.tau2.dataset import Instructions, TaskSpec, user_guidelines


def _block(label: str, text: str | None) -> list[str]:
    if text is None or not text.strip():
        return []
    lines = text.strip().splitlines()
    return [f"\t{label}:", *(f"\t\t{line}" for line in lines)]


def scenario_text(spec: TaskSpec) -> str:
    """The task's user scenario as text: optional persona, then the instructions."""
    scenario = spec.user_scenario
    parts: list[str] = []
    if scenario.persona and scenario.persona.strip():
        parts += ["Persona:", f"\t{scenario.persona.strip()}", ""]
    parts.append("Instructions:")
    ins = scenario.instructions
    if isinstance(ins, Instructions):
        parts += _block("Domain", ins.domain)
        parts += _block("Reason for call", ins.reason_for_call)
        parts += _block("Known info", ins.known_info)
        parts += _block("Unknown info", ins.unknown_info)
        parts += _block("Task instructions", ins.task_instructions)
    else:
        parts.append(f"\t{ins.strip()}")
    return "\n".join(parts)


def user_system(spec: TaskSpec) -> str:
    """The simulated user's system prompt (airline and retail users have no tools)."""
    return f"{user_guidelines(False)}\n\n<scenario>\n{scenario_text(spec)}\n</scenario>"


def scripted_opening(spec: TaskSpec) -> str:
    """The first user message replayed when no user model is configured: the scenario's reason
    for call and known info, verbatim (a non-standard, LLM-free protocol: docs/tasks.md)."""
    ins = spec.user_scenario.instructions
    if isinstance(ins, Instructions):
        parts = [ins.reason_for_call, ins.known_info or ""]
        return "\n\n".join(p.strip() for p in parts if p.strip())
    return (spec.ticket or ins).strip()
