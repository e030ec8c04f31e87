"""The physical paged KV cache the block ids index (spec chapter ``data_integrity``).

One tensor ``[num_blocks, block_size]`` per KV-cache group holds a 64-bit stand-in
for each slot's KV (:func:`kvoracle.spec.data_integrity.slot_value`); a second one
of the same shape holds each slot's *write epoch*, the clock value of the write
that last changed it. Token position ``p`` of a request is slot ``p % block_size``
of block ``table[p // block_size]``: writes scatter through the block table and
reads gather through it, like a model runner's slot mapping. A position past the
end of the table has no slot; reading it gives :data:`UNWRITTEN` with an epoch
later than any write, so whoever relies on it sees its data gone.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvoracle.spec.data_integrity import UNWRITTEN

from . import default_device

#: The epoch reported for a position with no slot: later than every write.
NO_SLOT_EPOCH = torch.iinfo(torch.int64).max


class PagedKVStore:
    """Per-group slot values and write epochs on one device."""

    def __init__(self, num_blocks: int, block_sizes: Sequence[int],
                 device: torch.device | str | None = None) -> None:
        self.device = torch.device(device) if device is not None else default_device()
        self.num_blocks = num_blocks
        self.block_sizes = tuple(block_sizes)
        self.values = [torch.full((num_blocks, size), UNWRITTEN, dtype=torch.int64,
                                  device=self.device) for size in self.block_sizes]
        self.epochs = [torch.zeros((num_blocks, size), dtype=torch.int64, device=self.device)
                       for size in self.block_sizes]
        #: Incremented by every write; epoch 0 is "before any write".
        self.clock = 0

    def _slots(self, group: int, table: torch.Tensor, positions: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat slot index of each position, and which positions have a slot at all."""
        size = self.block_sizes[group]
        index = positions // size
        has_slot = (index < table.numel()) & (positions >= 0)
        blocks = table[index.clamp(0, max(table.numel() - 1, 0))] if table.numel() else \
            torch.zeros_like(index)
        has_slot &= (blocks >= 0) & (blocks < self.num_blocks)
        return blocks.clamp(0, self.num_blocks - 1) * size + positions % size, has_slot

    def write(self, group: int, table: torch.Tensor, positions: torch.Tensor,
              values: torch.Tensor) -> int:
        """Write ``values`` at ``positions`` through ``table``; return the epoch of the write.

        Only slots whose value changes get the new epoch: rewriting a slot with what it
        already holds (a token recomputed identically) is not an overwrite. Positions
        without a slot are not written. The arguments may live on any device (a runner's host
        tensors): they are moved to the store's, as :meth:`copy_blocks` moves its own.
        """
        self.clock += 1
        table, positions, values = table.to(self.device), positions.to(self.device), values.to(self.device)
        slots, has_slot = self._slots(group, table, positions)
        slots, values = slots[has_slot], values[has_slot]
        flat_values = self.values[group].view(-1)
        changed = flat_values[slots] != values
        flat_values[slots] = values
        self.epochs[group].view(-1)[slots[changed]] = self.clock
        return self.clock

    def read(self, group: int, table: torch.Tensor, positions: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """Values and write epochs at ``positions`` through ``table`` (gathered), on the store's
        device wherever the arguments live."""
        slots, has_slot = self._slots(group, table.to(self.device), positions.to(self.device))
        values = torch.where(has_slot, self.values[group].view(-1)[slots], UNWRITTEN)
        epochs = torch.where(has_slot, self.epochs[group].view(-1)[slots], NO_SLOT_EPOCH)
        return values, epochs

    def copy_blocks(self, sources: torch.Tensor, copies: torch.Tensor) -> int:
        """Copy whole blocks ``sources[i]`` into ``copies[i]`` in every group's tensor, all at once
        (every source is read before any copy is written), as vLLM's runner copies a step's blocks
        in every KV-cache tensor; return the epoch of the write. Slots whose value changes get it."""
        self.clock += 1
        sources, copies = sources.to(self.device), copies.to(self.device)
        for values, epochs in zip(self.values, self.epochs):
            taken = values[sources]  # gathered before the scatter: a copy never reads another's result
            changed = values[copies] != taken
            values[copies] = taken
            epochs[copies] = torch.where(changed, self.clock, epochs[copies])
        return self.clock

    def blocks(self, group: int, block_ids: torch.Tensor) -> torch.Tensor:
        """Whole blocks' values, ``[len(block_ids), block_size]``."""
        return self.values[group][block_ids]

    def state_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.values, *self.epochs))
