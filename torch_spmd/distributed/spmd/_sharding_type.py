"""``ShardingType`` and how a sharding's XLA text form maps to it."""
from enum import IntEnum
from typing import Optional


class ShardingType(IntEnum):
    """Kinds of sharding; the values are XLA's OpSharding.Type ids, as in PyTorch/XLA."""
    REPLICATED = 0
    MAXIMAL = 1
    TUPLE = 2
    TILED = 3
    MANUAL = 4
    PARTIAL = 5
    UNKNOWN = 6  # implicit replication


def sharding_type_of_spec(spec: str) -> Optional[ShardingType]:
    """The type of a sharding in XLA text form; None for ``""`` (no sharding)."""
    if not spec:
        return None
    if spec == "{replicated}":
        return ShardingType.REPLICATED
    if spec == "{manual}":
        return ShardingType.MANUAL
    if spec.startswith("{maximal"):
        return ShardingType.MAXIMAL
    if "last_tile_dim_replicate" in spec:
        return ShardingType.PARTIAL
    if spec.startswith("{devices="):
        return ShardingType.TILED
    return ShardingType.UNKNOWN
