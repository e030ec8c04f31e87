"""kvoracle.spec -- the normative specification of paged KV-cache managers.

One module per chapter; each module's docstring is the chapter's prose. Every
rule has a permanent ID ``KV-<AREA>-<NNN>`` registered in :mod:`.registry`.
Pure functions with flat arguments state the rules that can be stated; their
icontract conditions are what CrossHair checks. This package does no I/O and
imports no torch.
"""

from . import (
    block_pool,
    chunked_local,
    config,
    cross_attention,
    data_integrity,
    external_store,
    full_attention,
    hashing,
    hybrid,
    hybrid_lifecycle,
    kv_cache_spec,
    lifecycle,
    mamba,
    prefix_tree,
    sliding_window,
)
from .config import ConfigError, validate_config
from .registry import Rule, all_rules, get_rule

CHAPTERS = (config, kv_cache_spec, hashing, block_pool, full_attention, lifecycle, sliding_window,
            chunked_local, mamba, cross_attention, hybrid, hybrid_lifecycle,
            data_integrity, external_store, prefix_tree)

__all__ = [
    "CHAPTERS",
    "ConfigError",
    "Rule",
    "all_rules",
    "block_pool",
    "config",
    "full_attention",
    "get_rule",
    "hashing",
    "kv_cache_spec",
    "lifecycle",
    "validate_config",
]
