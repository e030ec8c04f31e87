"""The prefix-tree suite's paged KV store (conformance/engines/prefix_tree_store.py) without SGLang.

kvoracle's reference tree in the store passes every rule, the data rules KV-DATA-001 .. 004
and the state slots' KV-DATA-007 with checks; broken model runners and broken trees in the store
are convicted of the data rule they break (the store's verdicts come before the suite's own), with
replays that keep failing;
the store's own verdicts on fixed cases; bad input refused naming the parameter.
"""

from __future__ import annotations

import pytest
from broken_tree_engines import NamespaceLeak, SlotsReversed
from tree_meta import assert_convicted, outcomes, run

from kvoracle.conformance.engines.prefix_tree_store import PagedReferenceTree, PagedTreeStore
from kvoracle.conformance.prefix_tree import MAMBA_RULES, WINDOW_RULES, ReferencePrefixTree, TreeSetup
from kvoracle.gpu import torch
from kvoracle.spec import data_integrity as data_spec

DATA_RULES = ("KV-DATA-001", "KV-DATA-002", "KV-DATA-003", "KV-DATA-004", "KV-DATA-007")


def test_the_reference_in_the_store_passes_every_rule_with_data_checks():
    result = run(PagedReferenceTree, max_rounds=1)
    found = outcomes(result)
    assert result.ok, found
    assert found.pop("KV-TREE-009") == "not-applicable"
    assert found.pop("KV-TREE-029") == "not-applicable"  # page recency: its window KV's order is KV-TREE-028
    assert set(found.values()) == {"pass"}, found
    # The window and state components are the reference's: their rules are judged, window KV and states
    # in the store.
    for rule_id in (*DATA_RULES, *(r for r in WINDOW_RULES if r != "KV-TREE-029"), *MAMBA_RULES):
        outcome = result.verdicts.outcomes[rule_id]
        assert outcome.outcome == "pass" and outcome.checks > 0, (rule_id, outcome.outcome, outcome.checks)
    assert result.verdicts.outcomes["KV-DATA-005"].not_applicable  # vLLM's null block: not a tree's rule


# -- broken model runners ------------------------------------------------------------------------------
class ShiftedRunner(PagedReferenceTree):
    """The forward pass writes every token into the next position's slot (an off-by-one slot
    mapping)."""

    name = "paged-shifted-runner"

    def write_row(self, slots):
        return torch.tensor((*slots[1:], -1), dtype=torch.int64, device=self.device)


class SaltlessRunner(PagedReferenceTree):
    """The forward pass writes every namespace's tokens as namespace 0's (the salt dropped)."""

    name = "paged-saltless-runner"

    def forward(self, handle, namespace, tokens, slots, start):
        super().forward(handle, 0, tokens, slots, start)
        self.held[handle].namespace = namespace  # what the request itself expects to read


class StaleStateRunner(PagedReferenceTree):
    """The recurrent layers never fold a request's computed tokens into its state: an insertion's state
    slot gets the state the request resumed from (its hit's, or its namespace's seed)."""

    name = "paged-stale-state-runner"

    def request_state(self, handle, namespace, tokens):
        resumed = self.resumed.get(handle)
        return resumed[3] if resumed is not None else data_spec.prefix_seed(None)


class LastWindowRunner(PagedReferenceTree):
    """The window layers write the KV of a forward pass's last ``W`` tokens only (all the request
    itself attends to next), while the cache goes on listing the pages before them with their
    window KV."""

    name = "paged-last-window-runner"

    def write_window(self, slots, positions, values):
        keep = positions >= len(slots) - self.window
        super().write_window(slots, positions[keep], values[keep])


# -- broken trees in the store: the data is judged before the indices ----------------------------------
class PagedSlotsReversed(PagedTreeStore):
    name = "paged-slots-reversed"

    def __init__(self):
        super().__init__(SlotsReversed())


class PagedNamespaceLeak(PagedTreeStore):
    name = "paged-namespace-leak"

    def __init__(self):
        super().__init__(NamespaceLeak())


class EvictFreesParent(ReferencePrefixTree):
    """``evict`` gives back the slots of each removed page's parent, when the parent stays held,
    instead of the page's own: the counts balance, the page's slots leak, and the parent's are
    handed out again while the cache still names them."""

    name = "evict-frees-parent"

    def evict(self, num_tokens):
        pages = {key: page.slots for key, page in self.tree.pages.items()}
        removed = self.tree.evict(num_tokens)
        for key in removed:
            parent = self.tree.parent(key)
            self.allocator.free(pages[parent] if parent in self.tree.pages else pages[key])
        return len(removed) * self.tree.page_size


class PagedEvictFreesParent(PagedTreeStore):
    name = "paged-evict-frees-parent"

    def __init__(self):
        super().__init__(EvictFreesParent())


@pytest.mark.parametrize(("broken", "rule_id"), [
    (ShiftedRunner, "KV-DATA-003"),
    (SaltlessRunner, "KV-DATA-003"),
    (PagedSlotsReversed, "KV-DATA-001"),
    (PagedNamespaceLeak, "KV-DATA-001"),
    (PagedEvictFreesParent, "KV-DATA-004"),
    (LastWindowRunner, "KV-DATA-004"),
    (StaleStateRunner, "KV-DATA-007"),
], ids=lambda value: getattr(value, "name", value))
def test_broken_runner_or_tree_in_the_store_is_convicted_of_its_data_rule(broken, rule_id):
    assert_convicted(broken, rule_id)


# -- fixed cases ------------------------------------------------------------------------------------------
def _served(store: PagedTreeStore, handle: int, tokens: tuple[int, ...], namespace: int = 0) -> tuple[int, ...]:
    """A request served as the driver serves one: match, lock, alloc, forward, insert, free, unlock."""
    hit, slots = store.match(handle, namespace, tokens)
    store.lock(handle)
    size = store.setup.page_size
    own = store.alloc(-(-len(tokens) // size) * size - hit)
    row = (*slots, *own)
    store.forward(handle, namespace, tokens, row, hit)
    held = store.insert(handle, namespace, tokens, row[:len(tokens)])
    duplicates = row[hit:held]
    if duplicates:
        store.free(duplicates)
    tail = row[len(tokens) // size * size:]
    if tail:
        store.free(tail)
    store.unlock(handle)
    return row


def _failed(store: PagedTreeStore) -> list[tuple[str, str]]:
    return [(rule_id, message) for rule_id, ok, message in store.observe().data_checks if not ok]


def test_a_hit_reads_the_prefix_and_a_write_into_a_held_slot_is_an_overwrite():
    store = PagedReferenceTree()
    store.configure(TreeSetup(2, 8, ()))
    _served(store, 1, (1, 2, 3, 4, 5))
    hit, slots = store.match(2, 0, (1, 2, 3, 4, 9))
    assert hit == 4 and _failed(store) == []
    store.lock(2)
    # Someone writes into the second slot of the locked hit: the request relies on it (KV-DATA-003),
    # and the page the cache holds there no longer holds its prefix (KV-DATA-004).
    store.store.write(0, torch.tensor([slots[1]]), torch.tensor([0]), torch.tensor([99]))
    failed = _failed(store)
    assert [rule_id for rule_id, _ in failed] == ["KV-DATA-003", "KV-DATA-004"], failed
    assert "position 1 (token 2, given by the cache" in failed[0][1]


def test_namespaces_write_different_values_and_a_finished_request_relies_on_nothing():
    store = PagedReferenceTree()
    store.configure(TreeSetup(1, 8, ()))
    first = _served(store, 1, (1, 2), namespace=0)
    second = _served(store, 2, (1, 2), namespace=1)
    values = store.store.values[0][:, 0]
    assert values[list(first)].tolist() != values[list(second)].tolist()
    assert store.held == {} and _failed(store) == []


def test_a_slot_freed_and_written_again_is_not_read_as_a_hit():
    """A page the cache forgot is reused; a cache that still answered it would read other data."""
    store = PagedReferenceTree()
    store.configure(TreeSetup(1, 2, ()))
    row = _served(store, 1, (1, 2))
    assert store.evict(2) == 2
    _served(store, 2, (7, 8))
    found = store.store.values[0][list(row), 0].tolist()
    assert sorted(found) == sorted(store._values(0, (7, 8)))  # the allocator's order, whichever
    # The wrapper judges a hit on those slots as another prefix's data (what a stale cache would answer).
    checks = store._check_hit(3, 0, (1, 2), 2, tuple(row))
    assert [rule_id for rule_id, ok, _ in checks if not ok] == ["KV-DATA-001"], checks


def test_forward_refuses_a_start_outside_the_tokens():
    store = PagedReferenceTree()
    store.configure(TreeSetup(1, 4, ()))
    with pytest.raises(ValueError, match="start"):
        store.forward(1, 0, (1, 2), (0, 1), 3)


def test_the_wrapper_claims_kv_data_and_names_itself():
    wrapped = PagedTreeStore(ReferencePrefixTree(), device="cpu")
    assert wrapped.name == "reference+paged-store" and wrapped.capabilities().kv_data
    assert PagedReferenceTree().name == "paged-reference"


def test_a_hit_reads_its_windows_kv_from_the_window_slots():
    """With a window component the forward pass writes window KV too; a hit's last window is read
    from there, and a page listed with window KV that lost it is KV-DATA-004's."""
    store = PagedReferenceTree()
    store.configure(TreeSetup(1, 8, (), window=2))
    row = _served(store, 1, (1, 2, 3, 4))
    window = store.store.values[1][:, 0]
    assert window[list(row)].tolist() == list(store._values(0, (1, 2, 3, 4)))
    hit, slots = store.match(2, 0, (1, 2, 3, 9))
    assert hit == 3 and _failed(store) == []
    # The window KV of the hit's last token is gone: the full KV is intact, the window layers would
    # read other data.
    store.store.write(1, torch.tensor([slots[2]]), torch.tensor([0]), torch.tensor([99]))
    checks = store._check_hit(2, 0, (1, 2, 3, 9), 3, slots)
    failed = [(rule_id, message) for rule_id, ok, message in checks if not ok]
    assert [rule_id for rule_id, _ in failed] == ["KV-DATA-001"] and "window KV of position 2" in failed[0][1]
    assert [rule_id for rule_id, _ in _failed(store)] == ["KV-DATA-004"]
    # Before the hit's window nothing is read: the first token's window KV may go (a tombstone).
    store.store.write(1, torch.tensor([slots[2]]), torch.tensor([0]), torch.tensor([store._values(0, (1, 2, 3))[2]]))
    store.store.write(1, torch.tensor([slots[0]]), torch.tensor([0]), torch.tensor([99]))
    assert store._check_hit(2, 0, (1, 2, 3, 9), 3, slots)[0][1]


def test_a_hit_reads_its_state_from_the_state_slot_and_a_stale_slot_is_a_state_data_fault():
    """With a state component the insertion's state slot gets the state after its key, a hit reads the
    state slot at its end back (KV-DATA-007), and the request's next insertion folds its own tokens into
    what it read."""
    store = PagedReferenceTree()
    store.configure(TreeSetup(1, 8, (), states=3))
    _served(store, 1, (1, 2))
    slot = store.inner.state_slot_of[(0, (1, 2))]
    want = data_spec.state_after(data_spec.prefix_seed(None), (1, 2), 0)
    assert int(store.store.values[store.state_group][slot, 0]) == want
    assert store.match(2, 0, (1, 2, 3))[0] == 2 and store.inner.state_slot(2) == slot and _failed(store) == []
    # Someone writes into the hit's state slot: the next lookup reads another state, and the page the
    # cache holds with that state no longer holds the state after its tokens.
    store.store.write(store.state_group, torch.tensor([slot]), torch.tensor([0]), torch.tensor([99]))
    assert store.match(3, 0, (1, 2, 3))[0] == 2
    failed = _failed(store)
    assert [rule_id for rule_id, _ in failed] == ["KV-DATA-007", "KV-DATA-007"], failed
    assert f"state slot {slot} to resume from" in failed[0][1] and "page [1, 2]" in failed[1][1]
    # A request resuming from that wrong state writes a wrong state after its own tokens too.
    store.lock(3)
    own = store.alloc(1)
    store.forward(3, 0, (1, 2, 3), (*store.found[3][2], *own), 2)
    store.insert(3, 0, (1, 2, 3), (*store.found[3][2], *own))
    written = store.inner.state_slot_of[(0, (1, 2, 3))]
    assert int(store.store.values[store.state_group][written, 0]) == data_spec.state_after(99, (1, 2, 3), 2)
