"""The request model: tokens appended over time, hashes extended incrementally."""

from __future__ import annotations

import enum

import attrs
import icontract

from kvoracle.spec import hashing

from .contracts import ENABLED


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


@icontract.invariant(lambda self: len(self.block_hashes)
                     == hashing.num_block_hashes(len(self.all_token_ids), self.hash_block_size),
                     "KV-HASH-002: one hash per full hash block", enabled=ENABLED)
@icontract.invariant(lambda self: 0 <= self.num_computed_tokens <= len(self.all_token_ids),
                     "KV-CFG-005: computed tokens lie within the request", enabled=ENABLED)
@attrs.define(eq=False, slots=False)
class Request:
    """A request as the KV-cache manager sees it.

    ``block_hashes`` holds one chained hash per full ``hash_block_size`` block
    of ``all_token_ids`` (KV-HASH-001/-002), extended when tokens are appended.
    """

    request_id: str
    prompt_token_ids: tuple[int, ...] = attrs.field(converter=tuple)
    hash_block_size: int
    cache_salt: str | None = None
    lora_name: str | None = None
    #: Requests needing prompt logprobs (or all-pooling) must not read the cache.
    skip_reading_prefix_cache: bool = False
    all_token_ids: list[int] = attrs.field(init=False)
    block_hashes: list[bytes] = attrs.field(init=False)
    num_computed_tokens: int = attrs.field(init=False, default=0)
    status: RequestStatus = attrs.field(init=False, default=RequestStatus.WAITING)

    def __attrs_post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError("KV-CFG-005: a request needs at least one prompt token")
        self.all_token_ids = list(self.prompt_token_ids)
        self.block_hashes = []
        self._update_block_hashes()

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @icontract.snapshot(lambda self: tuple(self.block_hashes), name="hashes", enabled=ENABLED)
    @icontract.ensure(lambda self, OLD: tuple(self.block_hashes[:len(OLD.hashes)]) == OLD.hashes,
                      "KV-HASH-003: appending tokens never rewrites a hash", enabled=ENABLED)
    def append_output_token_ids(self, token_ids: list[int] | tuple[int, ...]) -> None:
        self.all_token_ids.extend(token_ids)
        self._update_block_hashes()

    def _update_block_hashes(self) -> None:
        """Hash the blocks that became full since the last hash (KV-HASH-001/-002/-003).

        Incremental: O(new full blocks) per call, and ``block_hashes`` is extended
        in place. The same computation as :func:`hashing.extend_block_hashes`.
        """
        start = len(self.block_hashes)
        stop = hashing.num_block_hashes(len(self.all_token_ids), self.hash_block_size)
        if stop <= start:
            return  # no block became full
        parent = self.block_hashes[-1] if start else hashing.NONE_HASH
        self.block_hashes.extend(hashing.hash_blocks(
            parent, self.all_token_ids, start, stop, self.hash_block_size,
            self.cache_salt, self.lora_name,
        ))
