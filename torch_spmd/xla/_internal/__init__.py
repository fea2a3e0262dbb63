"""``torch_xla._internal`` under ``torch_spmd.xla.install()``: only ``tpu``, which reports that there
is no TPU (torch_spmd emulates its devices; ``xr.device_type()`` is ``'SPMD'``)."""
