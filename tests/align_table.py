"""One request's align-mode Mamba table, built step by step from the spec's functions alone (the
manager's half of a step), for tests that follow a request's life without an engine."""

from __future__ import annotations

from kvoracle.spec import mamba
from kvoracle.spec.mamba import NEW, NULL


class AlignTable:
    """The table (page ids, -1 for the null block; pages numbered as they are taken) and what the
    manager remembers between steps: the retired entries and the last state's entry."""

    def __init__(self, block_size: int, speculative: int, alignment: int, checkpoint_alignment: int,
                 eagle: bool = False) -> None:
        self.block_size, self.speculative, self.alignment = block_size, speculative, alignment
        self.checkpoint_alignment, self.eagle = checkpoint_alignment, eagle
        self.entries: list[int] = []
        self.retired = 0
        self.last_state = -1
        self.pages = 0
        self.allocated = False

    def is_null(self) -> tuple[bool, ...]:
        return tuple(page < 0 for page in self.entries)

    def allocate(self, computed: int, end: int) -> int:
        """A step from ``computed`` to ``end`` main tokens: free the entries the request no longer
        needs (KV-MAMBA-012), then lay the table out for the step (KV-MAMBA-004 .. 006). Returns
        the reserved checkpoint's position (0: none)."""
        size, table = self.block_size, self.entries
        for index in mamba.align_blocks_to_free(self.is_null(), self.retired, computed, size):
            table[index] = -1
        self.retired = mamba.retired_after(self.retired, computed, size, len(table))
        if mamba.frees_last_state(self.last_state, computed, size, self.is_null()):
            table[self.last_state] = -1
        position = mamba.reserved_checkpoint(bool(self.checkpoint_alignment), self.checkpoint_alignment, computed,
                                             end, self.alignment, size, size, self.eagle, self.is_null(),
                                             self.allocated, self.speculative)
        layout = mamba.align_layout(len(table), end, size, self.speculative, position > 0, self.allocated)
        if len(layout) > len(table) or position:
            self.last_state = len(table) - 1 - self.speculative if self.allocated else len(table) - 1
        self.entries = []
        for entry in layout:
            if entry == NEW:
                self.entries.append(self.pages)
                self.pages += 1
            else:
                self.entries.append(-1 if entry == NULL else table[entry])
        self.allocated = True
        return position
