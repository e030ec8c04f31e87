"""kvoracle.reference -- the reference KV-cache manager.

attrs classes that read like the specification: :class:`KVCacheBlock`,
:class:`FreeBlockQueue`, :class:`BlockPool`, :class:`FullAttentionManager`,
the unitary and no-prefix-cache coordinators, :class:`KVCacheManager` and
:class:`Request`. Their icontract pre/postconditions and invariants cite the
rule IDs they check; set ``KVORACLE_CONTRACTS=0`` before import to switch them
off for speed (see :mod:`.contracts`).
"""

from .block import CacheKey, KVCacheBlock
from .block_pool import BlockPool
from .config import ManagerConfig
from .contracts import ENABLED as CONTRACTS_ENABLED
from .coordinator import NoPrefixCacheCoordinator, UnitaryCoordinator, make_coordinator
from .free_queue import FreeBlockQueue
from .full_attention import FullAttentionManager
from .manager import KVCacheBlocks, KVCacheManager
from .request import Request, RequestStatus

__all__ = [
    "CONTRACTS_ENABLED",
    "BlockPool",
    "CacheKey",
    "FreeBlockQueue",
    "FullAttentionManager",
    "KVCacheBlock",
    "KVCacheBlocks",
    "KVCacheManager",
    "ManagerConfig",
    "NoPrefixCacheCoordinator",
    "Request",
    "RequestStatus",
    "UnitaryCoordinator",
    "make_coordinator",
]
