"""Deterministic simulation parts: a simulated Kafka, object store and event-loop clock.

Not imported by ``import sfaas``; see sfaas/sim/README.md."""
