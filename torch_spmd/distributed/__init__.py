"""Distributed APIs of torch_spmd: ``torch_spmd.distributed.spmd`` (the sharding annotations)
and ``torch_spmd.distributed.xla_multiprocessing`` (multi-process mode: one process per
replica)."""
