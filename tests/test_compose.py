"""docker-compose.yml stays true to the code: no Docker engine runs here, so the file is
checked statically — every sfaas service's command parses with our CLI, every ``SFAAS_*``
variable is a real setting, and the settings it describes load and validate."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from sfaas.cli.commands import _parser
from sfaas.settings import Settings

COMPOSE = Path(__file__).resolve().parents[1] / "docker-compose.yml"


def _compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())  # type: ignore[no-any-return]


def _ours(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: svc for name, svc in doc["services"].items() if svc.get("build")}


def _resolve(value: object) -> str:
    """``${VAR:-default}`` → ``default`` (what compose uses when VAR is unset)."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", str(value))


def test_the_compose_file_runs_a_coordinator_workers_and_standbys() -> None:
    commands = [svc["command"][0] for svc in _ours(_compose()).values()]
    assert commands.count("coordinator") == 1 and commands.count("worker") >= 2


@pytest.mark.parametrize("service", sorted(_ours(_compose())))
def test_every_service_command_parses_with_the_cli(service: str) -> None:
    svc = _ours(_compose())[service]
    ns = _parser().parse_args(svc["command"])  # exits (fails the test) on an unknown flag
    assert ns.command == svc["command"][0]


def test_every_sfaas_variable_is_a_setting_and_the_settings_load() -> None:
    known = {f"SFAAS_{f.name.upper()}" for f in dataclasses.fields(Settings)}
    for name, svc in _ours(_compose()).items():
        env = {k: _resolve(v) for k, v in svc["environment"].items()}
        unknown = sorted(k for k in env if k.startswith("SFAAS_") and k not in known)
        assert not unknown, f"{name}: {unknown} are not settings (known: SFAAS_ + a field of sfaas.settings.Settings)"
        s = Settings.load(env=env)  # raises ConfigError naming a bad value
        assert s.workers == 2 and s.standbys == 1 and s.snapshot_interval > 0
        standby_of = [svc["command"][i + 1] for i, a in enumerate(svc["command"]) if a == "--standby-of"]
        if standby_of:
            assert 0 <= int(standby_of[0]) < s.workers, f"{name} stands by for a worker that does not exist"
