"""Home: what the demo is, the study's words, what the studio holds, where to start, and the
project's docs rendered in the app (``?tab=home&doc=study.md``), so every "see docs/..." in the
studio is a link that works offline and on a Space."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gradio as gr

from envace_engine.models import SMOLLM2, registry
from studio.context import Studio
from studio.lazy import PageLoads, when_shown

if TYPE_CHECKING:
    from storage.layout import RunManifest

# The repository's docs/ (the Space's image copies the whole repository): absent from an
# installed wheel, where the reader says so.
DOCS = Path(__file__).resolve().parents[2] / "docs"
DOC_MENTION = re.compile(r"`?docs/([A-Za-z0-9_./-]+\.md)`?")
# The docs a first visitor is pointed to, in reading order (every other doc is in the menu too).
FIRST_DOCS = ("study.md", "method.md", "rehearsal.md", "studio.md")

GUIDE = """\
## Where to start
1. **Study** — the reproduction study's verdicts, its test-time table and every arm's curves.
2. **Runs & jobs** — launch a rollout, SFT, EnvACE training, the real-env baseline, an
   evaluation or a sweep; follow its progress and curves live.
3. **Trajectory inspector** — read an episode turn by turn: every tool call with the rehearsed
   response nested under it and the real one beside it; *Next failure* jumps to what went wrong.
4. **Rehearsed vs real** — where the internal world model disagrees with the real tools, by
   tool and by status.
5. **Annotate** — label rehearsals and episodes (keys 1–5); export the labels.
6. **Rehearsal budget** — success against rehearsal tokens per mode; save a budget per model.
7. **Live rehearse** — ask the model to rehearse a tool call and compare with the real tool.
"""

# The study's vocabulary, as docs/study.md, docs/rehearsal.md and docs/method.md define it.
GLOSSARY = """\
* **act role / world role** — one model plays both: as the *agent* it answers the user and
  calls tools; as the *world model* it rehearses, writing the response a tool call would get.
* **arm** — one training recipe of the study. Every arm starts from the same SFT checkpoint
  with equal steps, batches, task order and seeds: `envace` (rehearsed rollouts, both roles
  trained, role-wise GRPO), `act-only` (rehearsed rollouts, act role only: the world role is
  frozen), `real-grpo` (real tools, act role), `shared-baseline` (as `envace` with one GRPO
  baseline for both roles), `simulator` (a frozen copy of the SFT model answers the calls).
* **checkpoint** (table rows) — `base` (the model before SFT), `sft`, and each arm's last.
* **held-out** — validation tasks no arm trained on; every checkpoint is evaluated on them
  against the real tools.
* **rehearsal budget, N** — imagined episodes per task before the one committed against the
  real tools; N = 0 is plain execution.
* **parallel / sequential** — the N imagined episodes run at once and one memory is written
  over them, or one after another, each round reading the memory of the rounds before.
* **select** — no memory: the committed episode replays the first reply of the imagined episode
  that looks best to the agent (it reached an answer, fewer errors, higher confidence).
* **Δ vs N = 0** — a setting's success minus plain execution's on the same tasks, paired by
  task, with a 95 % bootstrap interval over tasks.
* **effect** — *helps* (interval above 0), *hurts* (below 0), *harmless* (above −5 points),
  else *inconclusive*.
* **verdict** — what came out for each of the study's claims (a)–(e), judged by a rule fixed
  before the run.
* **fidelity** — how closely a rehearsed tool response matches the real one for the same call,
  in tiers (exact, status agreement, keys, values, text similarity); not a reward.
* **exact** — the rehearsed and the real response are the same JSON.
* **status agree** — both succeeded, or both are errors.
* **real NLL** — mean negative log-likelihood per token of the *real* response under the model
  as world model: how surprised the world role is by the truth (lower is better).
* **real % / rehearsed %** — success against the real tools / inside the world the model
  rehearses for itself.
* **gap** — real % − rehearsed %: how far success in its own rehearsed world is from success
  against the real tools.
* **pair** — one tool call with both its rehearsed and its real response (*Rehearsed vs real*,
  *Annotate*).
"""

# How each arm runs, for the demo's header (docs/study.md, *Arms*).
ARMS = {
    "envace": ("rehearsal: the model answers its own calls", "act + world, role-wise GRPO"),
    "act-only": ("rehearsal", "act only; the world role is frozen"),
    "real-grpo": ("the real tools", "act"),
    "shared-baseline": ("rehearsal", "act + world, one baseline for both roles"),
    "simulator": ("a frozen copy of the SFT model answers", "act"),
}


def doc_names(docs: Path = DOCS) -> list[str]:
    """Docs the reader offers (paths under docs/), the first-read ones first."""
    if not docs.is_dir():
        return []
    names = sorted(str(p.relative_to(docs)) for p in docs.rglob("*.md"))
    return [n for n in FIRST_DOCS if n in names] + [n for n in names if n not in FIRST_DOCS]


def doc_href(name: str) -> str:
    """A link that opens doc ``name`` in this page (a relative URL: works on any host)."""
    return f"?tab=home&doc={name}"


def link_docs(text: str, docs: Path = DOCS) -> str:
    """``text`` with each mention of an existing ``docs/NAME.md`` made a link to the reader
    (fenced code blocks left alone)."""

    def link(match: re.Match[str]) -> str:
        name = match.group(1)
        if not (docs / name).is_file():
            return match.group(0)
        return f"[docs/{name}]({doc_href(name)})"

    parts = text.split("```")
    # even parts are outside fences
    return "```".join(DOC_MENTION.sub(link, p) if i % 2 == 0 else p for i, p in enumerate(parts))


def read_doc(name: str | None, docs: Path = DOCS) -> str:
    """Doc ``name`` (a path under docs/) as markdown with working doc links, or why not."""
    if not name:
        return ""
    if name not in doc_names(docs):  # only files of docs/: never a path outside it
        known = ", ".join(doc_names(docs)[:8]) or "none in this copy of the studio"
        return f"No doc `{name}` here (docs: {known})."
    return link_docs((docs / name).read_text(encoding="utf-8"), docs)


def docs_line() -> str:
    """A line of links to the docs a first visitor reads."""
    names = [n for n in FIRST_DOCS if n in doc_names()]
    if not names:
        return "The docs are in the repository's `docs/` folder."
    return "Docs: " + " · ".join(f"[{n}]({doc_href(n)})" for n in names)


def _study(manifests: list[RunManifest]) -> RunManifest | None:
    """The newest study run's manifest, if the data folder has one."""
    studies = [m for m in manifests if m.kind == "study"]
    return max(studies, key=lambda m: m.created_at) if studies else None


def _bundled(manifests: list[RunManifest], study: str) -> str:
    """What the data folder holds of ``study``'s runs, in words."""
    by_kind: dict[str, list[str]] = {}
    for m in manifests:
        if m.run_id.startswith(f"{study}--"):
            by_kind.setdefault(m.kind, []).append(m.run_id.removeprefix(f"{study}--"))
    parts = []
    if by_kind.get("train"):
        arms = ", ".join(f"`{a}`" for a in sorted(by_kind["train"]))
        parts.append(f"each arm's run ({arms}: curves and the episodes of its last steps)")
    if by_kind.get("sweep"):
        evals = ", ".join(f"`{e.removeprefix('eval-')}`" for e in sorted(by_kind["sweep"]))
        parts.append(f"the evaluation sweeps of {evals} (*Rehearsal budget*)")
    if by_kind.get("eval"):
        names = ", ".join(f"`{e.removeprefix('fidelity-')}`" for e in sorted(by_kind["eval"]))
        parts.append(f"the world-model evaluation of {names} (*Rehearsed vs real*)")
    return "; ".join(parts)


def about_demo(ctx: Studio, heading: bool = True) -> str:
    """Markdown header: what the data folder's study is, what is in the folder, the arms
    (``heading``: with its title, for a page that does not title it otherwise)."""
    manifests = ctx.store.scan_runs()  # manifests only: no query over the episodes
    found = _study(manifests)
    if found is None:
        return ("## What this is\n\n" if heading else "") + (
            "EnvACE Studio: runs of world-rehearsal RL for tool-use agents "
            "(one model acts and also rehearses the tools' answers). No reproduction study in "
            "this data folder yet: `envace study --config configs/study-toy.toml` runs one. "
            + docs_line()
        )
    study, config = found.run_id, found.config
    evaluation = config.get("eval", {})
    arms = [a for a in config.get("arms", []) if a in ARMS]
    steps = (config.get("train") or {}).get("steps")
    base = str(config.get("base_model", ""))
    suite = str(config.get("suite", ""))
    lines = [
        *(["## What this demo is", ""] if heading else []),
        f"The reproduction study **`{study}`** ([docs/study.md]({doc_href('study.md')})): "
        f"`{base}`{' (SmolLM2-135M-Instruct)' if base == SMOLLM2 else ''} warmed up by SFT on "
        f"reference trajectories{' of the toy tool worlds' if suite == 'toy' else ''}, then "
        f"trained {f'{steps} steps ' if steps else ''}in each arm below on the `{suite}` suite, "
        f"and every checkpoint evaluated on {evaluation.get('n_tasks', '?')} held-out tasks × "
        f"{evaluation.get('repeats', '?')} repeats against the real tools.",
    ]
    bundled = _bundled(manifests, study)
    if bundled:
        lines += ["", f"In this data folder: the study's report (*Study*); {bundled}."]
    lines += ["", "| arm | rollouts | trained roles |", "|---|---|---|"]
    lines += [f"| `{a}` | {ARMS[a][0]} | {ARMS[a][1]} |" for a in arms]
    lines += ["", docs_line()]
    return "\n".join(lines)


def overview(ctx: Studio) -> str:
    """Markdown summary: runs and episodes in storage, the models, the data folder."""
    runs = ctx.store.runs()
    episodes = ctx.store.count_episodes()
    lines = [
        "## Data",
        "",
        f"Data folder: `{ctx.root}` — {len(runs)} run(s), {episodes} episode(s)."
        if len(runs)
        else f"Data folder: `{ctx.root}` — no runs yet: launch one on *Runs & jobs*.",
        "",
        "## Models",
        "",
        "| name | what |",
        "|---|---|",
    ]
    lines += [f"| `{name}` | {about} |" for name, about in registry().items()]
    bad = ctx.store.unreadable()
    if not bad.empty:
        names = ", ".join(f"`{r}`" for r in dict.fromkeys(bad["run"]))
        lines[3:3] = ["", f"⚠️ Could not read {names}: *Runs & jobs* says why.", ""]
    return "\n".join(lines)


def glossary(elem_id: str) -> None:
    """The study's vocabulary in a closed accordion (the Study and Home pages show it)."""
    with gr.Accordion("Glossary: the study's terms", open=False, elem_id=elem_id):
        gr.Markdown(GLOSSARY)


def from_link(query: dict[str, str]) -> tuple[Any, str]:
    """The doc a ``?tab=home&doc=NAME`` link asks for: (menu update, rendered doc)."""
    name = query.get("doc") if query.get("tab") == "home" else None
    if not name:
        return gr.update(), ""
    return gr.update(value=name if name in doc_names() else None), read_doc(name)


# A doc link opens Home with the doc at the bottom of the page: scroll to it once the tab shows.
SHOW_DOC_JS = """() => {
  if (!new URLSearchParams(location.search).get("doc")) return;
  let tries = 0;
  const go = () => {
    const reader = document.querySelector("#home-doc-pick");
    if (reader && reader.offsetParent !== null) reader.scrollIntoView();
    else if (tries++ < 100) setTimeout(go, 50);
  };
  go();
}"""


def build(ctx: Studio, tab: gr.Tab, loads: PageLoads) -> None:
    """Lay out the home page (``loads``: for the ``?doc=`` link on load)."""
    about = gr.Markdown(elem_id="home-about")
    glossary("home-glossary")
    with gr.Row():
        gr.Markdown(GUIDE)
        data = gr.Markdown(elem_id="home-overview")
    # drawn each time the page is shown, so new runs show without a restart
    when_shown(loads, tab, "home", lambda: (about_demo(ctx), overview(ctx)), [about, data])
    gr.Markdown("## Docs")
    pick = gr.Dropdown(
        doc_names(), value=None, label="read a doc", filterable=True, elem_id="home-doc-pick"
    )
    doc = gr.Markdown(elem_id="home-doc")
    pick.input(read_doc, [pick], [doc])

    def on_load(request: gr.Request) -> tuple[Any, str]:
        return from_link(dict(request.query_params) if request is not None else {})

    loads.on("home", on_load, (), [pick, doc])
    loads.then_js(SHOW_DOC_JS)
