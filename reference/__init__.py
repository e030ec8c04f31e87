"""kvoracle.reference -- the reference KV-cache manager.

attrs classes that read like the specification: :class:`KVCacheBlock`,
:class:`FreeBlockQueue`, :class:`BlockPool`, the hybrid coordinator's lookups
(:mod:`.hybrid`), one :class:`SingleTypeManager` per KV-cache group, the one
:class:`KVCacheManager` over them (a single full-attention group, :class:`ManagerConfig`,
is its unitary case) and :class:`Request`. Their icontract pre/postconditions and invariants cite the
rule IDs they check; set ``KVORACLE_CONTRACTS=0`` before import to switch them
off for speed (see :mod:`.contracts`).
"""

from .block import CacheKey, KVCacheBlock
from .block_pool import BlockPool
from .config import ManagerConfig
from .contracts import ENABLED as CONTRACTS_ENABLED
from .free_queue import FreeBlockQueue
from .hybrid import HybridConfig, HybridCoordinator
from .manager import KVCacheBlocks, KVCacheManager, group_kinds, groups_config
from .request import Request, RequestStatus
from .single_type import SingleTypeManager

__all__ = [
    "CONTRACTS_ENABLED",
    "BlockPool",
    "CacheKey",
    "FreeBlockQueue",
    "HybridConfig",
    "HybridCoordinator",
    "KVCacheBlock",
    "KVCacheBlocks",
    "KVCacheManager",
    "ManagerConfig",
    "Request",
    "RequestStatus",
    "SingleTypeManager",
    "group_kinds",
    "groups_config",
]
