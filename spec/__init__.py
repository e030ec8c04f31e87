"""kvoracle.spec -- the normative specification of paged KV-cache managers.

One module per chapter; each module's docstring is the chapter's prose. Every
rule has a permanent ID ``KV-<AREA>-<NNN>`` registered in :mod:`.registry`.
Pure functions with flat arguments state the rules that can be stated; their
icontract conditions are what CrossHair checks. This package does no I/O and
imports no torch.
"""

from . import block_pool, config, full_attention, hashing, lifecycle
from .config import ConfigError, validate_config
from .registry import Rule, all_rules, get_rule

CHAPTERS = (config, hashing, block_pool, full_attention, lifecycle)

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
    "lifecycle",
    "validate_config",
]
