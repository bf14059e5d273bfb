"""Benchmarks of aaren (docs/architecture.md section 6): they print tables and write them under
``bench/out``; they are never timed tests. Run them from the repository root as modules, e.g.
``python -m bench.layouts --quick`` or ``python -m bench.gpu_check``."""
