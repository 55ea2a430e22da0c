"""Benchmarks of sfaas: the state-store suite (``benchmarks.stores``) and the runtime's."""
