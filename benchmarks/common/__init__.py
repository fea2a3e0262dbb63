"""Helpers the benchmark scripts share (each script runs as `python benchmarks/<name>.py`, so
this package is importable as `common`): writing a section of docs/benchmarks.md, and the
repository's paths."""
