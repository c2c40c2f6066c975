"""A VitaBench task as the engine's ``Task``: what an episode of it needs, and nothing hidden.

* ``initial_state`` is the task's database as the agent-side code may hold it (``agent_db``:
  hidden annotation fields left out); ``make_env`` copies it for every episode;
* ``tools`` are the domain's schemas in the task's language;
* ``meta`` holds the domain and language (``env.DOMAIN_KEY``, ``env.LANGUAGE_KEY``), the
  upstream id, the frozen time, the agent's greeting, the agent's system prompt (as the task's
  ``TaskKey.POLICY``: VitaBench has no policy, its system prompt takes that place), the
  simulated user's system prompt (``TaskKey.USER_SYSTEM``) and, under ``evaluation``, what a
  judge reads: the instructions, the rubrics (spec §6.1) and the reference orders;
* ``user_turns`` is the caller's: VitaBench has no scripted user (its user is an LLM that
  reveals the instructions piece by piece), so the suite decides what is replayed without one.

The task id names the language (``vita-delivery/en/10711001``): the two delivery files share
their ids, and scores in the two languages are not interchangeable.
"""

from __future__ import annotations

from envace_engine.environments.vita.dataset import (
    TaskSpec,
    agent_db,
    check,
    required_orders,
    rubrics,
)
from envace_engine.environments.vita.env import DOMAIN_KEY, LANGUAGE_KEY, domain
from envace_engine.environments.vita.prompts import (
    GREETINGS,
    agent_system_prompt,
    time_text,
    user_system_prompt,
)
from envace_engine.types import Task, TaskKey


def suite_name(domain_name: str, language: str) -> str:
    """The suite of a task set: the language is part of the name where a set has two."""
    return f"vita-{domain_name}" if domain_name == "instore" else f"vita-{domain_name}-{language}"


def task_id(domain_name: str, language: str, vita_id: str) -> str:
    """The engine's id of a VitaBench task."""
    return f"vita-{domain_name}/{language}/{vita_id}"


def build_task(domain_name: str, language: str, spec: TaskSpec, opening: str) -> Task:
    """One VitaBench task as a ``Task``; ``opening`` is its one replayed user turn."""
    check(domain_name, language)
    return Task(
        id=task_id(domain_name, language, spec.id),
        suite=suite_name(domain_name, language),
        user_turns=(opening,),
        tools=tuple(domain(domain_name, language).schemas),
        initial_state=agent_db(spec),
        meta={
            DOMAIN_KEY: domain_name,
            LANGUAGE_KEY: language,
            "vita_id": spec.id,
            "time": time_text(spec.environment.time, language),
            TaskKey.GREETING: GREETINGS[language],
            TaskKey.POLICY: agent_system_prompt(spec, language),
            TaskKey.USER_SYSTEM: user_system_prompt(spec, language),
            "evaluation": {
                "instructions": spec.instructions,
                "rubrics": list(rubrics(spec)),
                "required_orders": list(required_orders(spec)),
            },
        },
    )
