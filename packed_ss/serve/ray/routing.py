"""Prefix-aware routing: a request goes to the replica that recently served the longest head of its prompt,
among the replicas whose load is within `imbalance` requests of the least loaded one.

The anchor is Ray Serve LLM's PrefixCacheAffinityRouter, which matches prompt text in a prefix tree and falls
back to load when the match is poor or the load uneven. Here the prompt is already tokens (the ingress
tokenized it), so the router matches what an engine's prefix cache can reuse: whole blocks of `block` tokens,
each keyed by the hash of itself and every block before it (as vLLM keys its cached blocks), so that one key
stands for the whole prefix it ends. Each replica's keys are the blocks of the prompts routed to it, the
`blocks` most recent kept: an estimate of what its cache still holds. Chat prompts share the template's
head, so matching only the first block would send every request to one replica; the longest match tells
their system prompts apart, and the load bound keeps a popular prefix from piling onto one replica while
another idles. Ties go to the less loaded replica, then at random.
"""
from __future__ import annotations

import random
from collections import OrderedDict
from itertools import takewhile

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from ...checks import check_int


def block_keys(tokens: list[int], block: int) -> list[int]:
    """The key of each whole block of `tokens`: the hash of the block and of the key before it."""
    keys, key = [], 0
    for end in range(block, len(tokens) + 1, block):
        key = hash((key, *tokens[end - block:end]))
        keys.append(key)
    return keys


class PrefixAwareRouter(RequestRouter):
    def initialize_state(self, block: int = 16, blocks: int = 8192, imbalance: int = 4):
        """`block`: tokens per matched block (vLLM's default block size); `blocks`: keys kept per replica;
        `imbalance`: how many more requests than the least loaded replica a matching one may hold."""
        for name, value, low in (("block", block, 1), ("blocks", blocks, 1), ("imbalance", imbalance, 0)):
            check_int(name, value, low)
        self.block, self.blocks, self.imbalance = block, blocks, imbalance
        self.recent: dict[ReplicaID, OrderedDict[int, None]] = {}

    def _keys(self, request: PendingRequest | None) -> list[int]:
        job = request.args[0] if request is not None and request.args else None
        return block_keys(job.prompt_ids, self.block) if hasattr(job, "prompt_ids") else []

    def _matched(self, replica: ReplicaID, keys: list[int]) -> int:
        return sum(1 for _ in takewhile(self.recent.get(replica, {}).__contains__, keys))

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        """Every candidate, one per rank, best first (Ray Serve takes the first that has room)."""
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True     # each pass ranks every replica
        keys = self._keys(pending_request)
        load = {r.replica_id: self._replica_queue_len_cache.get(r.replica_id) or 0 for r in candidate_replicas}
        least = min(load.values(), default=0)

        def rank(replica: RunningReplica) -> tuple:
            near = load[replica.replica_id] <= least + self.imbalance
            return not near, -self._matched(replica.replica_id, keys) if near else 0, load[replica.replica_id]

        shuffled = random.sample(candidate_replicas, len(candidate_replicas))
        return [[replica] for replica in sorted(shuffled, key=rank)]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result) -> None:
        recent = self.recent.setdefault(replica_id, OrderedDict())
        for key in self._keys(pending_request):
            recent[key] = None
            recent.move_to_end(key)
        while len(recent) > self.blocks:
            recent.popitem(last=False)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.recent.pop(replica_id, None)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        live = {r.replica_id for r in replicas}
        self.recent = {replica: keys for replica, keys in self.recent.items() if replica in live}
