"""Another app's data is refused, naming both apps: a data directory (``LocalRunner``'s, a
worker's) whose stores another app wrote, and a namespace whose data directory on this host
holds another app's stores (``sfaas up``, a worker) — instead of reading and overwriting
that app's keys, or starting empty beside them, without a word."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from launcher import cluster
from sfaas import App, ConfigError, Context
from sfaas.errors import ClusterError
from sfaas.runtime.settings import Settings
from sfaas.runtime.state import check_layout, check_namespace, open_stores, stores_root
from sfaas.testing import LocalRunner


def _app(name: str, store: str = "lsm", operator: str = "accounts") -> App:
    app = App(name)
    op = app.operator(operator, store=store)

    @op.function
    async def deposit(ctx: Context, amount: int) -> int:
        ctx.put(ctx.get(default=0) + amount)
        return int(ctx.get())

    return app


# -- a data directory -----------------------------------------------------------------------
@pytest.mark.parametrize("operator", ["accounts", "carts"],
                         ids=["same-operator-name", "other-operator-name"])
def test_a_local_runner_over_another_apps_directory_is_refused_naming_both(
        tmp_path: Path, operator: str) -> None:
    with LocalRunner(_app("shop", operator=operator), partitions=4, directory=tmp_path) as r:
        r.call(operator, "alice", "deposit", 5)
    with pytest.raises(ConfigError, match=re.escape(
            f"data directory {tmp_path} holds the state of app 'shop' (operator {operator!r}); "
            "this is app 'bank'. Opening it would read and overwrite app 'shop''s data as app "
            "'bank''s")):
        LocalRunner(_app("bank"), partitions=4, directory=tmp_path)
    # the refusal changed nothing: the owner still opens it and sees its data
    with LocalRunner(_app("shop", operator=operator), partitions=4, directory=tmp_path) as r:
        assert r.get(operator, "alice") == 5


def test_the_same_app_reopened_sees_its_data(tmp_path: Path) -> None:
    with LocalRunner(_app("bank"), partitions=4, directory=tmp_path) as r:
        r.call("accounts", "alice", "deposit", 5)
    with LocalRunner(_app("bank"), partitions=4, directory=tmp_path) as r:
        assert r.call("accounts", "alice", "deposit", 1) == 6


def test_a_directory_of_memonly_stores_or_of_layouts_without_an_app_is_taken(
        tmp_path: Path) -> None:
    """``memonly`` stores keep nothing on disk: nothing of the other app is read; a layout
    without an app (none was written so, but a hand-made one) cannot be refused by name."""
    with LocalRunner(_app("shop", store="memonly"), partitions=4, directory=tmp_path / "a"):
        pass
    with LocalRunner(_app("bank"), partitions=4, directory=tmp_path / "a") as r:
        assert r.call("accounts", "alice", "deposit", 1) == 1
    with LocalRunner(_app("shop"), partitions=4, directory=tmp_path / "b") as r:
        r.call("accounts", "alice", "deposit", 5)
    layout = tmp_path / "b" / "accounts" / "LAYOUT.json"
    layout.write_text(json.dumps({k: v for k, v in json.loads(layout.read_text()).items()
                                  if k != "app"}))
    with LocalRunner(_app("shop"), partitions=4, directory=tmp_path / "b") as r:
        assert r.call("accounts", "alice", "deposit", 1) == 6


# -- a namespace ----------------------------------------------------------------------------
def _settings(home: Path, namespace: str = "ns", store: str = "lsm") -> Settings:
    # (a store for all operators: tests/runtime/conftest.py sets SFAAS_STORE=memonly)
    return Settings.load({"home": str(home), "namespace": namespace, "snapshot_interval": 0,
                          "partitions": 4, "store": store})


def _ran(s: Settings, app: App) -> None:
    """What a run of ``app`` leaves in ``s``'s namespace on this host: its stores' layouts."""
    stores = open_stores(s, app, range(4), 4)
    stores.close()


def test_a_namespace_holding_another_apps_stores_refuses_a_worker_naming_both(
        tmp_path: Path) -> None:
    s = _settings(tmp_path)
    _ran(s, _app("shop"))
    where = re.escape(f"namespace 'ns' holds the state of app 'shop' "
                      f"({stores_root(s, 'shop')}, operator 'accounts'); this is app 'bank'.")
    with pytest.raises(ConfigError, match=where + " A namespace runs one app"):
        check_namespace(s, "bank")
    with pytest.raises(ConfigError, match=where):
        open_stores(s, _app("bank"), range(4), 4)  # a worker of app bank
    assert not Path(stores_root(s, "bank")).exists()  # refused before any store opened
    check_namespace(s, "shop")  # its own namespace
    _ran(s, _app("shop"))
    check_namespace(_settings(tmp_path, "other"), "bank")  # another namespace
    _ran(_settings(tmp_path, "other"), _app("bank"))
    # an app whose stores keep nothing on disk leaves nothing to refuse
    _ran(_settings(tmp_path, "mem", store="memonly"), _app("cache"))
    check_namespace(_settings(tmp_path, "mem"), "bank")


def test_sfaas_up_in_a_namespace_of_another_app_is_refused_before_anything_starts(
        tmp_path: Path) -> None:
    s = Settings.load({"home": str(tmp_path), "namespace": "ns", "partitions": 4,
                       "kafka": "127.0.0.1:9", "snapshot_interval": 0})
    shop = _app("shop")
    check_layout(shop, stores_root(s, "shop"), 4)  # (what shop's workers wrote)
    with pytest.raises(ClusterError, match=re.escape(
            "namespace 'ns' holds the state of app 'shop'")
            + r".*this is app 'ledger'\. A namespace runs one app: run app 'ledger' in another "
              r"namespace \(--namespace, SFAAS_NAMESPACE\), start app 'shop' here"):
        cluster.up(s, "tests.runtime.apps.ledger:app", 2, timeout=5)
    assert cluster.ps(s) == [] and not cluster.state_dir(s).exists()  # nothing started
