"""The mutant machinery of issue 18 (``benchmarks/mutation.py``), on stand-in engine code.

A mutant edits the installed source of one function and puts the result in place only
while its ``with`` block runs; an edit that does not match exactly once is refused as
stale, so that a mutant written for one release never silently tests nothing on another.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import mutation_fixtures as fixtures
from mutation import Mutant, StaleMutant, applied, mutated_source

TARGET = "mutation_fixtures"


def _mutant(target: str, find: str, replace: str, **kwargs) -> Mutant:
    return Mutant(f"test.{find}", f"{TARGET}:{target}", find, replace, "off-by-one", "manager", **kwargs)


def test_a_method_is_replaced_only_inside_the_block() -> None:
    original = fixtures.Pool.touch
    with applied(_mutant("Pool.touch", "self.ref_cnt += 1", "self.ref_cnt += 2")):
        assert fixtures.Pool().touch() == 2
    assert fixtures.Pool.touch is original and fixtures.Pool().touch() == 1


def test_a_module_function_is_replaced_in_every_module_that_imported_it() -> None:
    from mutation_fixtures import below_limit

    holder = type(sys)("holder_module")
    holder.below_limit = below_limit
    sys.modules["holder_module"] = holder
    try:
        with applied(_mutant("below_limit", "value < LIMIT", "value <= LIMIT")):
            assert fixtures.below_limit(3) and holder.below_limit(3)
        assert not fixtures.below_limit(3) and not holder.below_limit(3)
        assert holder.below_limit is below_limit
    finally:
        del sys.modules["holder_module"]


def test_module_globals_stay_live_in_the_edited_function() -> None:
    with applied(_mutant("below_limit", "value < LIMIT", "value <= LIMIT")):
        fixtures.LIMIT = 10
        try:
            assert fixtures.below_limit(10) and not fixtures.below_limit(11)
        finally:
            fixtures.LIMIT = 3


def test_static_methods_stay_static_and_zero_argument_super_still_works() -> None:
    with applied(_mutant("Pool.order", "list(blocks)", "list(reversed(blocks))")):
        assert fixtures.Pool.order([1, 2]) == [2, 1]
    assert fixtures.Pool.order([1, 2]) == [1, 2]
    with applied(_mutant("CountingPool.touch", "* 10", "* 100")):
        assert fixtures.CountingPool().touch() == 100
    assert fixtures.CountingPool().touch() == 10


@pytest.mark.parametrize(("target", "find", "occurrence", "message"), [
    ("Pool.touch", "self.ref_cnt -= 1", None, "is not in"),
    ("Pool.touch", "self.ref_cnt", None, "occurs 2 times"),
    ("Pool.touch", "self.ref_cnt", 2, "not 3"),
    ("Pool.missing", "x", None, "no missing"),
])
def test_an_edit_that_does_not_match_exactly_once_is_stale(target, find, occurrence, message) -> None:
    with pytest.raises(StaleMutant, match=message), applied(_mutant(target, find, "y", occurrence=occurrence)):
        pass  # pragma: no cover -- never entered


def test_a_named_occurrence_edits_that_one() -> None:
    source = mutated_source(_mutant("Pool.touch", "self.ref_cnt", "self.count", occurrence=1))
    assert "self.ref_cnt += 1" in source and "return self.count" in source


def test_a_mutant_must_change_something_and_name_a_known_kind() -> None:
    with pytest.raises(ValueError, match="changes nothing"):
        _mutant("Pool.touch", "x", "x")
    with pytest.raises(ValueError, match="kind"):
        Mutant("k", f"{TARGET}:Pool.touch", "a", "b", "typo", "manager")
