"""Pipeline data: the contract between the engine, storage and the studio.

Everything here is a frozen dataclass of plain values so that storage can flatten it into
Parquet rows without importing anything heavy, and so that nothing mutates an episode after
the rollout loop hands it to a sink.

Token layout (see docs/masking.md):

* ``Episode.segments`` is the *agent context*: one token sequence made of ``prompt``, ``act``,
  ``tool``/``real`` (tool messages the agent saw) and ``user`` segments, in order. Only ``act``
  tokens are trained in it.
* ``Episode.rehearsals`` holds every world-role generation. EnvACE renders each rehearsal as a
  fresh two-message chat, so each one is its own sequence: ``prompt_ids`` plus one ``rehearse``
  segment of sampled tokens, trained with the rehearse-role advantage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Role(StrEnum):
    """Who wrote a segment's tokens. Only ``act`` and ``rehearse`` are ever trained."""

    PROMPT = "prompt"  # task data: system + first user message, tool schemas
    ACT = "act"  # the policy acting (sampled)
    REHEARSE = "rehearse"  # the policy playing the world (sampled, in a rehearsal sequence)
    REAL = "real"  # a tool message whose content came from the real environment
    TOOL = "tool"  # a tool message whose content came from a rehearsal or a simulator
    USER = "user"  # a later user turn replayed from the task
    SIMULATED_USER = "simulated_user"  # a user turn written by a user simulator (never trained)

    @property
    def trained(self) -> bool:
        return self in (Role.ACT, Role.REHEARSE)


class Mode(StrEnum):
    """Who answers the agent's tool calls (docs/method.md §1)."""

    REHEARSAL = "rehearsal"
    REAL = "real"
    SIMULATOR = "simulator"


class StopReason(StrEnum):
    """Why an episode ended. Stored with every episode: a failed rollout is data."""

    DONE = "done"  # final answer after the last user turn
    MALFORMED_CALL = "malformed_call"  # the agent's tool call did not parse
    INVALID_REHEARSAL = "invalid_rehearsal"  # the world role flagged the call as invalid
    UNPARSEABLE_REHEARSAL = "unparseable_rehearsal"  # rehearse output did not parse
    CONTEXT_LIMIT = "context_limit"  # the next prompt would not fit the context budget
    TURN_LIMIT = "turn_limit"  # max agent replies per user turn reached
    TOKEN_LIMIT = "token_limit"  # max new tokens for the episode reached
    TRUNCATED = "truncated"  # a generation hit max_new_tokens mid-reply
    SAMPLER_ERROR = "sampler_error"  # the sampler failed or aborted the request
    USER_STOP = "user_stop"  # the simulated user ended the conversation (a normal end, like DONE)
    USER_ERROR = "user_error"  # the user simulator failed or broke the protocol
    MAX_STEPS = "max_steps"  # the conversation reached its message cap (simulated user)
    TOO_MANY_ERRORS = "too_many_errors"  # too many tool errors in one episode (simulated user)
    # The real environment broke, not the agent (an MCP server: environments/mcp, docs/mcp.md).
    ENV_EXITED = "env_exited"  # its process exited or closed the connection mid-episode
    ENV_TIMEOUT = "env_timeout"  # a call got no answer within the environment's timeout
    ENV_MALFORMED = "env_malformed"  # it answered with something that is not a valid result


class MetaKey:
    """Keys of ``Episode.meta`` that other code reads. Plain strings: meta is stored as JSON.

    Rollout: ``SAMPLED_TOKENS`` (policy tokens sampled, act + rehearse), ``USER_TURNS_REACHED``,
    ``NONCANONICAL`` (replies whose ids are not their text's canonical tokenisation). Training:
    ``ADVANTAGES`` (``{"act": mean, "rehearse": mean}``). Fidelity: ``REAL_NLL``
    (``{call_index: nats per token of the real response}``). Evaluation and test-time rehearsal
    (docs/rehearsal.md): ``SUCCESS``, ``BUDGET``, ``REHEARSAL_MODE``, ``REPEAT``, the token
    accounting ``ACT_TOKENS``/``REHEARSAL_TOKENS``/``MEMORY_TOKENS``, ``MEMORY``, ``MEMORIES``,
    ``IMAGINED_IDS`` on a committed episode, and in ``select`` mode ``SELECTED`` (the index of
    the imagined episode whose first reply it replayed, or None) and ``OUTLOOKS`` (how each
    imagined episode looked); ``IMAGINED_FOR``, ``INDEX``, ``MEMORY_BEFORE`` on an imagined one.
    Scoring: ``SCORE_BASIS`` (the basis a suite with several scores by, docs/tasks.md);
    ``SCORE_PARTS`` (a whole-episode score's named parts, ``Score.components``: τ²'s reward
    components, VitaBench's ``rubric_score`` and ``order_check``).
    Simulated users: ``USER_MESSAGES`` (the user's messages, in order).
    """

    SAMPLED_TOKENS = "sampled_tokens"
    USER_TURNS_REACHED = "user_turns_reached"
    NONCANONICAL = "noncanonical"
    EMPTY_RETRIES = "empty_retries"  # empty replies sampled again (simulated-user episodes)
    ADVANTAGES = "advantages"
    REAL_NLL = "real_nll"
    SUCCESS = "success"
    BUDGET = "budget"
    REHEARSAL_MODE = "rehearsal_mode"
    REPEAT = "repeat"
    ACT_TOKENS = "act_tokens"
    REHEARSAL_TOKENS = "rehearsal_tokens"
    MEMORY_TOKENS = "memory_tokens"
    MEMORY = "memory"
    MEMORIES = "memories"
    IMAGINED_IDS = "imagined_ids"
    SELECTED = "selected"
    OUTLOOKS = "outlooks"
    IMAGINED_FOR = "imagined_for"
    INDEX = "index"
    MEMORY_BEFORE = "memory_before"
    SCORE_BASIS = "score_basis"
    SCORE_PARTS = "score_parts"
    USER_MESSAGES = "user_messages"


class TaskKey:
    """Keys of ``Task.meta`` that code outside the suite reads (plain strings: meta is JSON).

    ``POLICY``: a domain policy the agent gets in its system message (τ²). ``USER_SYSTEM``: the
    system prompt of a simulated user (τ²: guidelines plus the task's scenario). ``MEMORY``: the
    rehearsal-memory block the task's context text ends with (``memory_prompts.with_memory``),
    which the world role's prompt leaves out (``prompts.rehearse_messages``). ``WORLD_STATE``:
    below.
    """

    POLICY = "policy"
    USER_SYSTEM = "user_system"
    MEMORY = "rehearsal_memory"
    # What the environment holds at the task's start, in the environment's own words (every
    # fact a tool can read, e.g. note texts): the world role's state block when
    # ``rollout.world_state`` is on (``prompts.rehearse_messages``). Never the agent's prompt.
    WORLD_STATE = "world_state"
    # The agent's fixed first message of a simulated-user conversation, which the user answers
    # (VitaBench's, in the task's language); without it the rollout's default greeting (τ²'s).
    GREETING = "greeting"


@dataclass(frozen=True)
class ToolCall:
    """A parsed tool call: name plus JSON arguments. ``raw`` is the text it was parsed from."""

    name: str
    arguments: dict[str, Any]
    raw: str = ""


@dataclass(frozen=True)
class ToolError:
    """A structured error: a stable ``code`` (docs/parsing.md), a message, the offending text."""

    code: str
    message: str
    text: str = ""


@dataclass(frozen=True)
class ToolResult:
    """What a tool call returned: a JSON value, or an error the model sees as the tool message."""

    value: Any = None
    error: ToolError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class Task:
    """One task: user turns, tools, the environment's initial state and reference calls.

    ``reference_calls[t]`` are the calls that solve user turn ``t``; ``reference_results[t]``
    their results obtained by executing them for real. JSONL schema: docs/tasks.md.
    """

    id: str
    suite: str
    user_turns: tuple[str, ...]
    tools: tuple[dict[str, Any], ...]  # OpenAI function schemas
    initial_state: dict[str, Any]
    reference_calls: tuple[tuple[ToolCall, ...], ...] = ()
    reference_results: tuple[tuple[Any, ...], ...] = ()
    system: str = ""
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Segment:
    """A run of tokens with one role. ``logprobs`` are the sampler's, only for sampled roles."""

    role: Role
    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.logprobs is not None and len(self.logprobs) != len(self.token_ids):
            raise ValueError(
                f"{self.role} segment has {len(self.token_ids)} tokens but "
                f"{len(self.logprobs)} logprobs"
            )


@dataclass(frozen=True)
class Replay:
    """An agent reply sampled in another episode, to be an episode's first reply unchanged
    (test-time ``select``: the chosen imagined episode's first reply). ``prompt_ids`` is the
    prompt it was sampled after: the replaying episode's first prompt must be the same."""

    prompt_ids: tuple[int, ...]
    reply: Segment


@dataclass(frozen=True)
class Rehearsal:
    """One world-role generation: its own prompt and the sampled ``rehearse`` segment."""

    call_index: int  # index into Episode.calls
    prompt_ids: tuple[int, ...]
    completion: Segment
    grounded: bool  # whether reference results were put in the prompt (docs/method.md §2)
    stated: bool = False  # whether the task's world state was put in the prompt (same section)


@dataclass(frozen=True)
class CallRecord:
    """One tool call of the agent and every answer it got.

    ``rehearsed`` is the parsed world-role answer (rehearsal mode), ``real`` the real
    environment's answer (real mode, or the shadow environment in rehearsal mode),
    ``simulated`` a frozen simulator's answer, ``checked`` the schema check's error for a call
    it refused before the world role was asked (``RolloutConfig.check_calls``). ``shown``
    names the one the agent saw.
    """

    turn: int  # user turn index
    step: int  # which agent reply of the episode made the call, counting from 1
    call: ToolCall
    shown: str  # "rehearsed" | "real" | "simulated" | "checked"
    rehearsed: ToolResult | None = None
    real: ToolResult | None = None
    simulated: ToolResult | None = None
    checked: ToolResult | None = None

    def seen(self) -> ToolResult | None:
        """The answer the agent saw (None: an unparseable rehearsal or simulation)."""
        answers = {
            "rehearsed": self.rehearsed,
            "real": self.real,
            "simulated": self.simulated,
            "checked": self.checked,
        }
        return answers.get(self.shown)


@dataclass(frozen=True)
class Episode:
    """One rollout of one task. ``reward`` is None until scored; None also means unscorable."""

    id: str
    task_id: str
    suite: str
    mode: Mode
    group_id: str
    segments: tuple[Segment, ...]
    rehearsals: tuple[Rehearsal, ...] = ()
    calls: tuple[CallRecord, ...] = ()
    stop_reason: StopReason = StopReason.DONE
    stop_detail: str = ""
    reward: float | None = None
    final_answers: tuple[str, ...] = ()  # the agent's final answer per user turn
    drift: int = 0  # next-prompt prefix mismatches found by the token builder
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def token_ids(self) -> tuple[int, ...]:
        return tuple(t for s in self.segments for t in s.token_ids)


@dataclass(frozen=True)
class TrainRow:
    """One step-as-sample training row: a prompt and the tokens one role generated after it."""

    episode_id: str
    group_id: str
    role: Role
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    old_logprobs: tuple[float, ...]
    reward: float | None
