"""Which SGLang server gets which prompt: prefix affinity with load balance (docs/samplers.md).

SGLang reuses KV cache for any prompt that starts with token ids the *same* server has seen
(its radix cache). Across several servers that only pays off when related prompts land on the
same one, so the policy is:

1. **Sticky continuations.** Every finished sequence (prompt + output ids) is remembered, by a
   rolling hash of its exact ids, with the server that produced it. A new prompt that starts
   with a remembered sequence (the next turn of a multi-turn episode) goes back to that server;
   the longest such sequence wins. Only whole generated sequences count, so prompts that merely
   share a system prompt are not pulled onto one server.
2. **Groups together.** The remaining prompts are grouped by identical token ids (a GRPO group,
   or N rehearsals of one prompt); each group goes, whole, to the server with the fewest prompt
   tokens assigned so far in this call (largest groups first).

A single URL (one server, or an sglang-router, which does its own cache-aware routing) takes
everything. Memory is bounded: the least recently used sequences are forgotten first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

_MOD = (1 << 61) - 1  # a Mersenne prime: rolling hashes of token prefixes never collide in practice
_BASE = 1_000_003


class PrefixRouter:
    """Assigns prompts to ``n_servers`` servers by continuation affinity, then by load."""

    def __init__(self, n_servers: int, *, max_entries: int = 100_000) -> None:
        if n_servers < 1:
            raise ValueError("PrefixRouter needs at least one server URL")
        self.n_servers = n_servers
        self.max_entries = max_entries
        self._owner: OrderedDict[tuple[int, int], int] = OrderedDict()  # (len, hash) -> server
        self._lock = threading.Lock()  # remember() runs in the sampler's request threads

    def assign(self, prompts: list[list[int]]) -> list[int]:
        """The server index for each prompt (see the module docstring for the policy)."""
        if self.n_servers == 1:
            return [0] * len(prompts)
        servers = [-1] * len(prompts)
        load = [0] * self.n_servers
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, prompt in enumerate(prompts):
            server = self.sticky_server(prompt)
            if server is None:
                groups.setdefault(tuple(prompt), []).append(i)
            else:
                servers[i] = server
                load[server] += len(prompt)
        for key, members in sorted(groups.items(), key=lambda kv: -len(kv[1]) * len(kv[0])):
            server = min(range(self.n_servers), key=lambda s: load[s])
            for i in members:
                servers[i] = server
            load[server] += len(key) * len(members)
        return servers

    def remember(self, sequence: list[int], server: int) -> None:
        """Record that ``server`` now caches ``sequence`` (a prompt plus its output ids)."""
        if self.n_servers == 1 or not sequence:
            return
        key = (len(sequence), prefix_hashes(sequence)[-1])
        with self._lock:
            self._owner[key] = server
            self._owner.move_to_end(key)
            while len(self._owner) > self.max_entries:
                self._owner.popitem(last=False)

    def sticky_server(self, prompt: list[int]) -> int | None:
        """The server holding the longest remembered sequence that ``prompt`` starts with."""
        if not self._owner:
            return None
        hashes = prefix_hashes(prompt)
        with self._lock:
            for n in range(len(prompt), 0, -1):
                server = self._owner.get((n, hashes[n - 1]))
                if server is not None:
                    self._owner.move_to_end((n, hashes[n - 1]))
                    return server
        return None


def prefix_hashes(ids: list[int]) -> list[int]:
    """Polynomial rolling hash of every prefix: ``out[n - 1]`` covers ``ids[:n]``."""
    out = []
    h = 0
    for token in ids:
        h = (h * _BASE + token + 1) % _MOD
        out.append(h)
    return out
