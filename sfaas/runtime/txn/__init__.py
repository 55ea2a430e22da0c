"""The transaction core shared by workers and :class:`sfaas.testing.LocalRunner`.

``epochs`` is the pure logic (tids, conflict detection, commit decisions; no I/O);
``engine`` executes user functions against one worker's partitions of state.
"""
