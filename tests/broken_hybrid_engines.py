"""Deliberately broken hybrid lookups: each re-creates one known bug of a hybrid coordinator.

The meta-tests (tests/test_hybrid_meta.py) replay each on a cache state where its bug
shows and require the named rule to fail. Each is the reference adapter whose
coordinator swaps in one broken piece -- its ``fixed_point`` loop (tests/broken_loop.py's
copy of :func:`kvoracle.spec.hybrid.fixed_point` with one bug switched on) or its
``num_hit_blocks`` trim -- and drops
the reference's own postconditions, so that the suite's checks, not the reference's
contracts, must catch it.
"""

from __future__ import annotations

import inspect
from functools import partial

from broken_loop import broken_fixed_point

from kvoracle.conformance.hybrid_lookup import ReferenceHybridLookup
from kvoracle.reference.hybrid import HybridCoordinator
from kvoracle.spec import hybrid as spec


class _Unchecked(HybridCoordinator):
    """The reference coordinator without its own postconditions on the lookup.

    A broken variant must be convicted by the suite's checks, as a foreign engine would be,
    not stopped by the reference's contracts from inside the engine.
    """

    find_longest_cache_hit = inspect.unwrap(HybridCoordinator.find_longest_cache_hit)


# -- (i) the EAGLE drop on every pass (vLLM #32802) ------------------------------------------------
class _DropEveryPass(_Unchecked):
    fixed_point = staticmethod(partial(broken_fixed_point, drop_every_pass=True, one_pass=False))


class EagleDropEveryPass(ReferenceHybridLookup):
    name = "broken-eagle-drop-every-pass"
    coordinator_class = _DropEveryPass


# -- (ii) only the first full-attention spec group is trimmed to the final hit ---------------------
class _TrimFirstFullOnly(_Unchecked):
    def num_hit_blocks(self, index: int, hit: int, lengths: tuple[int, ...]) -> int:
        # (A model without full attention has no first full group: nothing to forget.)
        first_full = next((i for i, group in enumerate(self.spec_groups) if group.kind == spec.FULL), None)
        if self.spec_groups[index].kind == spec.FULL and index != first_full:
            return lengths[index] // self.spec_groups[index].kv_cache_spec.block_size
        return super().num_hit_blocks(index, hit, lengths)


class TrimFirstFullOnly(ReferenceHybridLookup):
    name = "broken-trim-first-full-only"
    coordinator_class = _TrimFirstFullOnly


# -- (iii) a Mamba group gets the EAGLE margin (#43559) ---------------------------------------------
class _MambaMargin(_Unchecked):
    fixed_point = staticmethod(partial(broken_fixed_point, mamba_margin=True))


class MambaEagleMargin(ReferenceHybridLookup):
    name = "broken-mamba-eagle-margin"
    coordinator_class = _MambaMargin


# -- (iv) a sliding-window scan needing cdiv(window, block_size) blocks -----------------------------
def _wide_window_fixed_point(flat, cached, bound, num_hashed, alignment):
    # cdiv((window + 1) - 1, b) == cdiv(window, b): the off-by-one of KV-SWA-001.
    wide = tuple((k, s, p + 1 if k == spec.SLIDING_WINDOW else p, e) for k, s, p, e in flat)
    return spec.fixed_point(wide, cached, bound, num_hashed, alignment)


class _WideWindow(_Unchecked):
    fixed_point = staticmethod(_wide_window_fixed_point)


class SwaWindowNotMinusOne(ReferenceHybridLookup):
    name = "broken-swa-cdiv-window"
    coordinator_class = _WideWindow


#: Broken adapter -> the rule the hybrid suite must convict it of.
EXPECTED = {
    "EagleDropEveryPass": "KV-HYB-015",
    "TrimFirstFullOnly": "KV-HYB-006",
    "MambaEagleMargin": "KV-MAMBA-002",
    "SwaWindowNotMinusOne": "KV-SWA-001",
}
