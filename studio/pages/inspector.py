"""Trajectory inspector: pick run / step / task / episode and read it turn by turn.

An episode's address is (run, episode id): ids repeat across runs (every run counts from its
own step 0), so each lookup, link and deep link here names the run, and an id asked without a
run that several runs hold gets a message naming them rather than one of them picked silently.

The chat view shows the user's request as a user bubble and every tool call as a labelled block
(tool, arguments) with its answers nested under it, each with its status: the rehearsed response
(what the policy imagined the tool returned) and the real response (what the shadow environment
returned), the call titled with their fidelity. Chat-template tokens are left out of the bubbles
(the token view keeps them). The token view shows every token of the agent context and of each
rehearsal, coloured by role (act and rehearse tokens are trained, the rest are not); hovering a
token gives its id, log-prob and the advantage of its role.
"""

from __future__ import annotations

import functools
import html
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import gradio as gr
import pandas as pd

from envace_engine.chat_text import clean_text
from envace_engine.models import SMOLLM2, TINY, cache_dir
from envace_engine.types import StopReason
from storage.search import ROLES as SEARCH_ROLES
from storage.search import SearchQuery, snippet
from studio.context import Studio
from studio.lazy import PageLoads
from studio.pages.runs import run_choices

PAGE_SIZE = 50
LIST_COLUMNS = [
    "episode_id",
    "step",
    "task_id",
    "mode",
    "reward",
    "stop_reason",
    "n_calls",
    "mean_fidelity",
]
TOKEN_COLOURS = {
    "act (trained)": "#4caf50",
    "rehearse (trained)": "#ff9800",
    "act (sampled, not trained)": "#c8e6c9",
    "rehearse (sampled, not trained)": "#ffe0b2",
    "not trained": "#d0d0d0",
}
TOKEN_LIMIT = 6000  # tokens drawn in the token view: a long episode would stall the browser
# the filter offers every reason the engine can end an episode with ("": any)
STOP_REASONS = ["", *(reason.value for reason in StopReason)]
SEARCH_COLUMNS = ["episode_id", "step", "task_id", "reward", "stop_reason", "role", "snippet"]
SEARCH_LIMIT = 100


# What a chat template adds around a turn (ChatML and Llama 3 headers, end-of-turn and other
# special tokens, call tags): the bubbles show the words, the token view the tokens.
def _present(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _pretty(text: str | None) -> str:
    """Indented JSON when ``text`` is JSON, else the text itself."""
    if text is None or not _present(text):
        return ""
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        return str(text)


# -- addresses: (run, episode[, call]) -----------------------------------------------------------


def address(tab: str, run_id: str, episode_id: str = "", call_id: str = "") -> str:
    """A deep link's query to ``tab`` at (run, episode or call), values URL-quoted."""
    parts = [f"tab={tab}", f"run={quote(str(run_id), safe='')}"]
    if call_id:
        parts.append(f"call={quote(str(call_id), safe='/')}")
    elif episode_id:
        parts.append(f"episode={quote(str(episode_id), safe='')}")
    return "?" + "&".join(parts)


def runs_holding(ctx: Studio, episode_id: str) -> list[str]:
    """The runs that hold an episode id (ids repeat across runs)."""
    try:
        return [str(ctx.store.episode(episode_id).episode["run_id"])]
    except KeyError:
        return []
    except ValueError as err:  # storage's AmbiguousEpisodeError names them
        return [str(r) for r in getattr(err, "runs", ())]


def _run_links(runs: Sequence[str], episode_id: str, tab: str) -> str:
    return ", ".join(f"[`{r}`]({address(tab, r, episode_id)})" for r in runs)


def lookup(
    ctx: Studio, episode_id: str, run_id: str | None, tab: str = "inspector"
) -> tuple[Any, str]:
    """(the episode of ``run_id``, "") or (None, a Markdown line saying why there is none): no
    such episode in that run (and the runs that do hold it, linked to ``tab``), or no run named
    while several hold the id."""
    try:
        return ctx.store.episode(episode_id, run_id or None), ""
    except KeyError:
        if not run_id:
            return None, f"**No episode `{episode_id}`** in any run: check the id."
        elsewhere = [r for r in runs_holding(ctx, episode_id) if r != run_id]
        more = f" It is in {_run_links(elsewhere, episode_id, tab)}." if elsewhere else ""
        return None, f"**No episode `{episode_id}` in run `{run_id}`.**{more}"
    except ValueError as err:  # AmbiguousEpisodeError: several runs, none named
        runs = [str(r) for r in getattr(err, "runs", ())]
        if not runs:
            return None, f"**Episode `{episode_id}`:** {err}"
        return None, (
            f"**Episode `{episode_id}` is in {len(runs)} runs** "
            f"({_run_links(runs, episode_id, tab)}): pick the run (`&run=` in a link)."
        )


def clamp_page(page: Any, total: int, size: int = PAGE_SIZE) -> tuple[int, int, str]:
    """(page to show, number of pages, a note when the asked page does not exist): out-of-range
    or unreadable input shows the nearest page and says so instead of failing."""
    pages = max(1, -(-total // size))
    try:
        asked = int(page) if _present(page) and page != "" else 1
    except (TypeError, ValueError, OverflowError):
        return 1, pages, f" · **{page!r} is not a page number**: showing page 1"
    shown = min(max(asked, 1), pages)
    if shown == asked:
        return shown, pages, ""
    return shown, pages, f" · **there is no page {asked}** (pages 1 to {pages}): showing {shown}"


# -- the chat view -------------------------------------------------------------------------------


def response_text(call: dict[str, Any], source: str) -> str | None:
    """One answer of a call (``rehearsed``/``real``/``simulated``/``checked``) as display text,
    or None."""
    status = call.get(f"{source}_status")  # only rehearsed and real answers have a column
    error = call.get(f"{source}_error")
    if _present(error):
        message = call.get(f"{source}_message")
        return f"error {error}: {message}" if _present(message) else f"error {error}"
    value = call.get(f"{source}_json")
    if _present(value):
        return f"```json\n{_pretty(value)}\n```"
    return "(no value)" if _present(status) else None


def _cell(value: Any) -> str:
    """One argument value as a Markdown table cell: JSON, so strings read as strings."""
    text = json.dumps(value, ensure_ascii=False).replace("|", "\\|")
    return f"`{text}`"


def arguments_markdown(arguments_json: str | None) -> str:
    """A call's arguments, labelled: a name/value table when every value is a scalar, else
    indented JSON (nested values read better as JSON than as a flattened table)."""
    if not _present(arguments_json) or not str(arguments_json).strip():
        return "**arguments:** none"
    try:
        args = json.loads(str(arguments_json))
    except ValueError:
        return f"**arguments** (not JSON)\n\n```\n{arguments_json}\n```"
    if isinstance(args, dict) and not args:
        return "**arguments:** none"
    if isinstance(args, dict) and all(not isinstance(v, (dict, list)) for v in args.values()):
        rows = "".join(f"| `{k}` | {_cell(v)} |\n" for k, v in args.items())
        return f"| argument | value |\n|---|---|\n{rows}"
    return f"**arguments**\n\n```json\n{json.dumps(args, indent=2, ensure_ascii=False)}\n```"


def _answer_block(call: dict[str, Any], source: str, call_id: str) -> dict[str, Any] | None:
    """One answer of a call as a block nested under it, its status on the first line."""
    text = response_text(call, source)
    if text is None:
        return None
    status = call.get(f"{source}_status")
    if not _present(status):  # checked and simulated answers have no status column
        status = "error" if _present(call.get(f"{source}_error")) else "ok"
    shown = " · shown to the agent" if call.get("shown") == source else ""
    titles = {
        "checked": "schema check (the world role was not asked)",  # RolloutConfig.check_calls
    }
    return {
        "role": "assistant",
        "content": f"status **{status}**{shown}\n\n{text}",
        "metadata": {"title": titles.get(source, f"{source} response"), "parent_id": call_id},
    }


def _call_blocks(call: dict[str, Any], index: int, raw: str | None) -> list[dict[str, Any]]:
    """A tool-call block (tool, labelled arguments) with its answers nested under it.

    ``raw`` is the world role's own output for this call: shown when it did not parse, so an
    unparseable rehearsal is visible instead of silently missing.
    """
    call_id = f"call-{index}"
    fidelity = call.get("fidelity")
    score = f" — fidelity {fidelity:.3f}" if _present(fidelity) else ""
    # No "status": gradio opens such blocks, so the rehearsed/real pair is visible at once.
    blocks = [
        {
            "role": "assistant",
            "content": f"**tool** `{call.get('tool')}`\n\n"
            + arguments_markdown(call.get("arguments_json")),
            "metadata": {
                "title": f"tool call {index}: {call.get('tool')}",
                "log": f"agent saw the {call.get('shown')} response{score}",
                "id": call_id,
            },
        }
    ]
    for source in ("rehearsed", "checked", "real", "simulated"):
        block = _answer_block(call, source, call_id)
        if block is None and source == "rehearsed" and raw is not None:
            block = {
                "role": "assistant",
                "content": f"status **unparseable** (the world role's raw output)\n\n"
                f"```\n{raw}\n```",
                "metadata": {"title": "rehearsed response (unparseable)", "parent_id": call_id},
            }
        if block is not None:
            blocks.append(block)
    return blocks


def _prompt_messages(text: str, simulated_user: bool) -> list[dict[str, Any]]:
    """The prompt segment as chat messages.

    Its text is the opening's last message: the first user message (the task's context text,
    a blank line, then the request: ``rollout.prompts.first_user_text``), whose context is
    collapsed and whose request is a user bubble; or, when a simulated user speaks first, the
    agent's fixed greeting.
    """
    text = clean_text(text)
    if simulated_user:
        return [{"role": "assistant", "content": text, "metadata": {"title": "agent greeting"}}]
    context, _, request = text.rpartition("\n\n")
    out: list[dict[str, Any]] = []
    if context.strip():
        out.append(
            {
                "role": "user",
                "content": context,
                "metadata": {"title": "task context (world state, memory)", "status": "done"},
            }
        )
    out.append({"role": "user", "content": request or text})
    return out


def chat_messages(view: Any) -> list[dict[str, Any]]:
    """The episode as chat messages: the request, user turns, agent replies, nested tool calls.

    Tool calls are attached after the agent reply that made them: the rollout records
    ``agent_step`` as the number of agent replies so far, so the k-th reply (0-based) made the
    calls with ``agent_step == k + 1``. Tool/real segments are left out when the call blocks
    already show their content, and so are the call blocks a reply wrote (shown parsed).
    """
    segments = view.segments.to_dict("records")
    calls = view.calls.to_dict("records")
    raw = {int(r["call_index"]): r["text"] for r in view.rehearsals.to_dict("records")}
    by_step: dict[int, list[dict[str, Any]]] = {}
    for call in calls:
        by_step.setdefault(int(call["agent_step"]), []).append(call)
    simulated_user = any(seg["role"] == "simulated_user" for seg in segments)
    messages: list[dict[str, Any]] = []
    act_index = 0
    for seg in segments:
        role, text = seg["role"], seg["text"]
        if role == "prompt":
            messages += _prompt_messages(text, simulated_user)
        elif role == "user":
            messages.append({"role": "user", "content": clean_text(text)})
        elif role == "simulated_user":  # written by a user simulator (tau2), not the task
            messages.append(
                {
                    "role": "user",
                    "content": clean_text(text),
                    "metadata": {"title": "simulated user"},
                }
            )
        elif role == "act":
            act_index += 1
            made = by_step.get(act_index, [])
            words = clean_text(text, drop_calls=bool(made))
            if words or not made:
                messages.append({"role": "assistant", "content": words or "(empty reply)"})
            for call in made:
                index = int(call["call_index"])
                messages += _call_blocks(call, index, raw.get(index))
        elif not calls:  # tool messages of an episode without call records
            messages.append(
                {
                    "role": "assistant",
                    "content": clean_text(text),
                    "metadata": {"title": f"tool ({role})", "status": "done"},
                }
            )
    return messages


# -- the token view ------------------------------------------------------------------------------

KIND_CLASS = {
    "act (trained)": "at",
    "rehearse (trained)": "rt",
    "act (sampled, not trained)": "as",
    "rehearse (sampled, not trained)": "rs",
    "not trained": "nt",
}
TOKEN_CSS = "".join(
    f".envtok .{cls} {{ background: {TOKEN_COLOURS[kind]}; }}" for kind, cls in KIND_CLASS.items()
) + (
    ".envtok { font-family: ui-monospace, monospace; font-size: 12px; }"
    ".envtok-body { white-space: pre-wrap; overflow-wrap: anywhere; max-height: 620px;"
    " overflow-y: auto; line-height: 1.9; }"
    ".envtok .tok { border-radius: 3px; padding: 1px 0; cursor: help; color: #111;"
    " box-shadow: inset -1px 0 0 rgba(255, 255, 255, 0.9); }"  # where one token ends
    ".envtok .tok:hover { outline: 2px solid #333; }"
    ".envtok-legend .tok { padding: 1px 6px; margin-right: 6px; cursor: default; }"
    ".envtok-head { color: #666; margin: 6px 0 2px; }"
    ".envtok-note { color: #666; margin: 4px 0; }"
)
Decoder = Callable[[Sequence[int]], list[str]]


def token_kinds(view: Any) -> dict[str, str]:
    """The colour label of each sampled role's tokens: "trained" when the episode has an
    advantage for that role (a training step used them); evaluations, and roles a mode freezes
    (the world role of ``act-only`` and ``real-grpo``), show them as sampled, not trained."""
    trained = set(view.advantages or {})
    return {
        role: f"{role} (trained)" if role in trained else f"{role} (sampled, not trained)"
        for role in ("act", "rehearse")
    }


def token_runs(view: Any) -> list[tuple[str | None, str, list[int], list[float] | None]]:
    """(heading or None, role, token ids, log-probs) per run of tokens, in display order: the
    agent context's segments, then each rehearsal's generated tokens under a heading."""
    out: list[tuple[str | None, str, list[int], list[float] | None]] = []

    def listed(values: Any) -> list[Any] | None:
        return None if values is None or not len(values) else list(values)

    for seg in view.segments.to_dict("records"):
        out.append(
            (None, str(seg["role"]), listed(seg["token_ids"]) or [], listed(seg["logprobs"]))
        )
    for reh in view.rehearsals.to_dict("records"):
        head = (
            f"── rehearsal of call {reh['call_index']} "
            f"({reh['n_prompt_tokens']} prompt tokens, not trained) ──"
        )
        out.append((head, "rehearse", listed(reh["token_ids"]) or [], listed(reh["logprobs"])))
    return out


def token_title(
    token_id: int, piece: str | None, role: str, kind: str, logprob: float | None, adv: Any
) -> str:
    """The hover text of one token: id and text, role, log-prob, the role's advantage."""
    lines = [f"token {token_id}" + (f" {json.dumps(piece, ensure_ascii=False)}" if piece else "")]
    lines.append(f"role {role}: {kind}")
    if logprob is not None and _present(logprob):
        lines.append(f"log-prob {logprob:.3f} (p = {math.exp(logprob):.3f})")
    else:
        lines.append("log-prob: none (context the model read, not sampled)")
    if role in ("act", "rehearse"):
        lines.append(
            f"advantage ({role}) {float(adv):+.3f}"
            if _present(adv)
            else f"advantage ({role}): none (no training step used it)"
        )
    return "\n".join(lines)


def _token_span(token_id: int, piece: str | None, role: str, kind: str, title: str) -> str:
    """One token's element: its text (its id when there is no tokenizer), hover text."""
    text = piece if piece else f"⟨{token_id}⟩"
    return (
        f'<span class="tok {KIND_CLASS[kind]}" data-role="{html.escape(role)}" '
        f'title="{html.escape(title)}">{html.escape(text)}</span>'
    )


def token_html(
    view: Any, decode: Decoder | None = None, model: str = "", stand_in: str = ""
) -> str:
    """The token view: one element per token, coloured by role, whose title (hover) gives its
    id and text, log-prob and the advantage of its role. Without ``decode`` (the run's tokenizer
    is not on this machine) each token shows its id; ``stand_in`` names the tokenizer that
    decoded them when it is not the run's own (the note says so)."""
    kinds = token_kinds(view)
    advantages = view.advantages or {}
    drawn, present, parts = 0, [], []
    runs = token_runs(view)
    for head, role, ids, logprobs in runs:
        if head is not None:
            parts.append(f'<div class="envtok-head">{html.escape(head)}</div>')
        kind = kinds.get(role, "not trained")
        room = max(0, TOKEN_LIMIT - drawn)
        shown_ids = ids[:room]
        pieces = decode(shown_ids) if decode is not None and shown_ids else [None] * len(shown_ids)
        if shown_ids and kind not in present:
            present.append(kind)
        for i, (token_id, piece) in enumerate(zip(shown_ids, pieces, strict=True)):
            lp = logprobs[i] if logprobs is not None and i < len(logprobs) else None
            title = token_title(token_id, piece, role, kind, lp, advantages.get(role))
            parts.append(_token_span(token_id, piece, role, kind, title))
        drawn += len(shown_ids)
    total = sum(len(ids) for _, _, ids, _ in runs)
    if total > drawn:
        parts.append(f'<div class="envtok-note">… {total - drawn} more token(s) not drawn</div>')
    legend = "".join(f'<span class="tok {KIND_CLASS[k]}">{html.escape(k)}</span>' for k in present)
    note = "hover a token for its id, log-prob and its role's advantage"
    if decode is None and total:
        which = f" of <code>{html.escape(model)}</code>" if model else ""
        note += f"; the tokenizer{which} is not on this machine, so tokens show their ids"
    elif stand_in and total:
        note += (
            f"; ⚠️ decoded with <code>{html.escape(stand_in)}</code>'s tokenizer: the run's model "
            f"<code>{html.escape(model)}</code> is not on this machine (a checkpoint trained "
            "from it shares its tokenizer; the ids on hover are the stored ones)"
        )
    return (
        f'<style>{TOKEN_CSS}</style><div class="envtok"><div class="envtok-legend">{legend}</div>'
        f'<div class="envtok-note">{note}</div><div class="envtok-body">{"".join(parts)}</div>'
        "</div>"
    )


@functools.lru_cache(maxsize=4)
def _load_tokenizer(path: str) -> Any:
    """A ``tokenizers`` tokenizer from its JSON file, or None (the package is the engine's, not
    the studio's: a studio-only install has none)."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    try:
        return Tokenizer.from_file(path)
    except Exception:  # tokenizers raises plain Exception: a broken file shows ids instead
        return None


def tokenizer_file(ctx: Studio, run_id: str) -> tuple[Path | None, str]:
    """(the run's ``tokenizer.json`` if this machine has one, the run's model): the file is
    looked for in the run folder, its checkpoints, its model's folder, a built-in model's
    cache."""

    try:
        info = ctx.store.run(run_id)
    except (KeyError, ValueError, OSError):
        return None, ""
    model = info.manifest.model
    candidates = [info.path / "tokenizer.json"]
    candidates += sorted((info.path / "checkpoints").glob("step-*/tokenizer.json"), reverse=True)
    if model:
        candidates += [Path(model) / "tokenizer.json", ctx.root / model / "tokenizer.json"]
    if model in (SMOLLM2, TINY):  # tiny shares SmolLM2's tokenizer
        candidates.append(cache_dir() / SMOLLM2 / "tokenizer.json")
    return next((p for p in candidates if p.is_file()), None), model


def stand_in_tokenizer(ctx: Studio, run_id: str) -> tuple[Path | None, str]:
    """(a built-in model's ``tokenizer.json``, its name) for a run whose model is a checkpoint
    this machine lacks but whose lineage names that built-in model: the run's own ``config``
    (an eval's or sweep's model) or a study's ``base_model`` (every model this project trains
    starts from one). (None, "") when nothing says which."""

    try:
        manifests = ctx.store.manifests()
    except (KeyError, ValueError, OSError):
        return None, ""
    named = {str(m.config.get("base_model", "")) for m in manifests.values() if m.kind == "study"}
    named.discard("")
    if run_id not in manifests or named - {SMOLLM2}:
        return None, ""  # a study from another base model: no stand-in is safe
    path = cache_dir() / SMOLLM2 / "tokenizer.json"
    return (path, SMOLLM2) if named and path.is_file() else (None, "")


def token_decoder(ctx: Studio, run_id: str) -> tuple[Decoder | None, str, str]:
    """(token ids → texts with the run's tokenizer, or a stand-in's (``stand_in_tokenizer``),
    or None when this machine has neither; the run's model; the stand-in's name or "")."""
    path, model = tokenizer_file(ctx, run_id)
    stand_in = ""
    if path is None:
        path, stand_in = stand_in_tokenizer(ctx, run_id)
    tok = _load_tokenizer(str(path)) if path is not None else None
    if tok is None:
        return None, model, ""

    def decode(ids: Sequence[int]) -> list[str]:
        return tok.decode_batch([[int(i)] for i in ids], skip_special_tokens=False)

    return decode, model, stand_in


# -- the page's handlers -------------------------------------------------------------------------


def summary(view: Any) -> str:
    """Reward, stop reason, advantages per role and token counts, as Markdown (3 decimals)."""
    ep = view.episode

    def num(key: str, sign: str = "+") -> str:
        value = ep.get(key)
        return f"{value:{sign}.3f}" if _present(value) else "—"

    reward = ep.get("reward")
    return (
        f"**{ep['episode_id']}** · run `{ep['run_id']}` · step {ep['step']} · task "
        f"`{ep['task_id']}` ({ep['suite']}, {ep['mode']} mode)\n\n"
        f"| reward | stop reason | mean fidelity | advantage act | advantage rehearse | "
        f"act tokens | rehearse tokens | drift |\n|---|---|---|---|---|---|---|---|\n"
        f"| {f'{reward:.3f}' if _present(reward) else 'unscored'} | {ep['stop_reason']}"
        f"{': ' + ep['stop_detail'] if ep.get('stop_detail') else ''} | {num('mean_fidelity', '')}"
        f" | {num('adv_act')} | {num('adv_rehearse')} | {ep.get('n_act_tokens', 0)} | "
        f"{ep.get('n_rehearse_tokens', 0)} | {ep.get('drift', 0)} |"
    )


def episode_list(
    ctx: Studio, run_id: str | None, step: str, task: str, stop_reason: str | None, page: Any = 1
) -> tuple[pd.DataFrame, str, int]:
    """One page of episodes matching the filters (never the whole table), a pager line and the
    page shown (an out-of-range page shows the nearest one, and the pager says so)."""
    columns = LIST_COLUMNS if run_id else ["run_id", *LIST_COLUMNS]  # all runs: say whose
    step = str(step or "").strip()
    if step and not step.isdigit():
        return (
            pd.DataFrame(columns=columns),
            f"**step** must be a whole number or empty for all steps (got {step!r})",
            1,
        )
    filters = {
        "run_id": run_id or None,
        "step": int(step) if step else None,
        "task": (task or "").strip() or None,
        "stop_reason": stop_reason or None,
    }
    total = ctx.store.count_episodes(**filters)
    shown, pages, note = clamp_page(page, total)
    df = ctx.store.episodes(limit=PAGE_SIZE, offset=(shown - 1) * PAGE_SIZE, **filters)
    df = df.reindex(columns=columns)
    for col in ("reward", "mean_fidelity"):
        df[col] = df[col].astype(float).round(3)
    return df, f"{total} episode(s) · page {shown} of {pages}{note}", shown


def render(ctx: Studio, view: Any) -> tuple[list[dict[str, Any]], str, str, str]:
    """(chat messages, summary, token view, links) of one episode."""
    run_id, episode_id = str(view.episode["run_id"]), str(view.episode["episode_id"])
    decode, model, stand_in = token_decoder(ctx, run_id)
    link = (
        f"Deep link: `{address('inspector', run_id, episode_id)}` · "
        f"[live rehearse its calls]({address('rehearse', run_id, episode_id)})"
        f" · [label it]({address('annotate', run_id, episode_id)})"
    )
    return chat_messages(view), summary(view), token_html(view, decode, model, stand_in), link


def open_episode(
    ctx: Studio, episode_id: str, run_id: str | None = None
) -> tuple[list[dict[str, Any]], str, str, str]:
    """(chat messages, summary, token view, links) for episode ``episode_id`` of ``run_id``;
    without a run the id must be in one run only, else the summary names the runs."""
    episode_id = (episode_id or "").strip()
    if not episode_id:
        return [], "Pick an episode from the list or paste its id.", "", ""
    view, why = lookup(ctx, episode_id, run_id)
    if view is None:
        return [], why, "", ""
    return render(ctx, view)


def next_failure(ctx: Studio, run_id: str | None, episode_id: str) -> str:
    """The id of the next failed episode of the run after ``episode_id`` (or the first), else
    unchanged."""
    if not run_id:
        return episode_id
    found = ctx.store.next_failure(run_id, (episode_id or "").strip() or None)
    return found or episode_id


def jump_to_failure(ctx: Studio, run_id: str | None, current: str) -> tuple[object, ...]:
    """(episode id, chat, summary, token view, links) of the run's next failed episode after
    ``current`` (from the first when ``current`` is not this run's); the links line says so
    when there is none."""
    current = (current or "").strip()
    if not run_id:
        return (current, [], "Pick a run first: *Next failure* walks one run's episodes.", "", "")
    found = ctx.store.next_failure(run_id, current or None)
    if found is None and current and lookup(ctx, current, run_id)[0] is None:
        found = ctx.store.next_failure(run_id, None)  # another run's id: start over
    if found is None:
        after = f" after `{current}`" if current else ""
        keep = gr.update()
        return (current, keep, keep, keep, f"**No failed episode{after} in run `{run_id}`.**")
    return (found, *open_episode(ctx, found, run_id))


def search(
    ctx: Studio,
    run_id: str | None,
    text: str,
    roles: list[str],
    stop: str,
    mismatch: bool,
    tool: str,
) -> tuple[Any, str]:
    """(results table, message) of a text search in the run with the page's filters."""

    try:
        if not run_id:
            raise ValueError("pick a run first")
        q = SearchQuery(
            run_id,
            text or "",
            roles=tuple(roles or ()),
            stop_reason=stop or None,
            status_mismatch=bool(mismatch),
            tool=(tool or "").strip() or None,
            limit=SEARCH_LIMIT,
        )
    except ValueError as err:
        return gr.update(visible=False), f"**Search:** {err}"
    hits = ctx.store.search.find(q)
    if hits.empty:
        return gr.update(visible=False), f"No match for “{q.text}” with these filters."
    hits["snippet"] = [snippet(t, q.text) for t in hits["text"]]
    hits["reward"] = hits["reward"].astype(float).round(3)
    table = hits.reindex(columns=SEARCH_COLUMNS)
    more = " (the first ones: narrow the filters)" if len(hits) == SEARCH_LIMIT else ""
    message = f"{len(hits)} match(es){more}; click one to open its episode."
    return gr.update(value=table, visible=True), message


def deep_link(ctx: Studio, params: dict[str, str]) -> tuple[object, ...]:
    """(episode id, run picker, list, pager, page, chat, summary, tokens, links) for
    ``?tab=inspector&run=RUN&episode=ID``. Without ``run`` the id must be in one run: when
    several hold it, the summary names them and no episode opens."""
    episode_id = (params.get("episode") or "").strip()
    run_id = (params.get("run") or "").strip() or None
    opened: tuple[Any, ...] = open_episode(ctx, "", None)
    if episode_id:
        view, why = lookup(ctx, episode_id, run_id)
        if view is not None:
            run_id = str(view.episode["run_id"])
            opened = render(ctx, view)
        else:
            opened = ([], why, "", "")
    choices = run_choices(ctx)  # runs may have appeared since the app was built
    listed = run_id or next(iter(choices), None)
    listing = episode_list(ctx, listed, "", "", "", 1)
    return (episode_id, gr.update(choices=choices, value=listed), *listing, *opened)


def build(ctx: Studio, tab: gr.Tab, loads: PageLoads) -> None:
    """Lay out the page and wire its events (read-only: no user needed).

    A deep link (``?tab=inspector&run=&episode=``) fills the page with the page load, beside the
    browser's switch to the tab (one round trip, not two in a row); otherwise nothing is
    queried until the tab is opened, and then the newest run fills the page.
    """
    with gr.Row():
        # value=None: an empty picker tells the tab handler the page has not been filled yet
        run = gr.Dropdown(
            run_choices(ctx), value=None, label="run", allow_custom_value=True, elem_id="insp-run"
        )
        step = gr.Textbox(label="step (empty = all)")
        task = gr.Textbox(label="task id")
        stop = gr.Dropdown(STOP_REASONS, value="", label="stop reason")
        # no minimum: gradio would answer 0 with an error pill; episode_list clamps and says so
        page = gr.Number(1, label="page", precision=0, elem_id="insp-page")
    with gr.Accordion("Search this run", open=True, elem_id="insp-search-box"), gr.Row():
        query = gr.Textbox(label="text", placeholder="a phrase", elem_id="insp-search", scale=3)
        roles = gr.CheckboxGroup(list(SEARCH_ROLES), value=list(SEARCH_ROLES), label="in")
        mismatch = gr.Checkbox(False, label="status mismatch", elem_id="insp-mismatch")
        tool = gr.Textbox(label="tool", elem_id="insp-tool")
        go = gr.Button("Search", elem_id="insp-search-go", scale=1)
    found = gr.Dataframe(
        pd.DataFrame(columns=SEARCH_COLUMNS),
        interactive=False,
        max_height=240,
        datatype=["str", "number", "str", "number", "str", "str", "html"],
        elem_id="insp-search-results",
        visible=False,
    )
    searched = gr.Markdown(elem_id="insp-search-message")
    pager = gr.Markdown(elem_id="insp-pager")
    table = gr.Dataframe(
        pd.DataFrame(columns=LIST_COLUMNS),
        interactive=False,
        max_height=240,
        elem_id="episode-list",
    )
    with gr.Row():
        episode = gr.Textbox(label="episode id (of the run above)", elem_id="insp-episode", scale=4)
        show = gr.Button("Open", scale=1, elem_id="insp-open")
        fail = gr.Button("Next failure", scale=1, elem_id="insp-next-failure")
    head = gr.Markdown(elem_id="insp-summary")
    link = gr.Markdown(elem_id="insp-link")
    with gr.Row():
        chat = gr.Chatbot(
            label="turn by turn", height=620, elem_id="insp-chat", scale=3, autoscroll=False
        )
        tokens = gr.HTML(
            label="tokens (hover one: its id, log-prob and advantage)",
            show_label=True,
            container=True,
            elem_id="insp-tokens",
            scale=2,
            min_width=320,
        )
    filters = [run, step, task, stop, page]
    listed = [table, pager, page]

    def first_page(
        run_id: str | None, step: str, task: str, stop: str | None, _page: Any
    ) -> tuple[pd.DataFrame, str, int]:
        return episode_list(ctx, run_id, step, task, stop, 1)

    for control in filters[:-1]:
        # gradio adds the event methods at runtime; its types do not declare them on the
        # FormComponent base that mypy joins these components to.
        # .input: a user's edit (a deep link's own update of the run must not list twice);
        # new filters list from their first page
        control.input(first_page, filters, listed)  # type: ignore[attr-defined]
    page.input(lambda *v: episode_list(ctx, *v), filters, listed)
    outputs = [chat, head, tokens, link]
    # the episode of the run picked above: ids repeat across runs
    show.click(lambda e, r: open_episode(ctx, e, r), [episode, run], outputs)
    episode.submit(lambda e, r: open_episode(ctx, e, r), [episode, run], outputs)

    def pick(evt: gr.SelectData, df: pd.DataFrame, run_id: str | None) -> tuple[object, ...]:
        row = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        picked = df.iloc[row]
        whose = str(picked["run_id"]) if "run_id" in df.columns else run_id  # the listed run's
        episode_id = str(picked["episode_id"])
        return (episode_id, *open_episode(ctx, episode_id, whose))

    table.select(pick, [table, run], [episode, *outputs])
    found.select(pick, [found, run], [episode, *outputs])
    ask = [run, query, roles, stop, mismatch, tool]
    go.click(lambda *v: search(ctx, *v), ask, [found, searched])
    query.submit(lambda *v: search(ctx, *v), ask, [found, searched])
    fail.click(lambda r, e: jump_to_failure(ctx, r, e), [run, episode], [episode, *outputs])

    targets = [episode, run, table, pager, page, *outputs]
    keep = tuple(gr.update() for _ in targets)

    def on_open(current_run: str | None, request: gr.Request) -> tuple[object, ...]:
        params = dict(request.query_params) if request else {}
        if current_run or params.get("tab") == "inspector":
            return keep  # already filled, or the page load's handler fills it
        return deep_link(ctx, {})

    def on_load(request: gr.Request) -> tuple[object, ...]:
        return deep_link(ctx, dict(request.query_params) if request else {})

    tab.select(on_open, [run], targets)
    loads.on("inspector", on_load, (), targets)
