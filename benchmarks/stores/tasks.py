"""The measurements. Each function runs inside a fresh child process (see ``child.py``).

Methodology (also in ``benchmarks/README.md``):

* **Throughput**: one ``perf_counter`` around a plain ``for`` loop over a precomputed list
  of ops (checked against the phase budget every 4096 ops); ops/s = ops / seconds.
* **Latency**: a separate pass in which *every* op is timed individually with
  ``perf_counter_ns`` (the timer's own cost, reported as ``timer_overhead_ns``, is not
  subtracted); p50/p99 over those samples.
* **Memory**: RSS (``/proc/self/statm``) of the child after loading and after the put and
  get phases, minus its RSS before opening the store (the workload lists already exist then).
* **Disk**: apparent bytes of the store directory after ``close()``.
"""

from __future__ import annotations

import cProfile
import gc
import importlib
import io
import os
import pstats
import shutil
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .adapters import Handle, dir_bytes, spec
from .workloads import KEY_BYTES, VALUE_BYTES, Workload, make_keys, make_values

__all__ = ["run_kv", "run_build", "run_reopen", "run_snapshots", "run_profile", "rss_bytes"]

Emit = Callable[[str], None]
_CHUNK = 4096
_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    """Resident set size of this process."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def rss_anon_bytes() -> int:
    """Anonymous (private, not file-backed) resident memory: what the process itself holds,
    excluding mmap'd file pages, which the page cache can drop."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return rss_bytes()


def _timed_puts(put: Callable[[bytes, bytes], Any], keys: list[bytes], vals: list[bytes], budget: float) -> tuple[int, float, float]:
    n = len(keys)
    done = 0
    c0 = time.thread_time()
    t0 = time.perf_counter()
    deadline = t0 + budget
    for s in range(0, n, _CHUNK):
        for k, v in zip(keys[s : s + _CHUNK], vals[s : s + _CHUNK], strict=True):
            put(k, v)
        done = min(n, s + _CHUNK)
        if time.perf_counter() > deadline:
            break
    return done, time.perf_counter() - t0, time.thread_time() - c0


def _timed_gets(get: Callable[[bytes], Any], keys: list[bytes], budget: float) -> tuple[int, float, float]:
    n = len(keys)
    done = 0
    c0 = time.thread_time()
    t0 = time.perf_counter()
    deadline = t0 + budget
    for s in range(0, n, _CHUNK):
        for k in keys[s : s + _CHUNK]:
            get(k)
        done = min(n, s + _CHUNK)
        if time.perf_counter() > deadline:
            break
    return done, time.perf_counter() - t0, time.thread_time() - c0


def _latency_puts(put: Callable[[bytes, bytes], Any], keys: list[bytes], vals: list[bytes], budget: float) -> list[int]:
    pc = time.perf_counter_ns
    lat: list[int] = []
    append = lat.append
    deadline = time.perf_counter() + budget
    for s in range(0, len(keys), _CHUNK):
        for k, v in zip(keys[s : s + _CHUNK], vals[s : s + _CHUNK], strict=True):
            t = pc()
            put(k, v)
            append(pc() - t)
        if time.perf_counter() > deadline:
            break
    return lat


def _latency_gets(get: Callable[[bytes], Any], keys: list[bytes], budget: float) -> list[int]:
    pc = time.perf_counter_ns
    lat: list[int] = []
    append = lat.append
    deadline = time.perf_counter() + budget
    for s in range(0, len(keys), _CHUNK):
        for k in keys[s : s + _CHUNK]:
            t = pc()
            get(k)
            append(pc() - t)
        if time.perf_counter() > deadline:
            break
    return lat


def timer_overhead_ns() -> float:
    """Median cost of one ``perf_counter_ns`` pair around a no-op call."""
    pc = time.perf_counter_ns
    noop = int
    samples = []
    for _ in range(20_000):
        t = pc()
        noop()
        samples.append(pc() - t)
    return float(np.median(samples))


def _pcts(lat: list[int]) -> dict[str, float]:
    if not lat:
        return {"p50_us": float("nan"), "p99_us": float("nan"), "samples": 0}
    a = np.asarray(lat, dtype=np.float64) / 1000.0
    return {
        "p50_us": float(np.percentile(a, 50)),
        "p99_us": float(np.percentile(a, 99)),
        "p999_us": float(np.percentile(a, 99.9)),
        "max_us": float(a.max()),
        "samples": len(lat),
    }


def _jsonable(d: Any) -> Any:
    if isinstance(d, dict):
        return {str(k): _jsonable(v) for k, v in d.items()}
    if isinstance(d, (list, tuple)):
        return [_jsonable(v) for v in d]
    if isinstance(d, (int, float, str, bool)) or d is None:
        return d
    return repr(d)


def _verify(h: Handle, expected: dict[bytes, bytes], sample: int, seed: int, what: str) -> None:
    """Raise if the engine returns a wrong value for a sample of keys (a broken engine
    must not get a throughput number)."""
    keys = list(expected)
    rng = np.random.default_rng(seed)
    for i in rng.choice(len(keys), size=min(sample, len(keys)), replace=False).tolist():
        k = keys[i]
        got = h.get(k)
        if got != expected[k]:
            raise AssertionError(f"{what}: get({k!r}) returned {got!r:.40}, expected {expected[k]!r:.40}")


def run_kv(engine: str, dist: str, n_keys: int, n_ops: int, lat_ops: int, workdir: str, emit: Emit, seed: int = 42) -> dict[str, Any]:
    """Load ``n_keys``, then ``n_ops`` puts and ``n_ops`` gets drawn from ``dist``, then the
    latency passes (``lat_ops`` individually timed puts and gets)."""
    es = spec(engine)
    emit("workload")
    w = Workload.build(dist, n_keys, n_ops, seed)
    pairs = w.load_pairs()
    lat_keys = w.put_keys[:lat_ops]
    nv = len(w.values)
    lat_vals = [w.values[(j + 13) % nv] for j in range(len(lat_keys))]
    for m in es.imports:
        importlib.import_module(m)
    path = os.path.join(workdir, f"{engine}-{dist}")
    shutil.rmtree(path, ignore_errors=True)
    gc.collect()
    rss0 = rss_bytes()
    anon0 = rss_anon_bytes()
    emit("open+load")
    h = es.opener(path)
    try:
        t = time.perf_counter()
        h.load(pairs)
        load_s = time.perf_counter() - t
        rss_loaded = rss_bytes()
        budget = es.phase_budget_s
        emit("put")
        load1 = os.getloadavg()[0]
        put_done, put_s, put_cpu = _timed_puts(h.put, w.put_keys, w.put_values, budget)
        emit("get")
        get_done, get_s, get_cpu = _timed_gets(h.get, w.get_keys, budget)
        # memory before the latency passes and the check allocate their own lists
        rss_end = rss_bytes()
        anon_end = rss_anon_bytes()
        emit("put latency")
        put_lat = _latency_puts(h.put, lat_keys, lat_vals, budget)
        emit("get latency")
        get_lat = _latency_gets(h.get, w.get_keys[:lat_ops], budget)
        emit("verify")
        expected = dict(pairs)
        expected.update(zip(w.put_keys[:put_done], w.put_values[:put_done], strict=True))
        expected.update(zip(lat_keys[: len(put_lat)], lat_vals[: len(put_lat)], strict=True))
        _verify(h, expected, 2000, seed, f"{engine} after the put phase")
        stats = _jsonable(h.store.stats()) if h.store is not None else None
    finally:
        emit("close")
        h.close()
    disk = dir_bytes(path)
    shutil.rmtree(path, ignore_errors=True)
    return {
        "engine": engine,
        "dist": dist,
        "n_keys": n_keys,
        "n_ops": n_ops,
        "load_s": load_s,
        "put_ops": put_done,
        "put_s": put_s,
        "put_ops_per_s": put_done / put_s if put_s > 0 else float("nan"),
        # CPU time of the calling thread / wall time: well below 1 means the loop waited
        # (I/O, locks) or was descheduled by other processes on the machine.
        "put_cpu_share": put_cpu / put_s if put_s > 0 else float("nan"),
        "get_cpu_share": get_cpu / get_s if get_s > 0 else float("nan"),
        "loadavg_1m_at_put": load1,
        "get_ops": get_done,
        "get_s": get_s,
        "get_ops_per_s": get_done / get_s if get_s > 0 else float("nan"),
        "put_latency": _pcts(put_lat),
        "get_latency": _pcts(get_lat),
        "rss_loaded_mb": (rss_loaded - rss0) / 2**20,
        "rss_delta_mb": (rss_end - rss0) / 2**20,
        "rss_anon_delta_mb": (anon_end - anon0) / 2**20,
        "disk_mb": disk / 2**20,
        "data_mb": w.data_bytes / 2**20,
        "timer_overhead_ns": timer_overhead_ns(),
        "stats": stats,
    }


def _expected_value(values: list[bytes], i: int) -> bytes:
    return values[i % len(values)]


def run_build(engine: str, n_keys: int, path: str, emit: Emit, seed: int = 42) -> dict[str, Any]:
    """Create a store with ``n_keys`` distinct keys at ``path`` (puts in shuffled order) and close it."""
    es = spec(engine)
    emit("workload")
    keys = make_keys(n_keys)
    values = make_values(seed)
    order = np.random.default_rng(seed).permutation(n_keys).tolist()
    pairs = [(keys[i], _expected_value(values, i)) for i in order]
    shutil.rmtree(path, ignore_errors=True)
    emit("build")
    h = es.opener(path)
    t = time.perf_counter()
    try:
        if es.ours:  # the realistic layout: what normal puts produce (flushes, merges)
            put = h.put
            for k, v in pairs:
                put(k, v)
        else:
            h.load(pairs)
    finally:
        h.close()
    return {"engine": engine, "n_keys": n_keys, "build_s": time.perf_counter() - t, "disk_mb": dir_bytes(path) / 2**20}


def run_reopen(engine: str, n_keys: int, path: str, emit: Emit, seed: int = 42) -> dict[str, Any]:
    """Open the store built by :func:`run_build` and do one get (timed, imports excluded);
    then RSS growth of this process, also after 10,000 random gets."""
    es = spec(engine)
    keys = make_keys(n_keys)
    values = make_values(seed)
    rng = np.random.default_rng(seed + 5)
    probe = rng.choice(n_keys, size=min(n_keys, 10_001), replace=False).tolist()
    for m in es.imports:
        importlib.import_module(m)
    gc.collect()
    rss0 = rss_bytes()
    anon0 = rss_anon_bytes()
    emit("reopen")
    t0 = time.perf_counter()
    h = es.opener(path)
    first = h.get(keys[probe[0]])
    t1 = time.perf_counter()
    rss1 = rss_bytes()
    anon1 = rss_anon_bytes()
    try:
        if first != _expected_value(values, probe[0]):
            raise AssertionError(f"{engine}: first get after reopen returned {first!r:.40}, expected the built value")
        t2 = time.perf_counter()
        for i in probe[1:]:
            if h.get(keys[i]) != _expected_value(values, i):
                raise AssertionError(f"{engine}: get({keys[i]!r}) after reopen returned a wrong value")
        t3 = time.perf_counter()
        rss2 = rss_bytes()
        anon2 = rss_anon_bytes()
    finally:
        h.close()
    data = n_keys * (KEY_BYTES + VALUE_BYTES)
    return {
        "engine": engine,
        "n_keys": n_keys,
        "reopen_ms": (t1 - t0) * 1000.0,
        "rss_growth_mb": (rss1 - rss0) / 2**20,
        "rss_growth_pct_of_data": 100.0 * (rss1 - rss0) / data,
        "rss_anon_growth_mb": (anon1 - anon0) / 2**20,
        "rss_after_10k_gets_mb": (rss2 - rss0) / 2**20,
        "rss_anon_after_10k_gets_mb": (anon2 - anon0) / 2**20,
        "gets_checked": len(probe),
        # engines may finish building their index in the background after open returns:
        # these gets show whether reads are slow meanwhile
        "next_gets_ms": (t3 - t2) * 1000.0,
        "data_mb": data / 2**20,
    }


def _make_remote(remote_spec: dict[str, Any], tag: str) -> Any:
    import remotes

    if remote_spec["kind"] == "path":
        root = os.path.join(remote_spec["root"], tag)
        shutil.rmtree(root, ignore_errors=True)
        return remotes.PathRemote(root)
    if remote_spec["kind"] == "minio":
        from launcher import services

        ep = services.endpoints()
        return remotes.MinioRemote(
            ep.minio_endpoint,
            ep.minio_access_key,
            ep.minio_secret_key,
            remote_spec.get("bucket", "sfaas-bench"),
            prefix=f"{tag}-{os.getpid()}/",
        )
    raise ValueError(f"unknown remote kind {remote_spec['kind']!r}; expected 'path' or 'minio'")


def _snap(store: Any, sid: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    fut = store.snapshot_async(sid)
    t1 = time.perf_counter()
    info = fut.result()
    t2 = time.perf_counter()
    return {
        "snapshot_id": sid,
        "async_return_ms": (t1 - t0) * 1000.0,
        "snapshot_s": t2 - t0,
        "bytes_uploaded": info.bytes_uploaded,
        "files_uploaded": info.files_uploaded,
        "bytes_total": getattr(info, "bytes_total", None),
        "files_total": getattr(info, "files_total", None),
        # bytes of local files the snapshot read to checksum and upload (older SnapshotInfo: None)
        "bytes_read": getattr(info, "bytes_read", None),
        # the store's own measure of the freeze (inside snapshot_async, without the call overhead)
        "freeze_ms": (info.freeze_seconds * 1000.0) if getattr(info, "freeze_seconds", None) is not None else None,
    }


def run_snapshots(
    engine: str,
    grow_iters: int,
    grow_keys: int,
    big_keys: int,
    upd_frac: float,
    upd_iters: int,
    workdir: str,
    remote_spec: dict[str, Any],
    emit: Emit,
    seed: int = 42,
    sync: str | None = None,
) -> dict[str, Any]:
    """The thesis' §4.3 experiment: (a) a growing state, ``grow_iters`` rounds of
    ``grow_keys`` new keys each followed by a snapshot; (b) ``big_keys`` loaded and
    snapshotted, then ``upd_iters`` rounds updating ``upd_frac`` of the keys, each followed
    by a snapshot. Every snapshot is ``snapshot_async`` (its return time is the freeze)
    followed by waiting for the upload. ``sync``: the engine's durability mode (None: its
    default; hybridlog keeps a WAL only with ``"os"``/``"fsync"``)."""
    import statestores

    opts = {} if sync is None else {"sync": sync}

    values = make_values(seed)
    nv = len(values)
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {"engine": engine, "sync": sync, "remote": remote_spec["kind"], "loadavg_start": list(os.getloadavg())}

    # (a) growing state
    keys = make_keys(max(grow_iters * grow_keys, big_keys))
    path = os.path.join(workdir, f"snap-grow-{engine}")
    shutil.rmtree(path, ignore_errors=True)
    remote = _make_remote(remote_spec, f"grow-{engine}")
    grow: list[dict[str, Any]] = []
    store = statestores.open(engine, path, remote=remote, **opts)
    try:
        for i in range(grow_iters):
            emit(f"grow {i + 1}/{grow_iters}")
            put = store.put
            base = i * grow_keys
            for j in range(base, base + grow_keys):
                put(keys[j], values[j % nv])
            rec = _snap(store, i + 1)
            rec["state_keys"] = base + grow_keys
            rec["state_bytes"] = (base + grow_keys) * (KEY_BYTES + VALUE_BYTES)
            grow.append(rec)
    finally:
        store.close()
        _destroy(remote)
        shutil.rmtree(path, ignore_errors=True)
    out["grow"] = grow

    # (b) big state, then small update-only increments
    path = os.path.join(workdir, f"snap-update-{engine}")
    shutil.rmtree(path, ignore_errors=True)
    remote = _make_remote(remote_spec, f"update-{engine}")
    upd: list[dict[str, Any]] = []
    n_upd = max(1, int(big_keys * upd_frac))
    state_bytes = big_keys * (KEY_BYTES + VALUE_BYTES)
    store = statestores.open(engine, path, remote=remote, **opts)
    try:
        emit("update: load")
        put = store.put
        for j in range(big_keys):
            put(keys[j], values[j % nv])
        base_rec = _snap(store, 1)
        base_rec["state_bytes"] = state_bytes
        out["update_base"] = base_rec
        for i in range(upd_iters):
            emit(f"update {i + 1}/{upd_iters}")
            idx = rng.choice(big_keys, size=n_upd, replace=False).tolist()
            for j in idx:
                put(keys[j], values[(j + i + 1) % nv])
            rec = _snap(store, i + 2)
            rec["updated_keys"] = n_upd
            rec["state_bytes"] = state_bytes
            rec["uploaded_pct_of_state"] = 100.0 * rec["bytes_uploaded"] / state_bytes
            rec["read_pct_of_state"] = None if rec["bytes_read"] is None else 100.0 * rec["bytes_read"] / state_bytes
            upd.append(rec)
    finally:
        store.close()
        _destroy(remote)
        shutil.rmtree(path, ignore_errors=True)
    out["update"] = upd
    out["big_keys"] = big_keys
    out["upd_frac"] = upd_frac
    out["loadavg_end"] = list(os.getloadavg())
    return out


def _destroy(remote: Any) -> None:
    try:
        remote.destroy()
    finally:
        remote.close()


def run_profile(engine: str, n_keys: int, n_ops: int, workdir: str, emit: Emit, seed: int = 42) -> dict[str, Any]:
    """cProfile of ``n_ops`` uniform puts and gets after loading ``n_keys``: top 10 by own time."""
    es = spec(engine)
    w = Workload.build("uniform", n_keys, n_ops, seed)
    path = os.path.join(workdir, f"profile-{engine}")
    shutil.rmtree(path, ignore_errors=True)
    h = es.opener(path)
    texts: dict[str, str] = {}
    try:
        emit("load")
        h.load(w.load_pairs())
        for phase in ("put", "get"):
            emit(f"profile {phase}")
            pr = cProfile.Profile()
            if phase == "put":
                put = h.put
                pr.enable()
                for k, v in zip(w.put_keys, w.put_values, strict=True):
                    put(k, v)
                pr.disable()
            else:
                get = h.get
                pr.enable()
                for k in w.get_keys:
                    get(k)
                pr.disable()
            buf = io.StringIO()
            st = pstats.Stats(pr, stream=buf)
            st.sort_stats("tottime").print_stats(10)
            texts[phase] = _trim_pstats(buf.getvalue())
    finally:
        h.close()
        shutil.rmtree(path, ignore_errors=True)
    return {"engine": engine, "n_keys": n_keys, "n_ops": n_ops, "put": texts.get("put", ""), "get": texts.get("get", "")}


def _trim_pstats(text: str) -> str:
    """Keep pstats' totals line and its table; shorten file paths to the repo or package."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    keep: list[str] = []
    in_table = False
    for ln in lines:
        if "function calls" in ln:
            keep.append(ln)
        elif ln.lstrip().startswith("ncalls"):
            in_table = True
            keep.append(ln)
        elif in_table:
            keep.append(ln)
    cwd = os.getcwd() + os.sep
    out = []
    for ln in keep:
        ln = ln.replace(cwd, "")
        for marker in ("site-packages/", "lib/python3.11/"):
            i = ln.find(marker)
            if i >= 0:
                j = ln.rfind(" ", 0, i)
                ln = ln[: j + 1] + ln[i + len(marker) :]
        out.append(ln)
    return "\n".join(out)
