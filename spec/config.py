"""Chapter 0 -- Configuration.

A KV-cache manager is configured by a handful of integers: the number of
physical blocks in the pool (``num_blocks``), the number of tokens a block
holds (``block_size``), the longest sequence the model accepts
(``max_model_len``) and the granularity at which request tokens are hashed
(``hash_block_size``). Two switches complete it: whether prefix caching is on
(``enable_caching``) and whether an EAGLE-style drafter needs the last cached
block recomputed (``use_eagle``).

Some combinations are impossible. kvoracle rejects them before any engine sees
them, with a :class:`ConfigError` that names the parameter and the rule, so a
user who typed a bad value learns which one and why.
"""

from __future__ import annotations

import icontract

from .contracts import ENABLED
from .registry import INPUT_VALIDATION, defines, rule

CHAPTER = "config"

KV_CFG_001 = rule(
    "KV-CFG-001",
    "A pool has the null block and at least one usable block",
    """num_blocks must be at least 2: block 0 is reserved as the null block, so a
    pool of one block could never hold a token.""",
    source="vllm/v1/core/block_pool.py BlockPool.__init__ (asserts num_gpu_blocks > 0 and "
    "pops block 0 as the null block)",
    chapter=CHAPTER,
    kind="validation",
    spec_only=INPUT_VALIDATION,
)
KV_CFG_002 = rule(
    "KV-CFG-002",
    "Block size is positive",
    "block_size must be a positive number of tokens.",
    source="vllm/v1/kv_cache_interface.py KVCacheSpec.block_size",
    chapter=CHAPTER,
    kind="validation",
    spec_only=INPUT_VALIDATION,
)
KV_CFG_003 = rule(
    "KV-CFG-003",
    "max_model_len is positive",
    "max_model_len must be a positive number of tokens.",
    source="vllm/v1/core/kv_cache_manager.py KVCacheManager.__init__",
    chapter=CHAPTER,
    kind="validation",
    spec_only=INPUT_VALIDATION,
)
KV_CFG_004 = rule(
    "KV-CFG-004",
    "The hash block size divides the block size",
    """hash_block_size must be positive and divide block_size. With a single KV-cache
    group and prefix caching on, the two are equal (the unitary coordinator asserts
    hash_block_size == block_size).""",
    source="vllm/v1/core/kv_cache_coordinator.py UnitaryKVCacheCoordinator.__init__; "
    "kv_cache_utils.py BlockHashListWithBlockSize",
    chapter=CHAPTER,
    kind="validation",
    spec_only=INPUT_VALIDATION,
)
KV_CFG_005 = rule(
    "KV-CFG-005",
    "Token counts are never negative",
    """Every token count handed to the manager (new tokens, lookahead tokens, hit
    lengths, prompt lengths) is a non-negative integer.""",
    source="vllm/v1/core/kv_cache_manager.py KVCacheManager.allocate_slots",
    chapter=CHAPTER,
    kind="validation",
    spec_only=INPUT_VALIDATION,
)


class ConfigError(ValueError):
    """An impossible configuration or argument; names the parameter and the rule."""

    def __init__(self, rule_id: str, parameter: str, message: str) -> None:
        super().__init__(f"{rule_id}: {parameter}: {message}")
        self.rule_id = rule_id
        self.parameter = parameter


@icontract.ensure(lambda result: result in ("", "num_blocks", "block_size", "max_model_len",
                                            "hash_block_size"), enabled=ENABLED)
@defines(KV_CFG_001, KV_CFG_002, KV_CFG_003, KV_CFG_004)
def first_invalid_parameter(
    num_blocks: int,
    block_size: int,
    max_model_len: int,
    hash_block_size: int,
    single_group_caching: bool,
) -> str:
    """Name of the first impossible parameter, or ``""`` when the config is valid."""
    if num_blocks < 2:
        return "num_blocks"
    if block_size <= 0:
        return "block_size"
    if max_model_len <= 0:
        return "max_model_len"
    if hash_block_size <= 0 or block_size % hash_block_size != 0:
        return "hash_block_size"
    if single_group_caching and hash_block_size != block_size:
        return "hash_block_size"
    return ""


_PARAMETER_RULES = {
    "num_blocks": (KV_CFG_001, "must be >= 2 (block 0 is the null block)"),
    "block_size": (KV_CFG_002, "must be > 0"),
    "max_model_len": (KV_CFG_003, "must be > 0"),
    "hash_block_size": (
        KV_CFG_004,
        "must be > 0 and divide block_size (and equal it for one group with caching)",
    ),
}


def validate_config(
    num_blocks: int,
    block_size: int,
    max_model_len: int,
    hash_block_size: int,
    single_group_caching: bool = True,
) -> None:
    """Raise :class:`ConfigError` for the first impossible parameter."""
    values = {
        "num_blocks": num_blocks,
        "block_size": block_size,
        "max_model_len": max_model_len,
        "hash_block_size": hash_block_size,
    }
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(_PARAMETER_RULES[name][0], name, f"must be an int, got {value!r}")
    bad = first_invalid_parameter(
        num_blocks, block_size, max_model_len, hash_block_size, single_group_caching
    )
    if bad:
        rule_id, why = _PARAMETER_RULES[bad]
        raise ConfigError(rule_id, bad, f"{why}; got {values[bad]}"
                          + (f" with block_size={block_size}" if bad == "hash_block_size" else ""))


def require_non_negative(parameter: str, value: int) -> None:
    """KV-CFG-005: raise :class:`ConfigError` for a negative token count."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(KV_CFG_005, parameter, f"must be a non-negative int, got {value!r}")
