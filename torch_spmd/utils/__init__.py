"""Utilities mirroring ``torch_xla.utils``: activation checkpointing (``checkpoint``)."""
