"""The compose clusters, for real: images built offline (``./run images``), ``docker-compose``
on the repository's compose files, the host talking to them through their published ports.

Each test gets its own compose project (its own containers, networks and volumes) on
free host ports, and removes it afterwards — with the end of every container's log printed
when the test failed. Docker is installed and started when missing (root, apt), like
``./run cluster`` does; a machine where that fails FAILS these tests, nothing is skipped.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from launcher import containers
from launcher.compose_project import ROOT, Compose, compose, override, wait_ready
from launcher.procs import ServiceError, ServiceSettings

__all__ = ["ROOT", "Compose", "compose", "override", "wait_ready", "images"]


@pytest.fixture(scope="session")
def images() -> Iterator[None]:
    """The images (built once per machine; a rebuild with nothing changed takes seconds).
    A Docker daemon this session had to start is stopped at its end."""
    cache = ServiceSettings.from_env().cache_dir
    cache.mkdir(parents=True, exist_ok=True)
    daemon = None
    try:
        daemon = containers.ensure_docker(cache)
        containers.build_images(cache)
    except ServiceError as e:
        if daemon is not None:
            containers.stop_docker(daemon)
        pytest.fail(f"could not build the images: {e}", pytrace=False)
    yield
    if daemon is not None:
        containers.stop_docker(daemon)


