"""Example sfaas apps: ``bank``, ``ycsbt``, ``cart`` (run with ``sfaas up examples.bank:app``)."""
