"""Steps: the closed set of things a conformance run does to an engine.

A run is a list of steps. The Hypothesis machines generate them, the lockstep
driver applies them to the reference and to the engine under test, and a
counterexample is written back out as the same list (each step's ``repr`` is
the Python expression that rebuilds it), so a replay needs nothing else.

Each step names its *primary rule*: the rule an engine error (an exception or
a hang) during that step is reported against.
"""

from __future__ import annotations

import attrs

from kvoracle.reference import ManagerConfig


@attrs.frozen
class Configure:
    """Build fresh engines for ``config``."""

    config: ManagerConfig
    primary_rule = "KV-POOL-003"


@attrs.frozen
class AddRequest:
    """A new request arrives, waiting, with ``prompt`` tokens."""

    request_id: str
    prompt: tuple[int, ...]
    cache_salt: str | None = None
    primary_rule = "KV-HASH-002"


@attrs.frozen
class Schedule:
    """The scheduler gives the request ``num_new_tokens`` tokens this step.

    A waiting (or preempted) request first looks up its prefix-cache hit and
    adopts it. ``num_draft_tokens`` speculative tokens are allocated with the new
    tokens but never committed; ``num_lookahead_tokens`` get slots only. After a
    successful allocation the request's computed tokens advance by
    ``num_new_tokens``, capped at what the request has (a waiting request is
    given at most its uncomputed tokens).
    """

    request_id: str
    num_new_tokens: int
    num_draft_tokens: int = 0
    num_lookahead_tokens: int = 0
    delay_cache_blocks: bool = False
    primary_rule = "KV-LIFE-003"


@attrs.frozen
class EmptyAllocation:
    """Call allocate_slots with no new tokens and no hit: it must be rejected."""

    request_id: str
    primary_rule = "KV-LIFE-013"


@attrs.frozen
class Probe:
    """Look a request's hit up at two bounds without allocating (KV-FULL-005)."""

    request_id: str
    max_cache_hit_length: int
    primary_rule = "KV-FULL-001"


@attrs.frozen
class AppendTokens:
    """Decoding appended ``tokens`` to a request whose tokens are all computed."""

    request_id: str
    tokens: tuple[int, ...]
    primary_rule = "KV-HASH-003"


@attrs.frozen
class Free:
    """The request finished (``preempted=False``) or was preempted."""

    request_id: str
    preempted: bool = False
    primary_rule = "KV-LIFE-009"


@attrs.frozen
class Evict:
    """The connector asks to evict these blocks from the prefix cache."""

    block_ids: tuple[int, ...]
    primary_rule = "KV-POOL-013"


@attrs.frozen
class ResetPrefixCache:
    primary_rule = "KV-POOL-014"


@attrs.frozen
class Observe:
    """Only look: compare observations and check invariants."""

    primary_rule = "KV-POOL-012"


@attrs.frozen
class CommonPrefix:
    request_id: str
    primary_rule = "KV-LIFE-010"


Step = Configure | AddRequest | Schedule | EmptyAllocation | Probe | AppendTokens | Free | \
    Evict | ResetPrefixCache | CommonPrefix | Observe
