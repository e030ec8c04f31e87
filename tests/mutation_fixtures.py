"""Small functions for tests/test_mutation.py to mutate (a stand-in for an engine's code)."""

from __future__ import annotations

LIMIT = 3


def below_limit(value: int) -> bool:
    return value < LIMIT


class Pool:
    def __init__(self) -> None:
        self.ref_cnt = 0

    def touch(self) -> int:
        self.ref_cnt += 1
        return self.ref_cnt

    @staticmethod
    def order(blocks: list[int]) -> list[int]:
        return list(blocks)


class CountingPool(Pool):
    def touch(self) -> int:
        return super().touch() * 10
