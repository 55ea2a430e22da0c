"""The protocols of a cluster, one module each, named like the coordinator's and the
worker's rooms of the same protocol: each declares its messages (and the rows inside them)
and what the protocol keeps (``rounds``: the round manifest). ``sfaas.runtime.wire``
registers and encodes the messages."""
