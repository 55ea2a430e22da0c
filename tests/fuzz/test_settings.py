"""Fuzz: configuration values — ``SFAAS_*`` environment variables, overrides set in code,
and command-line flags of ``sfaas coordinator|worker|up`` — into ``Settings.load``.

Outcomes: settings whose every field has its type and passes validation (and that survive
``as_env`` → ``load`` unchanged), or a ``ConfigError`` naming the setting; a malformed
command line is argparse's usage error (exit status 2). Never another exception, and
never settings that fail later when a process binds, creates topics or opens files.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from sfaas.errors import ConfigError
from sfaas.runtime.settings import Settings

from .budget import fuzz
from .outcomes import Outcomes
from .strategies import mix, values

FIELDS = [f.name for f in dataclasses.fields(Settings)]
_text = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["", " ", "0", "-1", "1", "2", "8", "65536", "1e3", "nan", "inf", "-inf", "0x10", "9" * 5000,
                     "127.0.0.1:7700", "host:", ":80", "a:b:7", "localhost:99999", "lsm", "memonly", "DEBUG", "x\0y",
                     "sfaas", "Bad_Bucket", "has space", "0.0.0.0"]),
)


def env_values() -> st.SearchStrategy[dict[str, str]]:
    return st.dictionaries(st.sampled_from(FIELDS).map(lambda f: f"SFAAS_{f.upper()}"),
                           _text.filter(lambda t: "\0" not in t), max_size=5)


def overrides() -> st.SearchStrategy[dict[str, Any]]:
    # ("app" by construction: its type check is a stage, and with every new field a
    # sampled key is less likely to be it — 2 settings more and the CI sample missed it)
    return st.dictionaries(st.one_of(st.just("app"), st.sampled_from(FIELDS), st.text(max_size=5)),
                           mix((3, _text), (2, values(4)), (1, st.integers(-5, 70000))), max_size=4)


@pytest.mark.spread(accepted=["settings"],
                    min_accepted=0.05,
                    stages=["unknown setting", "must be an integer", "must be a number", "kafka Q is", "setting app must be a str"])
@fuzz(share=0.6)
@given(env=env_values(), over=overrides())
# (a str setting given another type, reached by construction: a new setting once shifted the
# seeded sample off it)
@example(env={}, over={"app": 5})
# (a Kafka address without a port, by construction too: hypothesis 6.170's sample of the
# CI seed has none)
@example(env={"SFAAS_KAFKA": "broker:"}, over={})
def test_settings_load_or_raise_config_error(env: dict[str, str], over: dict[str, Any], outcomes: Outcomes) -> None:
    try:
        s = Settings.load(over, env=env)
        s.coordinator_address()
    except ConfigError as exc:
        assert str(exc)
        outcomes.error(exc)
        return
    outcomes.add("settings")
    types = {"int": int, "float": float, "str": str, "bool": bool}
    for f in dataclasses.fields(s):
        assert type(getattr(s, f.name)) is types[str(f.type)], (f.name, getattr(s, f.name))
    assert 0 <= s.port <= 65535 and 0 <= s.coordinator_address()[1] <= 65535
    again = Settings.load(env=s.as_env())
    assert dataclasses.asdict(again) == dataclasses.asdict(s)


COMMANDS = {
    "coordinator": ["--kafka", "--namespace", "--log-level", "--app", "--listen", "--workers", "--partitions",
                    "--snapshot-interval", "--snapshot-retain"],
    "worker": ["--kafka", "--namespace", "--log-level", "--app", "--coordinator", "--host", "--port", "--store",
               "--max-batch", "--name", "--standby-of"],
    "up": ["--kafka", "--namespace", "--log-level", "--partitions", "--store", "--snapshot-interval",
           "--snapshot-retain", "--workers", "--standbys"],
}
SETTINGS_OF = {
    "coordinator": ("kafka", "namespace", "log_level", "app", "coordinator", "workers", "partitions",
                    "snapshot_interval", "snapshot_retain"),
    "worker": ("kafka", "namespace", "log_level", "app", "coordinator", "host", "port", "store", "max_batch",
               "standby_of"),
    "up": ("kafka", "namespace", "log_level", "partitions", "store", "snapshot_interval", "snapshot_retain"),
}


@st.composite
def command_lines(draw: st.DrawFn) -> list[str]:
    cmd = draw(st.sampled_from(sorted(COMMANDS)))
    argv = [cmd] + (["examples.bank:app"] if cmd == "up" else [])
    for _ in range(draw(st.integers(0, 5))):
        argv += [draw(st.sampled_from(COMMANDS[cmd])), draw(_text.filter(lambda t: "\0" not in t))]
    if draw(st.booleans()):
        argv.insert(draw(st.integers(0, len(argv))), draw(_text.filter(lambda t: "\0" not in t)))
    return argv


@pytest.mark.spread(accepted=["settings"],
                    min_accepted=0.01,
                    stages=["kafka Q is", "log_level must be", "namespace must be"],
                    each=["usage error", "ConfigError"])
@fuzz(share=0.4)
@given(argv=command_lines())
def test_command_line_flags_give_settings_or_a_named_error(argv: list[str], outcomes: Outcomes,
                                                           capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher.commands import _parser, _settings

    for k in [k for k in os.environ if k.startswith("SFAAS_")]:
        monkeypatch.delenv(k)
    try:
        ns = _parser().parse_args(argv)
    except SystemExit as exc:
        assert exc.code == 2  # argparse's usage error, with the usage printed
        capsys.readouterr()
        outcomes.add("usage error")
        return
    try:
        _settings(ns, *SETTINGS_OF[ns.command])
    except ConfigError as exc:
        outcomes.error(exc)
        return
    outcomes.add("settings")
