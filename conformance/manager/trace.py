"""Prompts shaped like a real serving workload: the Mooncake FAST'25 conversation trace.

The manager suite's own prompts come from a tiny alphabet, so that unrelated requests
collide and every corner of the cache is reached. A serving engine sees another shape: every
request opens with the same system block, and a request that continues a conversation repeats
the earlier turn's prompt, all of it but the part-filled last block, and then adds its own
blocks. ``mooncake_conversations.json`` keeps that shape from the trace
(scripts/derive_mooncake_workload.py): conversations of one to a few turns, each turn its
512-token blocks as ids local to the conversation, 0 being the shared first block.

An example of the ``mooncake`` part of the manager suite draws its prompts from there: each
new request is the next turn of the conversation under way, or the first turn of another one
(the trace's own mix: most conversations are one turn). A trace block becomes
``block_size`` equal tokens, and a prompt's last block only as many of them as the trace's
last block is full; prompts are cut to the model length.
"""

from __future__ import annotations

import functools
import json
import math
from importlib import resources

from hypothesis import strategies as st

#: Token ids of different conversations never meet (a conversation has far fewer blocks).
CONVERSATION_STRIDE = 4096


@functools.cache
def conversations() -> tuple[tuple[tuple[tuple[int, ...], float], ...], ...]:
    """Each conversation's turns as (block ids, fill of the last block)."""
    text = resources.files(__package__).joinpath("mooncake_conversations.json").read_text()
    return tuple(tuple((tuple(turn["blocks"]), float(turn["last_block_fill"])) for turn in conversation)
                 for conversation in json.loads(text)["conversations"])


def turn_tokens(conversation: int, blocks: tuple[int, ...], last_block_fill: float, block_size: int,
                limit: int) -> tuple[int, ...]:
    """A turn's prompt: ``block_size`` tokens per block (the shared first block is token 0,
    every other block a token of its own conversation), the last block filled as in the trace,
    at most ``limit`` tokens and at least one."""
    tokens: list[int] = []
    for position, block in enumerate(blocks):
        token = 0 if block == 0 else 1 + conversation * CONVERSATION_STRIDE + block
        count = block_size if position < len(blocks) - 1 else max(1, math.ceil(last_block_fill * block_size))
        tokens.extend([token] * count)
    return tuple(tokens[:limit]) or (0,)


class Conversations:
    """Where an example stands in the trace: the conversation under way and its next turn."""

    def __init__(self) -> None:
        self.current: int | None = None
        self.next_turn = 0

    def next_prompt(self, data: st.DataObject, block_size: int, limit: int) -> tuple[int, ...]:
        known = conversations()
        going_on = self.current is not None and self.next_turn < len(known[self.current])
        if not going_on or data.draw(st.integers(0, 3), label="another conversation") == 0:
            self.current = data.draw(st.integers(0, len(known) - 1), label="conversation")
            self.next_turn = 0
        assert self.current is not None
        blocks, fill = known[self.current][self.next_turn]
        self.next_turn += 1
        return turn_tokens(self.current, blocks, fill, block_size, limit)
