"""A deliberately broken copy of ``spec.full_attention.longest_cached_run``.

The loop bound is off by one (``max_length // block_size + 1``), so the hit can
run one block past ``max_length``. The contracts are the spec's, verbatim;
``tests/test_crosshair.py`` checks that CrossHair finds the violated
postcondition ``0 <= result * block_size <= max_length``. Never import this
module from the package: it is wrong on purpose.
"""

from __future__ import annotations

import icontract


@icontract.require(lambda block_size: block_size > 0)
@icontract.require(lambda max_length: max_length >= 0)
@icontract.ensure(lambda result, max_length, block_size: 0 <= result * block_size <= max_length)
@icontract.ensure(lambda result, cached: all(cached[:result]))
@icontract.ensure(lambda result, cached, max_length, block_size:
                  result == len(cached) or result == max_length // block_size
                  or not cached[result])
def longest_cached_run(cached: tuple[bool, ...], max_length: int, block_size: int) -> int:
    """Number of leading blocks hit -- with a seeded off-by-one in the bound."""
    limit = min(len(cached), max_length // block_size + 1)  # BUG: the spec has no "+ 1"
    run = 0
    while run < limit and cached[run]:
        run += 1
    return run
