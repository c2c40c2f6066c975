"""``derive_seed``: one seed per random stream, from a run's base seed and labels naming the stream.

Every random stream of a run (the task order of an epoch, a step's sampling, one generation call,
an imagined phase of test-time rehearsal, one SGLang request) gets its seed from the run's base
seed and labels that say which stream it is, through one function. So streams never collide by
arithmetic accident (``seed * k + i`` formulas overlap across bases), a resumed run derives the
same seeds as the run it continues, and the seeds do not depend on the process (``hash()`` of a
string does, so it is not used).
"""

from __future__ import annotations

import hashlib

SEED_SPACE = 2**31  # seeds fit torch.Generator, random.Random and SGLang's sampling_seed


def derive_seed(base: int, *labels: int | str) -> int:
    """A seed in ``[0, 2**31)`` for the stream ``labels`` of a run seeded with ``base``.

    Deterministic across processes and machines; different labels (or label orders) give
    independent-looking seeds. Labels are ints or strings: ``derive_seed(0, "rollout", 3, 1)``.
    """
    for label in labels:
        if not isinstance(label, int | str) or isinstance(label, bool):
            raise TypeError(f"derive_seed labels are ints or strings, got {label!r}")
    text = repr((int(base), *labels)).encode()
    digest = hashlib.blake2b(text, digest_size=8).digest()
    return int.from_bytes(digest, "little") % SEED_SPACE
