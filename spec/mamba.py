"""Chapter 8 -- Mamba (state-space) layers.

A Mamba layer keeps one recurrent *state* per request instead of per-token
KV. To resume after ``L`` tokens only the state after token ``L`` is needed,
not the blocks before it. With prefix caching (vLLM's ``"align"`` cache mode)
the state is snapshotted at every ``block_size``-token boundary into the
block that ends there, and that block is cached under the boundary's hash.

**The hit** (KV-MAMBA-001). Scanning right to left from the last block within
``max_length``, the hit ends at the first cached block whose end is a multiple
of the alignment; it has ``i`` null blocks followed by that one block. Any
earlier snapshot is irrelevant: only the *last* matching state counts.
Declaratively: the greatest aligned ``L`` whose last block ``L / block_size -
1`` is cached.

**No EAGLE drop** (KV-MAMBA-002). A state snapshot cannot be rewound: dropping
the last block would leave only nulls, not the previous state. vLLM 0.33.0's
Mamba finder ignores the drop flag, and the hybrid coordinator therefore
gives a Mamba group no EAGLE look-ahead margin -- giving it one lets the Mamba
group return a hit *longer* than the candidate every other group agreed on
(vLLM issue #43559, the historical failure the meta-tests replay).

**Scope** (KV-MAMBA-003). Sub-block ("fine-grained partial") hits, which vLLM
enables when a Mamba group's block size is larger than the hash block size,
and the align mode's checkpoint/speculative-block allocation are not
specified here. kvoracle generates Mamba groups whose block size equals the
hash block size, which keeps partial hits off in the engine.
"""

from __future__ import annotations

import icontract

from .contracts import ENABLED
from .registry import INPUT_VALIDATION, defines, rule

CHAPTER = "mamba"
STKV = "vllm/v1/core/single_type_kv_cache_manager.py"
COORD = "vllm/v1/core/kv_cache_coordinator.py"

KV_MAMBA_001 = rule(
    "KV-MAMBA-001",
    "The hit is the last cached, aligned state block",
    """The hit ends after the rightmost block i < max_length // block_size that is cached
    and whose end (i + 1) * block_size is a multiple of the alignment; it is i null blocks
    followed by block i. Without such a block the hit is empty.""",
    source=f"{STKV} MambaManager.find_longest_cache_hit",
    chapter=CHAPTER,
    judged_by=("hybrid",),
)
KV_MAMBA_002 = rule(
    "KV-MAMBA-002",
    "A Mamba group neither drops an EAGLE block nor gets the EAGLE margin",
    """The Mamba finder ignores the EAGLE drop, and the hybrid coordinator looks a Mamba
    group up at the current candidate length (no extra block): a Mamba group never answers
    longer than the candidate (issue #43559: vLLM 0.20 to 0.25 gave it the look-ahead, and
    the hit outgrew what full attention holds; the hybrid suite charges an answer that is
    exactly such a loop's, ``fixed_point(..., mamba_margin=True)``, to this rule).""",
    source=f"{STKV} MambaManager.find_longest_cache_hit; {COORD} find_longest_cache_hit "
           "(no eagle margin for MambaSpec)",
    chapter=CHAPTER,
    judged_by=("hybrid",),
)
KV_MAMBA_003 = rule(
    "KV-MAMBA-003",
    "Fine-grained partial hits and align-mode allocation are out of scope",
    """kvoracle specifies Mamba lookups with block_size == hash_block_size (no sub-block
    hits); the engine's align-mode checkpoint and speculative-block allocation (prefix
    caching on) are not modelled, so with caching on Mamba groups take part in lookup checks,
    not in lockstep allocation. With caching off ("none" mode) allocation is KV-HLC-008.""",
    source=f"vllm/v1/core/kv_cache_utils.py partial_hash_hits_enabled; {STKV} MambaManager",
    chapter=CHAPTER,
    kind="validation",
    spec_only=INPUT_VALIDATION,
)


@icontract.require(lambda block_size: block_size > 0, enabled=ENABLED)
@icontract.require(lambda alignment: alignment > 0, enabled=ENABLED)
@icontract.require(lambda max_length: max_length >= 0, enabled=ENABLED)
@icontract.ensure(lambda result, max_length: 0 <= result <= max_length, enabled=ENABLED)
@icontract.ensure(lambda result, alignment: result % alignment == 0, enabled=ENABLED)
@icontract.ensure(lambda result, cached, block_size: result == 0 or cached[result // block_size - 1],
                  enabled=ENABLED)
@icontract.ensure(lambda result, cached, max_length, block_size, alignment: not any(
    cached[i] and ((i + 1) * block_size) % alignment == 0
    for i in range(result // block_size, min(max_length // block_size, len(cached)))), enabled=ENABLED)
@defines(KV_MAMBA_001, KV_MAMBA_002)
def hit_length(cached: tuple[bool, ...], max_length: int, block_size: int, alignment: int) -> int:
    """The Mamba hit in tokens (the EAGLE flag has no effect, KV-MAMBA-002)."""
    for i in range(min(max_length // block_size, len(cached)) - 1, -1, -1):
        if cached[i] and ((i + 1) * block_size) % alignment == 0:
            return (i + 1) * block_size
    return 0
