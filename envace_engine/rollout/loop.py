"""The rollout loop (docs/method.md §1) for a batch of episodes at once.

Every episode is a small state machine: it waits either for an **act** generation (the agent's
next reply) or for a **world** generation (the rehearsal or simulation of one pending tool
call), or it has ended with a stop reason. At each micro-step all episodes waiting for act go to
the sampler as one batch, then all episodes waiting for the world as one batch, so a GRPO batch
of 8 tasks x group 4 keeps the sampler's batch full instead of generating one reply at a time.
A sampler with sessions (HFSampler, SGLangSampler) instead gets each episode's next request as
soon as its previous one finished (``_Runner.run``), so no episode waits for a slower one.
Shared prompt prefixes (a group's first prompt, a world's rehearse instructions, an episode's
history) are the sampler's business: HFSampler keeps their K/V (``samplers.embedded.kv``),
SGLang its radix cache.

Per reply: each tool call gets its own world generation, in order (later calls see the answers
to earlier ones), and the results of one reply are appended together after the last call. In
``real`` mode calls run on the episode's own environment and nothing is generated for them. In
``rehearsal`` mode a **shadow** environment (``shadow_real``) runs the same calls so that each
``CallRecord`` holds the rehearsed and the real answer; the agent only ever sees the rehearsed
one. Rewards are not computed here: ``score_inputs`` gives ``Suite.score`` what it needs.

An environment that breaks (``EnvironmentFault``: an MCP server that exited, hung or answered
off-protocol) ends its episode with the fault's stop reason; the batch goes on. Every episode's
environment is closed (``close_env``) when the episode ends, and all of them when the batch
ends or raises, so no server process outlives its rollout.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from envace_engine import environments
from envace_engine.config import ROLLOUT_DEFAULTS as _D
from envace_engine.environments.base import (
    Environment,
    EnvironmentFault,
    ScoringBasis,
    Suite,
    close_env,
)
from envace_engine.environments.tool_environment import check_call, parameter_schemas
from envace_engine.rollout.live import Live
from envace_engine.rollout.parsing import INVALID_CALL_CODES, parse_rehearsal, parse_tool_calls
from envace_engine.rollout.prompts import (
    Message,
    RehearseContext,
    pick_examples,
    rehearse_messages,
    tool_message,
)
from envace_engine.rollout.tokens import ChatTokenizer, TokenSequence
from envace_engine.rollout.turns import Turns
from envace_engine.rollout.user import AGENT_STOP, UserSimulator
from envace_engine.samplers.base import Generation, Sampler, SamplingParams, Session, SessionSampler
from envace_engine.seeds import derive_seed
from envace_engine.types import (
    CallRecord,
    Episode,
    MetaKey,
    Mode,
    Rehearsal,
    Replay,
    Role,
    Segment,
    StopReason,
    Task,
    ToolCall,
    ToolError,
    ToolResult,
)


@dataclass(frozen=True)
class RolloutConfig:
    """Settings of one rollout batch. Token caps are per generation unless named otherwise.

    Defaults come from ``config.ROLLOUT_DEFAULTS`` (the config file's ``[rollout]`` section).
    """

    mode: Mode = Mode.REHEARSAL
    max_turns: int = _D.max_turns  # agent replies per user turn
    max_new_tokens_act: int = _D.max_new_tokens_act
    max_new_tokens_rehearse: int = _D.max_new_tokens_rehearse
    max_episode_tokens: int = _D.max_episode_tokens  # policy-sampled tokens per episode
    context_limit: int = _D.context_limit  # prompt + max_new_tokens of any generation
    temperature: float = _D.temperature
    top_p: float = _D.top_p
    top_k: int = -1
    seed: int | None = None
    grounded_rehearsal: bool = _D.grounded_rehearsal  # reference results in the rehearse prompt
    rehearse_history: bool = _D.rehearse_history  # the conversation so far in rehearse prompts
    world_state: bool = _D.world_state  # the task's world state in rehearse prompts
    n_examples: int = _D.n_examples  # worked examples from other tasks, in both prompts
    # A rehearsed INVALID_* error ends the episode (EnvACE's code): an episode ended on a
    # correct flag scores as a failure, which GRPO holds against the world role (docs/method.md
    # §7). False makes the rehearsed error a tool message, as a real tool's error is.
    end_on_invalid_rehearsal: bool = _D.end_on_invalid_rehearsal
    # Rehearsal/simulator mode: a call the tool layer would refuse before running anything
    # (environments.tool_environment.check_call) gets that error and no world generation; the
    # agent reads it as a tool message, as after a real tool's error (docs/rehearsal.md).
    check_calls: bool = _D.check_calls
    simulator: Sampler | None = None  # the frozen simulator (simulator mode)
    simulator_tokenizer: Any = None  # its tokenizer when it differs from the policy's
    shadow_real: bool = True  # rehearsal/simulator mode: record real answers beside them
    check_drift: bool = True  # compare every next prompt with a full re-render
    # A simulated user (rollout/turns.py) instead of replayed turns; never trained.
    user: UserSimulator | None = None
    max_steps: int = 200  # messages per simulated-user conversation (τ²'s max_steps)
    max_tool_errors: int = 10  # error results per simulated-user conversation (τ²'s cap)

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", Mode(self.mode))
        limits = ("max_turns", "max_new_tokens_act", "max_new_tokens_rehearse", "max_steps")
        for name in (*limits, "max_tool_errors"):
            if getattr(self, name) < 1:
                raise ValueError(f"RolloutConfig.{name}={getattr(self, name)}: set it to >= 1")
        if self.max_episode_tokens < 1 or self.context_limit < 1:
            raise ValueError("RolloutConfig: max_episode_tokens and context_limit must be >= 1")
        if self.n_examples < 0:
            raise ValueError(f"RolloutConfig.n_examples={self.n_examples}: use 0 or more")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError("RolloutConfig: temperature must be >= 0 and top_p in (0, 1]")
        if self.mode is Mode.SIMULATOR and self.simulator is None:
            raise ValueError("simulator mode needs RolloutConfig.simulator (a Sampler)")

    def params(self, max_new_tokens: int, stop_id: int, seed: int | None) -> SamplingParams:
        """Sampling params for one batch."""
        return SamplingParams(
            max_new_tokens=max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            stop_token_ids=(stop_id,),
            seed=seed,
        )


class _Runner:
    """Drives a batch of ``Live`` episodes through act and world micro-steps (and, between
    turns, replayed or simulated user messages: ``turns.Turns``)."""

    def __init__(
        self, sampler: Sampler, tokenizer: Any, config: RolloutConfig, suite: Suite
    ) -> None:
        self.sampler = sampler
        self.config = config
        self.suite = suite
        self.chat = ChatTokenizer(tokenizer)
        world_tok = config.simulator_tokenizer if config.mode is Mode.SIMULATOR else None
        self.world_chat = ChatTokenizer(world_tok) if world_tok is not None else self.chat
        self.world_sampler = sampler
        if config.mode is Mode.SIMULATOR:
            assert config.simulator is not None  # RolloutConfig.__post_init__ refuses None
            self.world_sampler = config.simulator
        self.calls_made = 0
        self.turns = Turns(config, self.chat, suite, self._check_act_limits)

    @property
    def needs_env(self) -> bool:
        """Whether episodes talk to the real environment (real mode, or its shadow)."""
        return self.config.mode is Mode.REAL or self.config.shadow_real

    def start(
        self,
        task: Task,
        ep_id: str,
        group_id: str,
        pool: Sequence[Task],
        env: Environment | None = None,
    ) -> Live:
        """A new episode at its first act prompt (``env``: its environment, opened already;
        else one is made here when the episode needs one)."""
        cfg = self.config
        examples = pick_examples(task, pool, cfg.n_examples)
        if env is None and self.needs_env:
            env = self.suite.make_env(task)
        try:
            return self._open(task, ep_id, group_id, examples, env)
        except BaseException:
            close_env(env)  # the episode never started: nothing else would close it
            raise

    def _open(
        self,
        task: Task,
        ep_id: str,
        group_id: str,
        examples: tuple[Task, ...],
        env: Environment | None,
    ) -> Live:
        cfg = self.config
        tools = self.turns.first_tools(task, env)
        ctx = RehearseContext(
            tools=tuple(tools),
            task=task,
            grounded=cfg.grounded_rehearsal,
            with_history=cfg.rehearse_history,
            examples=examples,
            stated=cfg.world_state,
        )
        messages, prompt = self.turns.opening(task, tools, examples)
        live = Live(ep_id, group_id, task, env, ctx, TokenSequence(), messages, len(messages) - 1)
        live.seq.append(Role.PROMPT, prompt, messages[-1].content)
        live.to_user = cfg.user is not None  # a simulated user speaks first
        _start_turn(live.env, 0)
        self._check_act_limits(live)
        return live

    def run(self, lives: list[Live], progress: Callable[[int, int], None] | None) -> None:
        """Generate until every episode has ended; ``progress(ended, total)`` as they end.

        A ``SessionSampler`` (HFSampler's continuous batching, SGLang's continuous submission)
        that also plays the world gets each episode's next request as soon as its last one
        finished; otherwise (a separate simulator) episodes advance in micro-steps.
        """
        one_sampler = self.world_sampler is self.sampler and self.config.user is None
        if isinstance(self.sampler, SessionSampler) and one_sampler:
            self._run_continuous(lives, progress, self.sampler)
        else:
            self._run_micro_steps(lives, progress)

    def _run_continuous(
        self,
        lives: list[Live],
        progress: Callable[[int, int], None] | None,
        sampler: SessionSampler,
    ) -> None:
        """One decode session; a finished generation moves its episode on and resubmits it."""
        cfg = self.config
        seed = None if cfg.seed is None else derive_seed(cfg.seed, "call", self.calls_made)
        self.calls_made += 1
        ended = -1
        with sampler.session(cfg.params(cfg.max_new_tokens_act, self.chat.eos_id, seed)) as session:
            for i, live in enumerate(lives):
                self._submit(session, i, live)
            while session.busy:
                now = sum(e.stop is not None for e in lives)
                if progress is not None and now != ended:
                    progress(now, len(lives))
                    ended = now
                for key, gen in session.step():
                    assert isinstance(key, tuple)  # (episode, "act" | "world"): see _submit
                    i, kind = key
                    (self.on_act if kind == "act" else self.on_world)(lives[i], gen)
                    self._submit(session, i, lives[i])
        if progress is not None:
            progress(sum(e.stop is not None for e in lives), len(lives))

    def _submit(self, session: Session, i: int, live: Live) -> None:
        """Queue episode ``i``'s next generation, if it waits for one."""
        cfg = self.config
        if live.waiting_world:
            stops = frozenset({self.world_chat.eos_id})
            session.submit((i, "world"), live.world_prompt, cfg.max_new_tokens_rehearse, stops)
        elif live.waiting_act:
            stops = frozenset({self.chat.eos_id})
            session.submit((i, "act"), list(live.seq.ids), cfg.max_new_tokens_act, stops)

    def _run_micro_steps(
        self, lives: list[Live], progress: Callable[[int, int], None] | None
    ) -> None:
        """All episodes waiting for act as one batch, then all waiting for the world."""
        while True:
            if progress is not None:
                progress(sum(e.stop is not None for e in lives), len(lives))
            acting = [e for e in lives if e.waiting_act]
            if acting:
                prompts = [e.seq.ids for e in acting]
                gens = self._generate(
                    self.sampler, prompts, self.config.max_new_tokens_act, self.chat
                )
                for live, gen in zip(acting, gens, strict=True):
                    self.on_act(live, gen)
            world = [e for e in lives if e.waiting_world]  # includes those that just acted
            if world:
                prompts = [e.world_prompt for e in world]
                cap = self.config.max_new_tokens_rehearse
                gens = self._generate(self.world_sampler, prompts, cap, self.world_chat)
                for live, gen in zip(world, gens, strict=True):
                    self.on_world(live, gen)
            users = [e for e in lives if e.waiting_user]  # a simulated user's turn
            if users:
                self.turns.ask_users(users)
            if not acting and not world and not users:
                return

    def _generate(
        self, sampler: Sampler, prompts: list[list[int]], cap: int, chat: ChatTokenizer
    ) -> list[Generation]:
        """One sampler call for the whole micro-step batch, results in prompt order."""
        cfg = self.config
        seed = None if cfg.seed is None else derive_seed(cfg.seed, "call", self.calls_made)
        self.calls_made += 1
        out = sampler.generate([list(p) for p in prompts], cfg.params(cap, chat.eos_id, seed))
        if len(out) != len(prompts):
            raise RuntimeError(f"sampler returned {len(out)} generations for {len(prompts)}")
        return out

    def _sample_again(self, live: Live, stopped: bool, text: str, n_tokens: int) -> bool:
        """In a simulated user's conversation, an empty reply (no call, no text) is dropped
        and the agent samples again, up to ``EMPTY_RETRIES`` times, as VitaBench's runner
        retries an empty agent message (each reply's count starts again); the dropped tokens
        count as sampled, never as kept."""
        if self.config.user is None or not stopped or text.strip():
            live.empty_streak = 0
            return False
        if live.empty_streak >= EMPTY_RETRIES:
            live.empty_streak = 0
            return False
        live.empty_streak += 1
        live.empty_retries += 1
        live.sampled += n_tokens
        return True

    def on_act(self, live: Live, gen: Generation) -> None:
        """Append the agent's reply and decide what the episode waits for next."""
        if gen.finish_reason in ("abort", "error"):
            live.end(StopReason.SAMPLER_ERROR, gen.error or gen.finish_reason)
            return
        ids = list(gen.token_ids)
        stopped = bool(ids) and ids[-1] == self.chat.eos_id
        text = self.chat.decode(ids[:-1] if stopped else ids)
        if self._sample_again(live, stopped, text, len(ids)):
            return
        live.seq.append(Role.ACT, ids, self.chat.decode(ids), gen.logprobs)
        if self.config.check_drift and self.chat.canonical(ids) != list(ids):
            live.noncanonical += 1
        live.sampled += len(ids)
        live.replies += 1
        live.step += 1
        live.reply, live.reply_stopped = Message("assistant", text), stopped
        parsed = parse_tool_calls(text)
        if parsed.errors:
            first = parsed.errors[0]
            reason = StopReason.MALFORMED_CALL if stopped else StopReason.TRUNCATED
            live.end(reason, f"{first.code}: {first.message}")
        elif parsed.calls:
            live.pending, live.answered = list(parsed.calls), []
            if self.config.mode is Mode.REAL:
                self._execute_all(live)
            else:
                self._prepare_world(live)
        elif not stopped:
            live.end(StopReason.TRUNCATED, "reply cut by max_new_tokens_act without a tool call")
        else:
            live.answers.append(parsed.content)
            if self.config.user is not None and AGENT_STOP in parsed.content:
                live.end(StopReason.DONE, "the agent ended the conversation")
            elif self.config.user is not None:
                live.to_user = True  # the reply stays pending until the user's message
            elif live.turn + 1 < len(live.task.user_turns):
                live.turn += 1
                live.replies = 0
                _start_turn(live.env, live.turn)
                self._extend(live, [Message("user", self.turns.turn_text(live))], Role.USER)
            else:
                live.end(StopReason.DONE)

    def replay(self, live: Live, replay: Replay) -> None:
        """Take ``replay`` as the episode's first reply: its sampled ids and log-probs, as if
        the sampler had just returned them (token-in/token-out: nothing is re-tokenised)."""
        reply = replay.reply
        if reply.role is not Role.ACT or reply.logprobs is None:
            raise ValueError("a replayed reply must be a sampled act segment (ids and log-probs)")
        if not live.waiting_act or live.step > 0:
            raise ValueError(
                f"task {live.task.id}: a reply can only be replayed as the agent's first, "
                "before any user or tool message (a simulated user speaks first)"
            )
        if tuple(live.seq.ids) != replay.prompt_ids:
            raise ValueError(
                f"task {live.task.id}: the replayed reply was sampled after a different prompt "
                f"({len(replay.prompt_ids)} vs {len(live.seq.ids)} tokens): replay only within "
                "the same task, tools and worked examples"
            )
        ids = reply.token_ids
        finish = "stop" if ids and ids[-1] == self.chat.eos_id else "length"
        self.on_act(live, Generation(ids, reply.logprobs, finish))

    def _real(self, live: Live, call: ToolCall) -> ToolResult | None:
        """The real environment's answer to ``call`` (None without one). A broken environment
        ends the episode; the fault, as an error result, is recorded with the call (the agent
        never reads it: the episode is over)."""
        if live.env is None:
            return None
        try:
            return live.env.execute(call)
        except EnvironmentFault as fault:
            live.end(fault.stop, str(fault))
            return ToolResult(error=ToolError(fault.stop.value.upper(), str(fault), call.raw))

    def _execute_all(self, live: Live) -> None:
        assert live.env is not None
        for call in live.pending:
            result = self._real(live, call)
            assert result is not None
            live.calls.append(CallRecord(live.turn, live.step, call, "real", real=result))
            if live.stop is not None:  # the environment broke: there is nothing to commit
                return
            live.answered.append((call, result))
        self._commit(live, Role.REAL)

    def _prepare_world(self, live: Live) -> None:
        assert live.reply is not None
        if self.config.check_calls:
            self._answer_refused(live)
            if live.stop is not None:  # the shadow environment broke
                return
            if len(live.answered) == len(live.pending):
                self._commit(live, Role.TOOL)
                return
        call = live.pending[len(live.answered)]
        history = live.messages[live.history_start :]
        messages = rehearse_messages(live.ctx, history, live.reply.content, call, live.answered)
        live.world_prompt = self.world_chat.prompt_ids(messages)
        cfg = self.config
        if len(live.world_prompt) + cfg.max_new_tokens_rehearse > cfg.context_limit:
            live.end(
                StopReason.CONTEXT_LIMIT, f"rehearse prompt of {len(live.world_prompt)} tokens"
            )
        elif cfg.mode is Mode.REHEARSAL and live.sampled >= cfg.max_episode_tokens:
            live.end(StopReason.TOKEN_LIMIT, f"{live.sampled} tokens sampled")

    def _answer_refused(self, live: Live) -> None:
        """Answer the pending calls the schema check refuses, in order, up to the next one it
        passes: the check's error is what the agent sees, and the world role is not asked."""
        schemas = parameter_schemas(live.ctx.tools)  # the tools offered now (BFCL adds some)
        while len(live.answered) < len(live.pending):
            call = live.pending[len(live.answered)]
            refused = check_call(call, schemas)
            if refused is None:
                return
            checked = ToolResult(error=refused)
            real = self._real(live, call)
            live.calls.append(
                CallRecord(live.turn, live.step, call, "checked", real=real, checked=checked)
            )
            if live.stop is not None:
                return
            live.answered.append((call, checked))

    def on_world(self, live: Live, gen: Generation) -> None:
        """Record one rehearsal (or simulation) and move to the next call or the next act."""
        if gen.finish_reason in ("abort", "error"):
            live.end(StopReason.SAMPLER_ERROR, gen.error or gen.finish_reason)
            return
        rehearsing = self.config.mode is Mode.REHEARSAL
        call = live.pending[len(live.answered)]
        text = self.world_chat.decode(gen.token_ids)
        if rehearsing:
            segment = Segment(Role.REHEARSE, tuple(gen.token_ids), text, tuple(gen.logprobs))
            grounded = live.ctx.grounded and any(live.task.reference_calls)
            stated = live.ctx.states_world
            live.rehearsals.append(
                Rehearsal(len(live.calls), tuple(live.world_prompt), segment, grounded, stated)
            )
            live.sampled += len(gen.token_ids)
        parsed = parse_rehearsal(text)
        real = self._real(live, call)
        shown = "rehearsed" if rehearsing else "simulated"
        answer = {shown: parsed.result}  # the CallRecord field named like what the agent saw
        live.calls.append(CallRecord(live.turn, live.step, call, shown, real=real, **answer))
        if live.stop is not None:  # the shadow environment broke
            return
        if parsed.result is None:
            assert parsed.error is not None
            who = "rehearsal" if rehearsing else "simulator"
            live.end(
                StopReason.UNPARSEABLE_REHEARSAL,
                f"{who} {parsed.error.code}: {parsed.error.message}",
            )
            return
        error = parsed.result.error
        ends = rehearsing and self.config.end_on_invalid_rehearsal
        if ends and error is not None and error.code in INVALID_CALL_CODES:
            live.end(StopReason.INVALID_REHEARSAL, f"{error.code}: {error.message}")
            return
        live.answered.append((call, parsed.result))
        if len(live.answered) == len(live.pending):
            self._commit(live, Role.TOOL)
        else:
            self._prepare_world(live)

    def _commit(self, live: Live, role: Role) -> None:
        """Append the results of the whole reply as tool messages."""
        results = [tool_message(result) for _, result in live.answered]
        live.pending, live.answered = [], []
        if not self.turns.defer_to_user(live, results, role):
            self._extend(live, results, role)

    def _extend(self, live: Live, new: list[Message], role: Role) -> None:
        """Tokenise only the external suffix after the reply; check it against a re-render."""
        assert live.reply is not None
        suffix = self.chat.suffix(live.messages, live.reply, new, live.reply_stopped)
        live.seq.append(role, self.chat.encode(suffix), suffix)
        live.messages += [live.reply, *new]
        live.reply = None
        if self.config.check_drift and self.chat.drifted(live.seq.segments, live.messages):
            live.drift += 1
        self._check_act_limits(live)

    def _check_act_limits(self, live: Live) -> None:
        cfg = self.config
        if self.turns.conversation_over(live):
            return
        if live.replies >= cfg.max_turns:
            live.end(StopReason.TURN_LIMIT, f"{live.replies} replies in user turn {live.turn}")
        elif live.sampled >= cfg.max_episode_tokens:
            live.end(StopReason.TOKEN_LIMIT, f"{live.sampled} tokens sampled")
        elif len(live.seq.ids) + cfg.max_new_tokens_act > cfg.context_limit:
            live.end(StopReason.CONTEXT_LIMIT, f"act prompt of {len(live.seq.ids)} tokens")


def _start_turn(env: Environment | None, turn: int) -> None:
    # BFCL's miss_func tasks reveal a tool from a later turn on (Environment.start_turn).
    if env is not None:
        env.start_turn(turn)


def _episode(live: Live, mode: Mode, extra: dict[str, Any]) -> Episode:
    return Episode(
        id=live.id,
        task_id=live.task.id,
        suite=live.task.suite,
        mode=mode,
        group_id=live.group_id,
        segments=live.seq.segments,
        rehearsals=tuple(live.rehearsals),
        calls=tuple(live.calls),
        stop_reason=live.stop or StopReason.DONE,
        stop_detail=live.detail,
        final_answers=tuple(live.answers),
        drift=live.drift,
        meta={
            MetaKey.SAMPLED_TOKENS: live.sampled,
            MetaKey.USER_TURNS_REACHED: live.turn + 1,
            MetaKey.NONCANONICAL: live.noncanonical,
            **({MetaKey.EMPTY_RETRIES: live.empty_retries} if live.empty_retries else {}),
            **({MetaKey.USER_MESSAGES: list(live.user_texts)} if live.user_texts else {}),
            **extra,
        },
    )


def rollout(
    tasks: Sequence[Task],
    suite: Suite,
    sampler: Sampler,
    tokenizer: Any,
    config: RolloutConfig,
    group_size: int = 1,
    *,
    example_pool: Sequence[Task] | None = None,
    run_id: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    first_replies: Sequence[Replay | None] | None = None,
) -> list[Episode]:
    """Roll out every task ``group_size`` times (one group id per task) as one batch.

    ``example_pool`` is where worked examples come from (default: the suite's train split;
    a task never gets itself as an example). ``run_id`` prefixes episode and group ids.
    ``progress(ended, total)`` is called when the count of ended episodes changes and at the end.
    ``first_replies`` (one per episode, None for a sampled one) replays a reply sampled
    elsewhere as an episode's first (``_Runner.replay``).
    """
    if group_size < 1:
        raise ValueError(f"group_size={group_size}: use 1 or more episodes per task")
    if any(not t.user_turns for t in tasks):
        raise ValueError("every task needs at least one user turn")
    if example_pool is None:
        example_pool = environments.example_pool(suite) if config.n_examples > 0 else []
    prefix = run_id or uuid.uuid4().hex[:8]
    runner = _Runner(sampler, tokenizer, config, suite)
    lives: list[Live] = []
    order = [(i, k, task) for i, task in enumerate(tasks) for k in range(group_size)]
    opened = open_envs(suite, [task for _, _, task in order]) if runner.needs_env else None
    unused = list(opened or [])  # opened side by side, each handed to its episode in order
    try:
        for i, k, task in order:
            env = unused.pop(0) if opened is not None else None
            lives.append(
                runner.start(task, f"{prefix}-{i}-{k}", f"{prefix}-{i}", example_pool, env)
            )
        if first_replies is not None:
            if len(first_replies) != len(lives):
                raise ValueError(f"{len(first_replies)} first replies for {len(lives)} episodes")
            for live, replay in zip(lives, first_replies, strict=True):
                if replay is not None:
                    runner.replay(live, replay)
        runner.run(lives, progress)
    finally:
        # Episodes still running when something raised, or that ended without ``end``, and
        # environments opened for episodes that never started.
        for live in lives:
            close_env(live.env)
        for env in unused:
            close_env(env)
    # The basis the suite scores by goes with every episode (docs/tasks.md, "Scoring bases").
    extra = {MetaKey.SCORE_BASIS: suite.basis} if isinstance(suite, ScoringBasis) else {}
    return [_episode(live, config.mode, extra) for live in lives]


EMPTY_RETRIES = 3  # an empty reply sampled again, at most this often (VitaBench's runner)
START_WORKERS = 8  # environments opened at once for a batch (each mostly waits on a process)


def open_envs(suite: Suite, tasks: Sequence[Task]) -> list[Environment] | None:
    """One environment per task, opened side by side when the suite's environments are slow
    to open (``Suite.slow_start``: an MCP server process per episode); None for other suites,
    whose episodes open their own. If one fails to open, those opened are closed and the error
    is raised."""
    if not getattr(suite, "slow_start", False) or not tasks:
        return None
    with ThreadPoolExecutor(min(START_WORKERS, len(tasks))) as pool:
        futures = [pool.submit(suite.make_env, task) for task in tasks]
    opened = [f.result() for f in futures if f.exception() is None]
    failed = [f.exception() for f in futures if f.exception() is not None]
    if failed:
        for env in opened:
            close_env(env)
        raise failed[0]  # type: ignore[misc]
    return opened


def score_inputs(episode: Episode, n_turns: int) -> tuple[list[list[ToolCall]], list[str]]:
    """What ``Suite.score`` takes: the committed calls per user turn and the final answers,
    padded to ``n_turns`` (turns the episode never reached have no calls and an empty answer)."""
    calls: list[list[ToolCall]] = [[] for _ in range(n_turns)]
    for record in episode.calls:
        if record.turn < n_turns:
            calls[record.turn].append(record.call)
    answers = list(episode.final_answers[:n_turns])
    answers += [""] * (n_turns - len(answers))
    return calls, answers


def rollout_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Flat scalar metrics of a batch: stop reasons, drift, tokens, calls, parse rates."""
    n = max(len(episodes), 1)
    metrics: dict[str, float] = {
        "rollout/episodes": float(len(episodes)),
        "rollout/drift": float(sum(e.drift for e in episodes)),
        "rollout/noncanonical": float(sum(e.meta.get(MetaKey.NONCANONICAL, 0) for e in episodes)),
        "rollout/sampled_tokens_mean": sum(e.meta.get(MetaKey.SAMPLED_TOKENS, 0) for e in episodes)
        / n,
        "rollout/calls_mean": sum(len(e.calls) for e in episodes) / n,
        "rollout/rehearsals": float(sum(len(e.rehearsals) for e in episodes)),
    }
    for reason in StopReason:
        share = sum(e.stop_reason is reason for e in episodes) / n
        metrics[f"rollout/stop/{reason.value}"] = share
    both = [c for e in episodes for c in e.calls if c.rehearsed is not None and c.real is not None]
    metrics["rollout/rehearsed_real_pairs"] = float(len(both))
    return metrics
