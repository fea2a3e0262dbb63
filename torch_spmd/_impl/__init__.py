"""The private floor of torch_spmd: what every other module may read, importing nothing of the
package above it (test_package_layering.py). The spmd device and the emulated device set
(``device``), the step boundary (``step``), the multi-process world this process belongs to
(``world``: state only; ``process_world`` joins and leaves it), the launcher's environment
(``launcher_env``), multi-process SPMD (``process_span``), device tiles (``tiles``), the
optimization barrier (``barriers``), intra-op threads (``threads``) and the hardware presets
(``hardware``, public as ``torch_spmd.plan.hardware``)."""
