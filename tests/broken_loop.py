"""One copy of vLLM 0.33.0's hybrid fixed-point loop for the broken hybrid engines.

:func:`kvoracle.spec.hybrid.fixed_point` states the loop; the broken coordinators of
tests/broken_hybrid_engines.py, tests/broken_gap_engines.py and
tests/broken_lookup_gap_engines.py each need it with one piece changed. They share this
copy, in which each known bug is a switch, so that every broken engine computes the rest
of the loop -- the uncached common prefix tokens (KV-HYB-008) included -- exactly as the
spec does, and a suite that charges one of them charges the bug, not a stale copy.
"""

from __future__ import annotations

from collections.abc import Callable

from kvoracle.spec import hybrid as spec

Finder = Callable[[str, tuple[bool, ...], int, int, int, bool, int], int]


def broken_fixed_point(groups, cached, max_cache_hit_length, num_hashed_tokens, alignment, *,
                       finder: Finder = spec.group_hit_length, one_pass: bool = True,
                       drop_every_pass: bool = False, mamba_margin: bool = False,
                       longest_per_pass: bool = False, margin_cap_at_bound: bool = False):
    """The spec's loop (without its ``ideal`` mode), with the same five results.

    ``finder``: each group's answer (the kind's hit rule). ``one_pass=False``: no KV-HYB-005
    stop after the first pass. ``drop_every_pass``: an EAGLE group drops its peek block on
    every pass with no look-ahead margin, as before the fix of vLLM #32802 (the hit spirals
    down). ``mamba_margin``: a
    Mamba group is looked up one block past the candidate like the other EAGLE groups
    (#43559). ``longest_per_pass``: the longest candidate is taken once per pass instead of
    after each group's answer (the uncached count comes out too small).
    ``margin_cap_at_bound``: the look-ahead is capped by ``max_cache_hit_length`` instead of
    the hashed tokens (vLLM 0.20 to 0.31; an EAGLE hit at the bound loses its last block).
    """
    order = spec.lookup_order(tuple(kind for kind, _, _, _ in groups))
    simple = one_pass and spec.single_pass(tuple(kind for kind, _, _, _ in groups))
    hit_length = max_cache_hit_length
    looked_up = [False] * len(groups)
    group_length = [0] * len(groups)
    last_lookup = [(0, False)] * len(groups)
    verified: set[int] = set()
    longest = lookups = 0
    while True:
        candidate = hit_length
        for g in order:
            kind, size, param, eagle = groups[g]
            if kind == spec.FULL and looked_up[g]:
                candidate = min(candidate, group_length[g])  # KV-HYB-006: trim only
                continue
            drop = eagle and (drop_every_pass or g not in verified)
            margin = size if mamba_margin and kind == spec.MAMBA else spec.eagle_margin(kind, size)
            margin = 0 if drop_every_pass else margin
            cap = max_cache_hit_length if margin_cap_at_bound else num_hashed_tokens
            bound = min(candidate + margin, cap) if drop and margin else candidate
            answer = finder(kind, cached[g], bound, size, param, drop, alignment)
            lookups += 1
            last_lookup[g] = (bound, drop)
            if drop:
                verified.add(g)
            elif answer < candidate:
                verified.clear()  # KV-HYB-009: only a non-EAGLE shrink clears
            candidate = answer
            looked_up[g] = True
            group_length[g] = answer
            if not longest_per_pass:
                longest = max(longest, candidate)
        if longest_per_pass:
            longest = max(longest, candidate)
        if candidate >= hit_length:
            break
        hit_length = candidate
        if simple:
            break  # KV-HYB-005
    return hit_length, tuple(group_length), longest - hit_length, lookups, tuple(last_lookup)
