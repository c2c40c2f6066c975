"""The fixed texts of a VitaBench conversation, in the task's language.

* the agent's system prompt: upstream's ``agent_system_prompt`` with ``{time}`` = the task's
  frozen time and its weekday ("2025-06-21 11:20:00 Saturday", "… 星期六"); there is no
  domain policy;
* the agent's fixed greeting, the conversation's first message, which the user answers;
* the simulated user's system prompt: upstream's ``user_system_prompt`` with the persona
  (``str`` of the user profile, as upstream) and the task's instructions.
"""

from __future__ import annotations

from datetime import datetime

from envace_engine.environments.vita.dataset import TIME_FORMAT, TaskSpec, prompt

GREETINGS = {"zh": "你好，请问需要什么服务？", "en": "Hello, how can I help you?"}
WEEKDAYS = {
    "en": ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"),
    "zh": ("星期一", "星期二", "星期三", "星期四", "星期五", "星期六", "星期日"),
}


def time_text(time: str, language: str) -> str:
    """A frozen time with its weekday: ``"2025-06-21 11:20:00 Saturday"``."""
    weekday = datetime.strptime(time, TIME_FORMAT).weekday()
    return f"{time} {WEEKDAYS[language][weekday]}"


def agent_system_prompt(spec: TaskSpec, language: str) -> str:
    """The agent's system prompt for a task."""
    return prompt("agent_system_prompt", language).format(
        time=time_text(spec.environment.time, language)
    )


def user_system_prompt(spec: TaskSpec, language: str) -> str:
    """The simulated user's system prompt for a task (persona and instructions)."""
    persona = str(spec.user_scenario.user_profile)
    return prompt("user_system_prompt", language).format(
        persona=persona, instructions=spec.instructions
    )
