"""The compose clusters, for real: images built offline (``./run images``), ``docker-compose``
on the repository's compose files, the host talking to them through their published ports.

Each test gets its own compose project (its own containers, networks and volumes) on
free host ports, and removes it afterwards — with the end of every container's log printed
when the test failed. Docker is installed and started when missing (root, apt), like
``./run cluster`` does; a machine where that fails FAILS these tests, nothing is skipped.
"""

from __future__ import annotations

import pytest

from launcher import containers
from launcher.compose_project import ROOT, Compose, compose, override, wait_ready
from launcher.procs import ServiceError, ServiceSettings

__all__ = ["ROOT", "Compose", "compose", "override", "wait_ready", "images"]


@pytest.fixture(scope="session")
def images() -> None:
    """The images (built once per machine; a rebuild with nothing changed takes seconds)."""
    cache = ServiceSettings.from_env().cache_dir
    cache.mkdir(parents=True, exist_ok=True)
    try:
        containers.build_images(cache)
    except ServiceError as e:
        pytest.fail(f"could not build the images: {e}", pytrace=False)


