"""State-store benchmarks: our engines vs RocksDB, LevelDB and LMDB in one run.

Run ``python -m benchmarks.stores [--quick]``; see ``benchmarks/README.md``.
"""
