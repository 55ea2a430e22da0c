"""``./run images`` / ``./run cluster`` without Docker: the secrets file, the compose command
line and bad input (tests/cluster runs them for real)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from launcher import containers
from launcher.procs import ServiceError


def test_the_secrets_are_made_once_kept_private_and_the_environment_wins(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k in containers.SECRETS:
        monkeypatch.delenv(k, raising=False)
    path = containers.env_file(tmp_path)
    first = path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    values = dict(line.split("=", 1) for line in first.splitlines() if "=" in line)
    assert set(values) == set(containers.SECRETS) and all(len(v) >= 32 for v in values.values())
    assert containers.env_file(tmp_path).read_text() == first  # kept, not made again
    monkeypatch.setenv("SFAAS_SECRET", "from-the-environment-0123456789")
    again = dict(line.split("=", 1) for line in
                 containers.env_file(tmp_path).read_text().splitlines() if "=" in line)
    assert again["SFAAS_SECRET"] == "from-the-environment-0123456789"
    assert again["SFAAS_GATEWAY_TOKEN"] == values["SFAAS_GATEWAY_TOKEN"]


def test_the_compose_command_names_the_project_file_and_secrets(tmp_path: Path) -> None:
    argv = containers.compose(True, "ps", cache=tmp_path)
    assert argv[:5] == ["docker-compose", "-p", "sfaas-ha", "-f",
                        str(containers.ROOT / "docker-compose.ha.yml")]
    assert argv[argv.index("--env-file") + 1] == str(tmp_path / "cluster.env")
    assert argv[-1] == "ps"
    assert "docker-compose.yml" in containers.compose(False, cache=tmp_path)[4]


def test_bad_input_is_refused_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ServiceError, match="unknown image 'postgres': expected one of sfaas, kafka"):
        containers.build_images(tmp_path, ["postgres"])
    with pytest.raises(SystemExit):
        containers.main(["cluster", "restart"])
    assert "invalid choice: 'restart'" in capsys.readouterr().err


def test_a_step_can_read_another_process_output_and_a_failure_names_the_step() -> None:
    """(``docker import`` reads ``tar``'s output: a cold ``./run images`` failed on it once.)"""
    import subprocess

    src = subprocess.Popen(["printf", "abc"], stdout=subprocess.PIPE)
    containers._run(["grep", "-q", "abc"], what="grep", stdin=src.stdout)
    src.wait()
    with pytest.raises(ServiceError, match=r"the step failed \(exit 1\)"):
        containers._run(["false"], what="the step")
