"""pytest-benchmark entry points: put and get per engine and peer, small sizes.

``python -m pytest benchmarks -p no:cacheprovider --benchmark-only``. One benchmarked call
is ``OPS`` operations (``extra_info`` has the ops/s); the full comparison with latency
percentiles, memory, reopen and snapshots is ``python -m benchmarks.stores``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .adapters import ENGINES, Handle, spec
from .workloads import Workload

N_KEYS = 10_000
OPS = 5_000
#: LMDB's default fsyncs every commit (~0.3 ms here); fewer ops keep the file fast.
SLOW_PUT_OPS = {"lmdb": 500}


@pytest.fixture(scope="module", params=["uniform", "zipf"])
def workload(request: pytest.FixtureRequest) -> Workload:
    return Workload.build(request.param, N_KEYS, OPS, seed=7)


@pytest.fixture(params=list(ENGINES))
def loaded(request: pytest.FixtureRequest, tmp_path: object, workload: Workload) -> Iterator[tuple[str, Handle, Workload]]:
    name = request.param
    h = spec(name).opener(str(tmp_path))
    h.load(workload.load_pairs())
    yield name, h, workload
    h.close()


def test_put(benchmark: object, loaded: tuple[str, Handle, Workload]) -> None:
    name, h, w = loaded
    n = SLOW_PUT_OPS.get(name, OPS)
    keys, vals = w.put_keys[:n], w.put_values[:n]
    put = h.put

    def run() -> None:
        for k, v in zip(keys, vals, strict=True):
            put(k, v)

    benchmark.pedantic(run, rounds=5, iterations=1, warmup_rounds=1)  # type: ignore[attr-defined]
    benchmark.extra_info["ops_per_call"] = n  # type: ignore[attr-defined]
    benchmark.extra_info["ops_per_s"] = n / benchmark.stats.stats.median  # type: ignore[attr-defined]
    assert h.get(keys[-1]) is not None


def test_get(benchmark: object, loaded: tuple[str, Handle, Workload]) -> None:
    _name, h, w = loaded
    keys = w.get_keys[:OPS]
    get = h.get

    def run() -> None:
        for k in keys:
            get(k)

    benchmark.pedantic(run, rounds=5, iterations=1, warmup_rounds=1)  # type: ignore[attr-defined]
    benchmark.extra_info["ops_per_call"] = OPS  # type: ignore[attr-defined]
    benchmark.extra_info["ops_per_s"] = OPS / benchmark.stats.stats.median  # type: ignore[attr-defined]
    missing = [k for k in keys if get(k) is None]
    assert not missing, f"{len(missing)} loaded keys not found, e.g. {missing[:3]}"
