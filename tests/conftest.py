"""Session fixtures that start the real services (MinIO, Kafka) as plain processes.

A service that already runs (``sfaas services up``, or another test session) is reused.
One this session had to start is stopped at the end, unless another session still uses
it (see :func:`launcher.services.using`). A service that cannot start FAILS the tests that
need it, with the log tail; nothing is skipped.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import re
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from launcher import cluster, services
from launcher.services import Endpoints, ServiceError
from remotes.minio import MinioRemote
from sfaas.runtime.settings import Settings
from tests.hang import terminal_fd
from tests.namespaces import NAMESPACES, drop_objects, drop_topics, fresh_namespace

TEST_BUCKET = "sfaas-tests"

# The cluster's determinism check is on in the test suite (docs/guide/functions.md, "Mistakes the runtime
# catches"): every cluster a test starts runs it, unless the test turns it off.
os.environ.setdefault("SFAAS_CHECK_DETERMINISM", "1")


@pytest.fixture
def watchdog(request: pytest.FixtureRequest) -> Iterator[None]:
    """A hang fails fast: past the module's ``HANG_AFTER`` seconds (60 by default) the
    process prints every thread's stack and exits. Per test: a module-level timer would end
    the whole session. A module asks for it with
    ``pytestmark = pytest.mark.usefixtures("watchdog")``."""
    faulthandler.dump_traceback_later(getattr(request.module, "HANG_AFTER", 60), exit=True,
                                      file=terminal_fd(request.config))
    yield
    faulthandler.cancel_dump_traceback_later()


@contextlib.contextmanager
def _service(**which: bool) -> Iterator[Endpoints]:
    cm = services.using(**which)
    try:
        ep = cm.__enter__()
    except ServiceError as e:
        pytest.fail(f"could not start {', '.join(k for k, v in which.items() if v)}: {e}", pytrace=False)
    try:
        yield ep
    finally:
        cm.__exit__(None, None, None)


@pytest.fixture(scope="session")
def minio() -> Iterator[Endpoints]:
    """A running MinIO (endpoint + credentials in the returned :class:`Endpoints`); at the
    end the objects of this session's test namespaces are deleted (``tests.namespaces``)."""
    with _service(minio=True) as ep:
        yield ep
        drop_objects(ep, NAMESPACES)


@pytest.fixture(scope="session")
def kafka() -> Iterator[Endpoints]:
    """A running single-node Kafka; ``.kafka_bootstrap`` is its bootstrap address. At the
    end the topics of this session's test namespaces are deleted (``tests.namespaces``)."""
    with _service(kafka=True) as ep:
        yield ep
        drop_topics(ep.kafka_bootstrap, NAMESPACES)


def make_minio_remote(ep: Endpoints, prefix: str | None = None, **kwargs: object) -> MinioRemote:
    """A :class:`MinioRemote` on the shared test bucket under a fresh unique prefix."""
    return MinioRemote(
        ep.minio_endpoint,
        ep.minio_access_key,
        ep.minio_secret_key,
        TEST_BUCKET,
        prefix=prefix or f"t-{uuid.uuid4().hex[:12]}",
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.fixture
def minio_remote(minio: Endpoints) -> Iterator[MinioRemote]:
    """A MinioRemote on a unique prefix of the test bucket; destroyed afterwards."""
    remote = make_minio_remote(minio)
    try:
        yield remote
    finally:
        remote.destroy()
        remote.close()


@pytest.fixture(scope="session")
def observed_cluster(kafka: Endpoints, minio: Endpoints, tmp_path_factory: pytest.TempPathFactory) \
        -> Iterator[tuple[Settings, Settings]]:
    """A 2-worker ``tests.runtime.apps.ledger`` cluster (``sfaas up``: LSM stores, a snapshot
    round every second) whose processes serve metrics on free ports, shared by the tests
    that watch it (metrics, the status page, the Grafana dashboard). Yields its settings
    and the settings a client of it uses."""
    s = Settings.load({
        "kafka": kafka.kafka_bootstrap, "namespace": fresh_namespace(),
        "home": str(tmp_path_factory.mktemp("observed")), "store": "lsm", "partitions": 4,
        "snapshot_interval": 1.0, "snapshot_retain": 2, "minio": minio.minio_endpoint,
        "minio_access_key": minio.minio_access_key, "minio_secret_key": minio.minio_secret_key,
        "bucket": TEST_BUCKET,
    })
    cluster.up(s, "tests.runtime.apps.ledger:app", 2, timeout=90)
    try:
        yield s, cluster.cluster_settings(s)[1]
    finally:
        cluster.down(s)


# -- the seeds a session drew, in its summary ------------------------------------------------
# pytest shows a test's captured output only when it fails, so a passing seeded run (chaos,
# nemesis, fencing, stress, fuzz) left no trace of its seed and CI could not replay it. Every
# seed a test used is listed at the end of the session, passing or failing, with the
# variable that replays it.

_SEED_DEF = re.compile(r'^(\w*SEED)\s*=\s*int\(os\.environ\.get\("(\w+)"\)', re.M)
_SEED_PRINTED = re.compile(r"\b(SFAAS_\w*SEED)=(\d+)|^seed=(\d+)$", re.M)
#: "VARIABLE=value" → the test files that used it
_SEEDS: dict[str, set[str]] = {}


def report_seed(variable: str, value: int, where: str) -> None:
    """Name a seed a test used (``variable`` replays it), for the session's summary."""
    _SEEDS.setdefault(f"{variable}={value}", set()).add(where)


def _seed_variables() -> dict[tuple[str, int], str]:
    """(name, value) of every ``NAME = int(os.environ.get("VAR") ...)`` seed of a loaded test
    module → VAR (a module importing another's seed is named by the one defining it)."""
    out: dict[tuple[str, int], str] = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith("tests.") or not getattr(module, "__file__", None):
            continue
        try:
            source = Path(module.__file__).read_text()  # type: ignore[arg-type]
        except OSError:
            continue
        for attr, variable in _SEED_DEF.findall(source):
            value = getattr(module, attr, None)
            if isinstance(value, int):
                out[(attr, value)] = variable
    return out


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Collects the seeds of each test: its module's ``*SEED`` globals, the fuzz suites'
    hypothesis seed, and ``SFAAS_*SEED=N`` (or a bare ``seed=N`` line) in its output."""
    if report.when != "call":
        return
    where = report.nodeid.split("::")[0]
    module = sys.modules.get(where.removesuffix(".py").replace("/", "."))
    if module is not None:
        known = _seed_variables()
        for attr, value in vars(module).items():
            if attr.endswith("SEED") and isinstance(value, int) and (attr, value) in known:
                report_seed(known[(attr, value)], value, where)
    if where.startswith("tests/fuzz/"):
        from tests.fuzz import budget

        if module is not None and getattr(module, "fuzz", None) is budget.fuzz:
            report_seed("SFAAS_FUZZ_SEED", budget.SEED, where)
    for variable, value, bare in _SEED_PRINTED.findall(report.capstdout):
        report_seed(variable or "SFAAS_SEED", int(value or bare), report.nodeid)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _SEEDS:
        terminalreporter.section("seeds (set the variable to replay a run)")
        for seed, files in sorted(_SEEDS.items()):
            terminalreporter.write_line(f"{seed}  {', '.join(sorted(files))}")
