"""The on-disk schema: version number and the Arrow schema of every Parquet table.

One version covers both halves of storage — the Parquet shards of a run directory and the
studio's DuckDB file — so a run exported by one build and imported by another is checked once.
Every run's ``run.json`` records the version that created it. Bump ``SCHEMA_VERSION`` on every
layout change and say what changed in ``SCHEMA_HISTORY``; a column added later goes in
``ADDED_IN``. Readers accept every version up to this build's: a shard without a column added
later reads it as null (``storage.views.padded``), and only a version newer than this build is
refused. A renamed or retyped column would need a reader that maps the old name or type.

A "turn" in the benchmarks and docs is one row of ``segments``: one role-tagged run of tokens.
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = 3
# What each version changed; this build reads every one of them.
SCHEMA_HISTORY: dict[int, str] = {
    1: "the first layout",
    2: "calls gained checked_json, checked_error and checked_message (the schema check's refusal)",
    3: "rehearsals gained stated (whether the task's world state was in the rehearse prompt)",
}

TOKENS = pa.list_(pa.int32())
LOGPROBS = pa.list_(pa.float32())

EPISODES = pa.schema(
    [
        ("run_id", pa.string()),
        ("step", pa.int32()),
        ("episode_index", pa.int32()),  # position within the step: the stable sort order
        ("episode_id", pa.string()),
        ("group_id", pa.string()),
        ("task_id", pa.string()),
        ("suite", pa.string()),
        ("mode", pa.string()),
        ("reward", pa.float64()),
        ("stop_reason", pa.string()),
        ("stop_detail", pa.string()),
        ("n_segments", pa.int32()),
        ("n_calls", pa.int32()),
        ("n_rehearsals", pa.int32()),
        ("n_tokens", pa.int32()),
        ("n_act_tokens", pa.int32()),
        ("n_rehearse_tokens", pa.int32()),
        ("final_answers", pa.list_(pa.string())),
        ("drift", pa.int32()),
        ("mean_fidelity", pa.float64()),  # mean pair score over the episode's scored calls
        ("adv_act", pa.float64()),  # role-wise advantages from Episode.meta["advantages"]
        ("adv_rehearse", pa.float64()),
        ("meta_json", pa.string()),
    ]
)

SEGMENTS = pa.schema(
    [
        ("run_id", pa.string()),
        ("step", pa.int32()),
        ("episode_id", pa.string()),
        ("episode_index", pa.int32()),  # rows are grouped by it: lookups skip row groups
        ("seq", pa.int32()),  # index of the segment within the episode's agent context
        ("role", pa.string()),
        ("text", pa.string()),
        ("n_tokens", pa.int32()),
        ("token_ids", TOKENS),
        ("logprobs", LOGPROBS),  # null for roles the sampler did not write
    ]
)

CALLS = pa.schema(
    [
        ("run_id", pa.string()),
        ("step", pa.int32()),
        ("episode_id", pa.string()),
        ("episode_index", pa.int32()),
        ("call_index", pa.int32()),
        ("call_id", pa.string()),  # "<episode_id>/<call_index>": the annotation target id
        ("turn", pa.int32()),
        ("agent_step", pa.int32()),
        ("tool", pa.string()),
        ("arguments_json", pa.string()),
        ("raw", pa.string()),
        ("shown", pa.string()),
        ("rehearsed_json", pa.string()),  # canonical JSON of the value, null on error/absent
        ("rehearsed_error", pa.string()),  # error code, null when it succeeded or is absent
        ("rehearsed_message", pa.string()),
        ("real_json", pa.string()),
        ("real_error", pa.string()),
        ("real_message", pa.string()),
        ("simulated_json", pa.string()),
        ("simulated_error", pa.string()),
        ("simulated_message", pa.string()),
        # the schema check's error for a call it refused before the world role was asked
        # (RolloutConfig.check_calls; shown = "checked"): code and message, json always null
        ("checked_json", pa.string()),
        ("checked_error", pa.string()),
        ("checked_message", pa.string()),
        ("rehearsed_status", pa.string()),  # "ok" | "error" | null (not rehearsed)
        ("real_status", pa.string()),
        ("pair_source", pa.string()),  # "rehearsed" | "simulated" | null (no pair to score)
        ("parse_valid", pa.bool_()),
        ("status_agree", pa.bool_()),
        ("error_code_agree", pa.bool_()),
        ("exact", pa.bool_()),
        ("key_jaccard", pa.float64()),
        ("value_match", pa.float64()),
        ("text_similarity", pa.float64()),
        ("fidelity", pa.float64()),  # envace_engine.fidelity.metrics score
        ("real_nll", pa.float64()),  # nats per token of the real response, when computed
    ]
)

REHEARSALS = pa.schema(
    [
        ("run_id", pa.string()),
        ("step", pa.int32()),
        ("episode_id", pa.string()),
        ("episode_index", pa.int32()),
        ("rehearsal_index", pa.int32()),
        ("call_index", pa.int32()),
        ("grounded", pa.bool_()),
        ("stated", pa.bool_()),  # the task's world state was in the prompt (null before v3)
        ("text", pa.string()),
        ("n_prompt_tokens", pa.int32()),
        ("n_tokens", pa.int32()),
        ("prompt_ids", TOKENS),
        ("token_ids", TOKENS),
        ("logprobs", LOGPROBS),
    ]
)

METRICS = pa.schema(
    [("run_id", pa.string()), ("step", pa.int32()), ("name", pa.string()), ("value", pa.float64())]
)

# (table, column) -> the version that added it: shards of older runs lack these columns.
ADDED_IN: dict[tuple[str, str], int] = {
    ("calls", "checked_json"): 2,
    ("calls", "checked_error"): 2,
    ("calls", "checked_message"): 2,
    ("rehearsals", "stated"): 3,
}

TABLES: dict[str, pa.Schema] = {
    "episodes": EPISODES,
    "segments": SEGMENTS,
    "calls": CALLS,
    "rehearsals": REHEARSALS,
    "metrics": METRICS,
}
# Write order within a step: the episodes shard last, so an episode that is listed always has its
# segments, calls and rehearsals on disk.
WRITE_ORDER = ("segments", "rehearsals", "calls", "episodes")

# Parquet encoding choices (storage.shards). Dictionaries only for columns whose values repeat
# (roles, tools, statuses, codes, ids of groups and tasks) and for segment and rehearsal text
# (a prompt repeats across a GRPO group and often across tasks, and DuckDB evaluates a search
# filter once per dictionary entry, so the dictionary makes free-text search faster in
# bench/storage.py); JSON, episode and call ids and numbers are written plain, which zstd
# compresses as well or better. Min/max statistics only where readers prune row groups or
# files: run and step, and episode_index (rows are in episode order, so a one-episode lookup
# decodes one row group). Both choices make a step faster to encode and its files smaller.
DICTIONARY_COLUMNS = frozenset(
    {
        "run_id",
        "step",
        "role",
        "tool",
        "shown",
        "rehearsed_status",
        "real_status",
        "pair_source",
        "rehearsed_error",
        "real_error",
        "simulated_error",
        "checked_error",
        "group_id",
        "task_id",
        "suite",
        "mode",
        "stop_reason",
        "name",
        "text",
    }
)
STATISTICS_COLUMNS = ("run_id", "step", "episode_index")


class SchemaVersionError(RuntimeError):
    """A run directory or studio database was written by a schema version this build cannot read."""


def columns_at(table: str, version: int) -> list[str]:
    """The columns a ``table`` shard written at schema ``version`` has."""
    return [f.name for f in TABLES[table] if ADDED_IN.get((table, f.name), 1) <= version]


def padded_table(data: pa.Table, schema: pa.Schema) -> pa.Table:
    """``data`` with every column of ``schema`` in its order; a missing one as typed nulls.
    A column ``schema`` does not know is an error: this is not our shard, or a newer one."""
    unknown = sorted(set(data.column_names) - set(schema.names))
    if unknown:
        raise ValueError(f"columns {unknown} are not in this build's schema: not upgraded")
    columns = [
        data[f.name] if f.name in data.column_names else pa.nulls(data.num_rows, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(columns, names=schema.names).cast(schema)


def check_version(found: int, where: str) -> None:
    """Raise ``SchemaVersionError`` naming ``where`` when this build cannot read ``found``: a
    version newer than this build's (or not a version at all). Every older version is read."""
    if found > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{where} has schema version {found}, newer than this build's {SCHEMA_VERSION}: "
            "it was written by a newer envace-studio. Upgrade envace-studio to read it; nothing "
            "in it was changed."
        )
    if found not in SCHEMA_HISTORY:
        raise SchemaVersionError(
            f"{where} has schema version {found}, which no envace-studio wrote (known: "
            f"{', '.join(map(str, SCHEMA_HISTORY))}): the file was edited or is not ours."
        )
