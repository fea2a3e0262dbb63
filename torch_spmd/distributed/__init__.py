"""Distributed APIs of torch_spmd (``torch_spmd.distributed.spmd``: the sharding annotations)."""
