"""The remotes' contract (tests/remotes/test_contract.py, every test of it) run against the
simulated object store, ``sfaas.sim.objects.SimRemote``: the same assertions PathRemote and
a real MinIO pass."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from remotes import Remote
from sfaas.sim.objects import SimObjectStore
from tests.remotes import test_contract as contract

# (pytest collects these here, with the fixture below in place of the contract's own)
globals().update({name: fn for name, fn in vars(contract).items() if name.startswith("test_")})


@pytest.fixture
def remote() -> Iterator[Remote]:
    store = SimObjectStore()
    r = store.remote("bank/accounts/p0")
    try:
        yield r
    finally:
        r.destroy()
        r.close()
