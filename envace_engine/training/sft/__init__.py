"""SFT warm-up on reference trajectories of both roles (docs/training.md, "SFT warm-up").

Examples (one per generation the policy will make at run time, "step-as-sample"):

* ``act`` — prompt: the act chat up to an assistant message of the reference trajectory;
  completion: that message (a ``<tool_call>`` block, or the final answer);
* ``rehearse`` — prompt: the rehearse chat for one reference call; completion:
  ``<execution_result>{reference result}</execution_result>``;
* with ``invalid_fraction`` > 0, rehearse examples of invalid variants of reference calls,
  targeting the real environment's error (``sft.invalid``);
* with ``memory_fraction`` > 0, memory-conditioned examples (``sft.memory``): act examples of
  the same trajectory with a rehearsal memory in context, and (role ``memory``) the memory
  written from an imagined attempt — so test-time rehearsal meets a format it was trained on.

Prompts are rendered with the *same* functions and switches the rollout uses
(``act_samples``/``rehearse_samples``, ``pick_examples`` from the same pool,
``grounded_rehearsal``, ``rehearse_history``, ``n_examples``): other prompts would teach a
format the policy never meets. Token-in/token-out holds here too: a prompt is tokenised as the
rollout tokenises it (the chat with its generation prompt), a completion as the canonical
tokens of its text plus the end-of-turn token — the ids the policy must sample.

Why our own loop rather than TRL's ``SFTTrainer`` (``bench/sft_step.py`` compares them on the
same batch): batches are bucketed by length (little padding), the LM head runs only on
completion tokens (``logprobs.completion_logprobs``: no ``[B, L, V]`` logits), with
``pack_turns`` a task's nested act turns are one sequence (``chains``), and bf16 autocast runs
the GEMMs on the CPU's bf16 units while the weights and AdamW state stay fp32.
The loss is the mean negative log-likelihood over a batch's completion tokens, as TRL's.
"""

from envace_engine.training.sft.data import (
    Chain,
    Example,
    all_samples,
    as_rows,
    build_records,
    sft_tasks,
    to_record,
    tokenize,
)
from envace_engine.training.sft.run import run_sft, sft_loss

__all__ = [
    "Chain",
    "Example",
    "all_samples",
    "as_rows",
    "build_records",
    "run_sft",
    "sft_loss",
    "sft_tasks",
    "to_record",
    "tokenize",
]
