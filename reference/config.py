"""The manager's configuration (spec chapter ``config``)."""

from __future__ import annotations

import attrs

from kvoracle.spec.config import validate_config


@attrs.frozen
class ManagerConfig:
    """One full-attention KV-cache group over a pool of ``num_blocks`` blocks.

    Construction validates the values (KV-CFG-001, KV-CFG-002, KV-CFG-003, KV-CFG-004) and
    raises
    :class:`kvoracle.spec.ConfigError` naming the parameter and the rule.
    """

    num_blocks: int
    block_size: int
    max_model_len: int
    hash_block_size: int = attrs.field()
    enable_caching: bool = True
    use_eagle: bool = False

    @hash_block_size.default
    def _hash_block_size_default(self) -> int:
        return self.block_size

    def __attrs_post_init__(self) -> None:
        validate_config(self.num_blocks, self.block_size, self.max_model_len,
                        self.hash_block_size, single_group_caching=self.enable_caching)
