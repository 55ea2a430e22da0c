"""Every ``SFAAS_*`` variable the runtime reads is a field of ``Settings``.

A variable read somewhere else is a setting nobody validates, documents with its default
(docs/operations/configuration.md) or passes to a child process (``Settings.as_env``). This
test reads the product code's syntax trees and fails on any read of the environment
(``os.environ.get``, ``os.environ[...]``, ``os.getenv``, ``... in os.environ``) whose name is
an ``SFAAS_`` string — or cannot be told — outside ``sfaas/runtime/settings.py``, unless
:data:`ALLOWED` lists it with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("sfaas", "statestores", "remotes", "coordinator", "worker", "launcher", "gateway")
#: The settings modules: the runtime's, and the gateway's own (``SFAAS_GATEWAY_*``).
SETTINGS = {"sfaas/runtime/settings.py", "gateway/settings.py"}
#: A name computed at run time (a parameter, a loop variable).
DYNAMIC = "<computed>"

#: (file, variable) reads kept outside the settings, each for its reason. It may only
#: shrink: a listed read that is gone fails the test too.
ALLOWED = {
    # remotes is the floor under the runtime and may not import it; a remote is pickled to
    # a background process without its credentials (as Settings is), and that process
    # completes them from the environment it inherited from the process that held them.
    ("remotes/credentials.py", "SFAAS_MINIO_SECRET_KEY"),
    ("remotes/credentials.py", "SFAAS_MINIO_ACCESS_KEY"),
    # `sfaas alive`, the containers' liveness probe, runs on the standard library alone
    # (importing the runtime cost 0.7 s of CPU per probe); it finds the file the way
    # Settings.alive_file and Settings.home do.
    ("launcher/alive.py", "SFAAS_ALIVE_FILE"),
    ("launcher/alive.py", "SFAAS_HOME"),
    # `sfaas services`' own typed settings (launcher/procs.py: the local Kafka broker and
    # MinIO, other processes than the runtime's, set up before any app exists); its MinIO
    # credentials are the ones the runtime's Settings default to.
    ("launcher/procs.py", "SFAAS_CACHE"),
    ("launcher/procs.py", "SFAAS_HOME"),
    ("launcher/procs.py", "SFAAS_MINIO_ACCESS_KEY"),
    ("launcher/procs.py", "SFAAS_MINIO_SECRET_KEY"),
    ("launcher/procs.py", "SFAAS_KAFKA_HEAP"),
    ("launcher/procs.py", DYNAMIC),  # _env_int: the services' ports
    # the compose clusters' tooling (./run cluster): the secrets it writes once into the
    # cluster's env file, and its published ports (SFAAS_CLUSTER_*)
    ("launcher/containers.py", DYNAMIC),
    ("launcher/containers.py", "SFAAS_CLUSTER_"),
    # `sfaas up` asks whether SFAAS_METRICS_PORT was set at all (even to 0: no metrics) —
    # where a value came from, which Settings does not keep — to choose per-child ports
    ("launcher/commands.py", "SFAAS_METRICS_PORT"),
}


def _is_environ(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ" \
        and isinstance(node.value, ast.Name) and node.value.id == "os"


def _constants(tree: ast.Module) -> dict[str, str]:
    """The module's ``NAME = "string"`` assignments."""
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = node.value.value
    return found


def _name(arg: ast.expr, constants: dict[str, str]) -> str:
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        return str(arg.values[0].value)  # an f-string: its fixed head
    if isinstance(arg, ast.Name) and arg.id in constants:
        return constants[arg.id]
    return DYNAMIC


def _reads(tree: ast.Module) -> set[str]:
    """The names of the environment variables ``tree`` reads."""
    constants = _constants(tree)
    names: set[str] = set()
    for node in ast.walk(tree):
        arg: ast.expr | None = None
        if isinstance(node, ast.Call) and node.args:
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr == "get" and _is_environ(f.value):
                arg = node.args[0]
            elif isinstance(f, ast.Attribute) and f.attr == "getenv" \
                    and isinstance(f.value, ast.Name) and f.value.id == "os":
                arg = node.args[0]
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) \
                and _is_environ(node.value):
            arg = node.slice
        elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
            arg = node.left
        if arg is not None:
            names.add(_name(arg, constants))
    return {n for n in names if n.startswith("SFAAS_") or n == DYNAMIC}


def _product_reads() -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for top in PRODUCT:
        for path in sorted((ROOT / top).rglob("*.py")):
            where = str(path.relative_to(ROOT))
            if where not in SETTINGS:
                tree = ast.parse(path.read_text(encoding="utf-8"), where)
                found |= {(where, name) for name in _reads(tree)}
    return found


def test_product_code_reads_sfaas_variables_only_through_the_settings() -> None:
    reads = _product_reads()
    stray = sorted(reads - ALLOWED)
    assert not stray, ("SFAAS_* variables read outside sfaas/runtime/settings.py — make each a "
                       f"Settings field and pass its value to where it is used: {stray}")
    gone = sorted(ALLOWED - reads)
    assert not gone, f"no longer read there: delete them from ALLOWED: {gone}"


def test_the_scan_sees_each_kind_of_read() -> None:
    """The scanner itself: every form of reading a variable is found."""
    code = '''
import os
ENV = "SFAAS_A"
os.environ.get("SFAAS_B", "x")
os.getenv(f"SFAAS_C_{1}")
os.environ[ENV]
"SFAAS_D" in os.environ
os.environ.get(name)
os.environ["SFAAS_E"] = "written, not read"
os.environ.get("HOME")
'''
    assert _reads(ast.parse(code)) == {"SFAAS_A", "SFAAS_B", "SFAAS_C_", "SFAAS_D", DYNAMIC}
