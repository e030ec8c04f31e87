"""KV-MAMBA-018: the model runner's view of an align-mode table -- the running entry at the
table's end (KV-MAMBA-013), the pages a step writes, and the pages it leaves without a state.

The worked examples are vLLM 0.33.0's tables (docs/findings/mamba-runner-null-state.md); the
lives run one request through the chapter's functions alone, with rejected drafts on one real
token a step as vLLM's scheduler sends them, and require every keyed page to hold the state its
key names -- where a runner reading by position writes the null block.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from align_table import AlignTable
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kvoracle.spec import get_rule, mamba
from kvoracle.spec.mamba import NO_STATE


def test_the_rule_is_registered_for_the_runner() -> None:
    rule = get_rule("KV-MAMBA-018")
    assert rule.chapter == "mamba" and rule.spec_only and not rule.judged_by
    assert {"state_entry", "step_states", "passed_pages"} <= {d.rsplit(".", 1)[-1] for d in rule.definitions}


def test_the_findings_table() -> None:
    """Block 4, no speculative page: after 8 tokens, then one token with 8 drafts (T = 17), the
    table is [n, 3, n, n, 7]; the next step of one token (T = 10) leaves it five entries long.
    Its running entry is 4 (page 7), not cdiv(10, 4) - 1 = 2, which is null."""
    table = (0, 0, 0, 0, 7)
    is_null = tuple(b == 0 for b in table)
    assert mamba.running_index(10, 4) == 2 and is_null[2]
    assert mamba.state_entry(len(table), 10, 4, 0) == 4
    none = (False,) * 5
    assert mamba.step_states(is_null, none, 10, 10, 4, 0, 0, True) == ((4, 10),)
    # At 12 tokens the state is copied to the page of that boundary too -- where there is one.
    assert mamba.step_states((True, True, False, True, False, False), (*none, False), 12, 12, 4, 1, 0, True) == \
        ((4, 12), (2, 12))
    assert mamba.step_states(is_null, none, 12, 12, 4, 0, 0, True) == ((4, 12),)
    # A table as long as the step: KV-MAMBA-014's pages.
    assert mamba.step_states((True, True, True, False, False), none, 10, 10, 2, 0, 8, True) == \
        mamba.states_written(10, 2, 8) == ((4, 10), (3, 8))


def test_pages_without_a_state() -> None:
    """A checkpoint past the committed tokens holds a draft's state; a page the checkpoint (before
    the committed tokens) and the boundary copy both reach holds none a key may name; a page whose
    boundary a step passes without writing it neither."""
    # 9 committed, 4 drafts (T = 13, block 2): the checkpoint at 12 lies past 9.
    assert mamba.step_states((False,) * 7, (False,) * 7, 9, 13, 2, 0, 12, True) == ((6, 9), (5, NO_STATE))
    # Drafts on 8 real tokens (T = 10, block 2, alignment 4): checkpoint 4 in entry 3, copy at 8 too.
    none = (False,) * 5
    assert mamba.step_states((True, True, True, False, False), none, 8, 10, 2, 0, 4, True) == ((4, 8), (3, NO_STATE))
    # Block 1, alignment 2: one token and two drafts (T = 12) keyed its checkpoint page, entry 10,
    # at 10; the next step of one token (T = 11, the table one entry longer) reaches that page's
    # boundary 11 with the copy. The page's keys name 10 now and 11 later.
    assert mamba.keyed_before_boundary(10, 10, 10, 1) and not mamba.keyed_before_boundary(10, 11, 11, 1)
    is_null = (True,) * 10 + (False, False)
    early = (False,) * 10 + (True, False)
    assert mamba.step_states(is_null, early, 11, 11, 1, 0, 0, True) == ((11, 11), (10, NO_STATE))
    assert mamba.step_states(is_null, (False,) * 12, 11, 11, 1, 0, 0, True) == ((11, 11), (10, 11))
    # Several real tokens after a step with drafts: page 2 held the state after 5 in a table that
    # step grew; the next step runs from 5 to 8 over its boundary 6.
    is_null = (True, True, False, False)
    assert mamba.step_states(is_null, (False,) * 4, 8, 8, 2, 0, 0, True) == ((3, 8),)
    assert mamba.passed_pages(is_null, (False,) * 4, 5, 8, 8, 2, 0, 0) == (2,)
    assert mamba.passed_pages(is_null, (False,) * 4, 5, 6, 6, 2, 1, 0) == ()


@settings(max_examples=400, deadline=None)
@given(length=st.integers(1, 12), extra=st.integers(0, 4), committed=st.integers(1, 30), drafts=st.integers(0, 6),
       block_size=st.sampled_from([1, 2, 4]), speculative=st.integers(0, 2), data=st.data())
def test_step_states_against_the_table(length: int, extra: int, committed: int, drafts: int, block_size: int,
                                       speculative: int, data: st.DataObject) -> None:
    """The running entry ends the table less its speculative pages and is the step's own running
    page exactly when the table is as long as the step; every page written is a page, once."""
    num_tokens = committed + drafts
    required = mamba.num_required_entries(num_tokens, block_size, speculative)
    is_null = tuple(data.draw(st.lists(st.booleans(), min_size=required + extra - 1 - speculative,
                                       max_size=required + extra - 1 - speculative))) + (False,) * (1 + speculative)
    start = data.draw(st.integers(0, committed - 1))
    early = tuple(data.draw(st.lists(st.booleans(), min_size=len(is_null), max_size=len(is_null))))
    states = mamba.step_states(is_null, early, committed, num_tokens, block_size, speculative, 0, True)
    running = states[0][0]
    assert running == len(is_null) - 1 - speculative >= mamba.running_index(num_tokens, block_size)
    assert (running == mamba.running_index(num_tokens, block_size)) == (extra == 0)
    assert all(not is_null[i] for i, _ in states) and len({i for i, _ in states}) == len(states)
    passed = mamba.passed_pages(is_null, early, start, committed, num_tokens, block_size, speculative, 0)
    assert not set(passed) & {i for i, _ in states}
    if committed <= (start // block_size + 1) * block_size:
        assert passed == ()


def _run(steps: Sequence[tuple[int, int]], block_size: int, speculative: int, alignment: int,
         checkpoint_alignment: int, by_position: bool = False
         ) -> tuple[dict[int, int], dict[int, int], list[str], set[int]]:
    """One request through one align-mode group: ``steps`` are (real tokens, rejected drafts). The
    runner writes what :func:`mamba.step_states` names (``by_position``: at the step's own running
    page instead, as vLLM 0.33.0's runner does). Returns (page -> state after that many tokens,
    page -> key tokens, what went wrong, the keyed pages the rule leaves without a state); pages are
    numbered as they are taken, the null page is -1."""
    manager = AlignTable(block_size, speculative, alignment, checkpoint_alignment)
    state: dict[int, int] = {}
    key: dict[int, int] = {}
    wrong: list[str] = []
    unjudged: set[int] = set()
    early: set[int] = set()  # pages holding a checkpoint keyed before their block boundary
    num_cached = computed = 0
    source = -1
    for real, drafts in steps:
        committed, main = computed + real, computed + real + drafts
        position = manager.allocate(computed, main)
        table = manager.entries
        is_null = tuple(page < 0 for page in table)
        exported = mamba.exported_checkpoint(bool(checkpoint_alignment), checkpoint_alignment, computed, main,
                                             alignment, block_size, block_size, False)
        # The step reads the state the previous step left.
        if source >= 0 and (source >= len(table) or table[source] < 0 or state.get(table[source]) != computed):
            wrong.append(f"step from {computed} reads entry {source} of {table}")
        if by_position:
            running = mamba.running_index(main, block_size)
            writes: tuple[tuple[int, int], ...] = ((running, committed),)
            if exported:
                writes += ((mamba.checkpoint_index(main, block_size), exported if exported <= committed else NO_STATE),)
        else:
            keyed_early = tuple(page in early for page in table)
            writes = mamba.step_states(is_null, keyed_early, committed, main, block_size, speculative, exported,
                                       bool(position))
            running = writes[0][0]
            for index in mamba.passed_pages(is_null, keyed_early, computed, committed, main, block_size, speculative,
                                            exported):
                wrong.append(f"step {computed} -> {committed} passes entry {index} of {table}")
            target = mamba.checkpoint_index(main, block_size) if exported else -1
            for index, tokens in writes:
                if index == target and tokens == exported and mamba.keyed_before_boundary(index, exported, committed,
                                                                                          block_size):
                    early.add(table[index])
                else:
                    early.discard(table[index])
        for index, tokens in writes:
            if table[index] < 0:
                wrong.append(f"step to {main} writes the state after {tokens} into null entry {index} of {table}")
            else:
                state[table[index]] = tokens
        source = running
        # The manager's caching after the allocation: whole blocks of committed tokens, then the
        # checkpoint (KV-MAMBA-011, KV-MAMBA-017).
        cacheable = committed // alignment * alignment
        num_full = cacheable // block_size
        for index in range(num_cached, min(num_full, len(table))):
            if table[index] >= 0:
                key[table[index]] = (index + 1) * block_size
        num_cached = max(num_cached, num_full)
        checkpoint = mamba.checkpoint_index(main, block_size)
        page = table[checkpoint] if position else -1
        hashed = committed // block_size * block_size
        if mamba.checkpoint_key_tokens(position, checkpoint, is_null, key.get(page) == position, hashed):
            key[page] = position
        computed = committed
        # A keyed page must hold the state its key names whenever a hit can read it; one the rule
        # leaves without a state (NO_STATE) is not judged.
        wrong += [f"page {p} keyed at {t} holds {state.get(p)}" for p, t in key.items()
                  if state.get(p) not in (t, NO_STATE)]
        unjudged |= {p for p in key if state.get(p) == NO_STATE}
    return state, key, wrong, unjudged


@st.composite
def _lives(draw: st.DrawFn) -> tuple:
    """A prompt in chunks that keep KV-MAMBA-016, then decode steps of one real token, each with
    0 to 3 blocks' worth of rejected drafts: a step with fewer drafts than the last leaves the
    table longer than it needs."""
    block_size = draw(st.sampled_from([1, 2, 4]))
    alignment = block_size * draw(st.sampled_from([1, 1, 2]))
    speculative = draw(st.integers(0, 2))
    checkpoint_alignment = draw(st.sampled_from([0, 0, 1, block_size]))
    prompt = draw(st.integers(1, 24))
    steps: list[tuple[int, int]] = []
    done = 0
    while done < prompt:
        boundary = (done // block_size + 1) * block_size
        choices = [e for e in range(boundary, prompt, block_size)] + [prompt]
        end = draw(st.sampled_from(choices if done % block_size == 0 else [min(boundary, prompt)]))
        steps.append((end - done, 0))
        done = end
    for _ in range(draw(st.integers(1, 10))):
        steps.append((1, draw(st.sampled_from([0, 0, 1, block_size, 2 * block_size, 3 * block_size]))))
    return steps, block_size, speculative, alignment, checkpoint_alignment


@settings(max_examples=400, deadline=None)
@given(life=_lives())
def test_every_keyed_page_holds_its_state_after_rejected_drafts(life: tuple) -> None:
    """KV-MAMBA-015 from KV-MAMBA-018: with drafts on one real token a step, as vLLM's scheduler
    sends them, a runner that finds the state at the table's running entry reads what the last
    step left, writes only pages, passes no page, and every keyed page holds its key's state."""
    steps, block_size, speculative, alignment, checkpoint_alignment = life
    assume(alignment % block_size == 0 and math.lcm(alignment, block_size) == alignment)
    _, _, wrong, unjudged = _run(steps, block_size, speculative, alignment, checkpoint_alignment)
    assert not wrong, wrong
    # A page keyed before its boundary is reached by the copy only with blocks of one token.
    assert not unjudged or block_size == 1, unjudged


def test_a_checkpoint_keyed_before_its_boundary_is_left_without_a_state() -> None:
    """Block 1 beside coarser groups (alignment 2): one token with two drafts keys its checkpoint
    page at 10, a shorter step then reaches that page's boundary 11. Copying the state after 11
    there would break the key of 10 (and vLLM's runner, writing by position, does write it
    there); the rule leaves the page without a state, and the positional key of 11 is given only
    once a later step caches whole blocks past it."""
    steps = [(4, 0), (1, 1), (1, 0), (3, 0), (1, 2), (1, 0)]
    state, key, wrong, unjudged = _run(steps, 1, 0, 2, 1)
    assert not wrong and unjudged == {5} and key[5] == 10 and state[5] == NO_STATE, (wrong, key, state)
    _, _, positional, _ = _run(steps, 1, 0, 2, 1, by_position=True)
    assert positional and "keyed at 10 holds 11" in positional[-1], positional


def test_reading_by_position_lands_on_the_null_block() -> None:
    """The finding's steps through the same model: vLLM 0.33.0's runner, reading and writing the
    step's own running page, writes the state into a null entry once the table is longer than the
    step; the table's running entry holds it."""
    steps = [(8, 0), (1, 8), (1, 0)]
    _, _, wrong, _ = _run(steps, 4, 0, 4, 0, by_position=True)
    assert wrong and "null entry 2" in wrong[0], wrong
    assert not _run(steps, 4, 0, 4, 0)[2]


def test_several_real_tokens_after_drafts_pass_a_page() -> None:
    """What vLLM's scheduler never sends: after a step with drafts, several real tokens in one
    step. The page the drafts' step ran in is passed, and its positional key would name a state
    it never held -- the rule says so (passed_pages), and the paged store leaves it unjudged."""
    # Block 2: after 4 tokens, one token with two drafts runs in entry 3 (T = 7, the state after 5
    # tokens); four real tokens then run from 5 to 9, past that page's boundary at 8.
    steps = [(4, 0), (1, 2), (4, 0)]
    _, key, wrong, _ = _run(steps, 2, 0, 2, 0)
    assert wrong[0] == "step 5 -> 9 passes entry 3 of [-1, -1, -1, 1, 2]", wrong
    assert "page 1 keyed at 8 holds 5" in wrong, (key, wrong)
    assert not _run([(4, 0), (1, 2), (1, 0), (1, 0), (1, 0), (1, 0)], 2, 0, 2, 0)[2]  # one token a step


def test_a_checkpoint_in_a_page_drafts_left_is_left_without_a_state() -> None:
    """What vLLM's scheduler never sends: several real tokens right after a step with drafts, with
    a checkpoint. Block 1, alignment 2: after 4 tokens, one token with two drafts grows the table
    to entry 6; the next step, 5 -> 8, exports its checkpoint at 6 into entry cdiv(8, 1) - 2 = 6,
    a page the drafts left, so the manager reserves none there (checkpoint_entry_free) and keys
    the page at its boundary, 7. The state after 6 there would break that key; the rule leaves the
    page without a state, and a checkpoint on the boundary itself would keep it."""
    before = (True,) * 5 + (False,) * 2  # the table the manager saw: entries 5 (running) and 6 (drafts)
    assert not mamba.checkpoint_entry_free(6, before, True, 0) and mamba.checkpoint_entry_free(7, before, True, 0)
    assert mamba.checkpoint_entry_free(6, before, True, 1)  # a speculative page moves away: free
    is_null = (True,) * 5 + (False,) * 3
    assert mamba.step_states(is_null, (False,) * 8, 8, 8, 1, 0, 6, False) == ((7, 8), (6, NO_STATE))
    assert mamba.step_states(is_null, (False,) * 8, 8, 8, 1, 0, 6, True) == ((7, 8), (6, 6))
    assert mamba.step_states(is_null, (False,) * 8, 8, 8, 1, 0, 7, False) == ((7, 8), (6, 7))
    steps = [(4, 0), (1, 2), (3, 0)]
    state, key, wrong, unjudged = _run(steps, 1, 0, 2, 1)
    assert wrong == ["step 5 -> 8 passes entry 5 of [-1, -1, -1, -1, -1, 2, 3, 4]"], wrong
    assert key[3] == 7 and state[3] == NO_STATE and 3 in unjudged, (key, state)
