"""The guide's Python blocks that need a running cluster (marked ``<!-- not run: needs a
running cluster … -->``, so ``tests/test_docs_site.py`` only reads them) run here, against a
real 2-worker cluster of ``examples.bank`` (Kafka, MinIO, ``sfaas up``) — so every Python
block of the guide is executed by a test. A block is run after the page's other blocks (it
may use what they defined, e.g. a function handle); one with a top-level ``await`` gets a
``client`` (``sfaas.Client`` of the cluster's app)."""

from __future__ import annotations

import ast
import asyncio
import inspect
from pathlib import Path
from typing import Any

import pytest

from launcher import cluster
from sfaas.client import Client
from tests.runtime.test_recovery import chaos_settings, log_tails
from tests.test_docs_site import PAGES, ROOT, blocks, run_page

CLUSTER_BLOCKS = [(page, b) for page in PAGES for b in blocks(page)
                  if not b.runs and "running cluster" in b.why]


def test_the_guide_marks_its_cluster_blocks() -> None:
    """What this file runs is what the guide marks (a block marked for another reason
    would run nowhere)."""
    assert len(CLUSTER_BLOCKS) >= 3, CLUSTER_BLOCKS
    unrun = [(p, b.line, b.why) for p in PAGES for b in blocks(p)
             if not b.runs and "running cluster" not in b.why]
    assert not unrun, f"guide blocks that no test runs: {unrun}"


@pytest.mark.timeout(300)
def test_the_guides_cluster_blocks_run_on_a_cluster(kafka: Any, minio: Any, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    s = chaos_settings(kafka, minio, tmp_path, store="memonly")
    cluster.up(s, "examples.bank:app", 2, timeout=90)
    monkeypatch.setenv("SFAAS_NAMESPACE", s.namespace)  # (the blocks' clients find it)
    try:
        for page, block in CLUSTER_BLOCKS:
            module = run_page(page)
            code = "\n" * (block.line - 1) + block.code.replace("127.0.0.1:9092",
                                                                 kafka.kafka_bootstrap)
            compiled = compile(code, str(ROOT / page), "exec",
                               flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
            try:
                if compiled.co_flags & inspect.CO_COROUTINE:
                    asyncio.run(_with_client(compiled, vars(module), kafka.kafka_bootstrap))
                else:
                    exec(compiled, vars(module))
            except BaseException as exc:
                raise AssertionError(f"{page}: the cluster block at line {block.line} failed: "
                                     f"{type(exc).__name__}: {exc}") from exc

        async def balances() -> list[Any]:
            async with Client("bank", kafka.kafka_bootstrap, namespace=s.namespace) as c:
                return [await c.get("accounts", a) for a in ("alice", "bob")]
        # functions.md: alice +100, -10 to bob, +10; idempotency.md: +50 (once)
        assert asyncio.run(balances()) == [150, 10]
    except BaseException:
        print(log_tails(s))
        raise
    finally:
        cluster.down(s)


async def _with_client(code: Any, namespace: dict[str, Any], bootstrap: str) -> None:
    async with Client("bank", bootstrap) as client:
        namespace["client"] = client
        await eval(code, namespace)  # noqa: S307 (the guide's own block)
