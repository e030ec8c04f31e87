"""Transitional names: the hybrid manager is now :class:`~.manager.KVCacheManager`."""

from .manager import KVCacheManager as HybridKVCacheManager
from .single_type import SingleTypeManager as GroupTables

__all__ = ["GroupTables", "HybridKVCacheManager"]
