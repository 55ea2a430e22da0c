"""MinioRemote specifics: retries, failures, credentials hygiene, buckets and prefixes."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from minio import Minio

from launcher import services
from launcher.services import Endpoints
from remotes import RemoteError
from remotes._retry import RetryPolicy
from remotes.minio import MinioRemote
from tests.conftest import TEST_BUCKET, make_minio_remote
from tests.remotes.relay import Proxy, free_port

FAST = RetryPolicy(attempts=3, base_delay=0.02, max_delay=0.05, deadline=5)
PATIENT = RetryPolicy(attempts=200, base_delay=0.05, max_delay=0.3, deadline=30)  # deadline governs
SECRET = "Zq9-very-secret-value-7731"


def retry_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "transient error" in r.getMessage()]


def minio_port(ep: Endpoints) -> int:
    return int(ep.minio_endpoint.rsplit(":", 1)[1])


@pytest.fixture
def prefix() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def direct(minio: Endpoints, prefix: str) -> Iterator[MinioRemote]:
    r = make_minio_remote(minio, prefix)
    yield r
    r.destroy()
    r.close()


def test_server_that_comes_up_mid_retry_is_used(
    minio: Endpoints, prefix: str, direct: MinioRemote, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = Proxy(minio_port(minio))
    remote = MinioRemote(
        f"127.0.0.1:{proxy.port}", minio.minio_access_key, minio.minio_secret_key,
        TEST_BUCKET, prefix=prefix, retry=PATIENT,
    )
    timer = threading.Timer(0.5, proxy.start)
    timer.start()
    try:
        with caplog.at_level(logging.WARNING, logger="remotes"):
            remote.put_blob("late", b"made it")
        assert retry_warnings(caplog), "the first tries must have failed and been retried"
        assert direct.get_blob("late") == b"made it"
    finally:
        timer.join()
        proxy.stop()
        remote.close()


def test_slowdown_is_retried(
    minio: Endpoints, prefix: str, direct: MinioRemote, caplog: pytest.LogCaptureFixture
) -> None:
    direct.put_blob("b", b"value")
    proxy = Proxy(minio_port(minio))
    proxy.start()
    remote = MinioRemote(
        f"127.0.0.1:{proxy.port}", minio.minio_access_key, minio.minio_secret_key,
        TEST_BUCKET, prefix=prefix, retry=PATIENT,
    )
    try:
        remote.list_files()  # the bucket check happens before throttling starts
        remote.close()  # fresh connections, so the next ones pass through the throttle
        proxy.slowdowns = 2
        with caplog.at_level(logging.WARNING, logger="remotes"):
            assert remote.get_blob("b") == b"value"
        warnings = retry_warnings(caplog)
        assert len(warnings) >= 1 and all("SlowDown" in w for w in warnings)
    finally:
        proxy.stop()
        remote.close()


def test_unreachable_endpoint_fails_after_bounded_retries(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()  # nothing listens here
    remote = MinioRemote(f"127.0.0.1:{port}", "sfaas", SECRET, "some-bucket", prefix="p", retry=FAST)
    src = tmp_path / "f"
    src.write_bytes(b"data")
    with caplog.at_level(logging.WARNING, logger="remotes"):
        with pytest.raises(RemoteError) as info:
            remote.put_file("run-1", src)
    msg = str(info.value)
    assert f"127.0.0.1:{port}" in msg and "some-bucket" in msg
    assert "after 3 tries" in msg
    assert len(retry_warnings(caplog)) == FAST.attempts - 1
    # the secret appears nowhere a user or a log could see it
    seen = [msg, repr(info.value), str(info.value.__cause__), repr(remote), caplog.text]
    assert not any(SECRET in s for s in seen)


def test_wrong_secret_fails_fast_and_is_not_echoed(
    minio: Endpoints, caplog: pytest.LogCaptureFixture
) -> None:
    remote = MinioRemote(minio.minio_endpoint, minio.minio_access_key, SECRET, TEST_BUCKET, prefix="x", retry=PATIENT)
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(RemoteError) as info:
            remote.get_blob("anything")
    msg = str(info.value)
    assert minio.minio_endpoint in msg and TEST_BUCKET in msg
    assert retry_warnings(caplog) == []  # an auth error is not transient
    assert not any(SECRET in s for s in (msg, repr(info.value), str(info.value.__cause__), caplog.text))


def test_restarted_minio_keeps_data_and_stopped_minio_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # a private MinIO (own state dir and ports), stopped and restarted under the remote
    monkeypatch.setenv("SFAAS_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("SFAAS_MINIO_PORT", str(free_port()))
    monkeypatch.setenv("SFAAS_MINIO_CONSOLE_PORT", str(free_port()))
    ep = services.up(kafka=False, minio=True, progress=False)
    errors: list[BaseException] = []

    def restart() -> None:
        try:
            services.up(kafka=False, minio=True, progress=False)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    try:
        remote = MinioRemote(ep.minio_endpoint, ep.minio_access_key, ep.minio_secret_key, "restart", retry=PATIENT)
        remote.put_blob("b", b"before restart")
        fast = MinioRemote(ep.minio_endpoint, ep.minio_access_key, ep.minio_secret_key, "restart", retry=FAST)
        assert fast.get_blob("b") == b"before restart"
        services.down(kafka=False, minio=True, progress=False)

        with pytest.raises(RemoteError, match=r"object 'blobs/b': get blob failed after 3 tries"):
            fast.get_blob("b")

        timer = threading.Timer(0.8, restart)
        timer.start()
        with caplog.at_level(logging.WARNING, logger="remotes"):
            assert remote.get_blob("b") == b"before restart"
        timer.join()
        assert errors == []
        assert retry_warnings(caplog)
    finally:
        services.down(kafka=False, minio=True, progress=False)


def test_prefixes_in_one_bucket_are_isolated(minio: Endpoints, tmp_path: Path) -> None:
    base = f"iso-{uuid.uuid4().hex[:8]}"
    a = make_minio_remote(minio, f"{base}/a")
    b = make_minio_remote(minio, f"{base}/b")
    nested = make_minio_remote(minio, f"{base}/a/inner")
    src = tmp_path / "f"
    src.write_bytes(b"abc")
    try:
        a.put_file("shared-name", src)
        a.put_blob("blob", b"from a")
        from remotes import Manifest

        a.write_manifest(Manifest(1, "test", {}))
        nested.put_file("deeper", src)
        assert b.list_files() == {} and b.list_snapshots() == [] and b.get_blob("blob") is None
        assert a.list_files() == {"shared-name": 3}  # the nested prefix's file is not a's
        b.put_file("shared-name", src)
        b.destroy()
        assert a.list_files() == {"shared-name": 3} and a.get_blob("blob") == b"from a"
        a.destroy()
        assert nested.list_files() == {"deeper": 3}  # destroy removes only a's own objects
    finally:
        for r in (a, b, nested):
            r.destroy()
            r.close()


def test_missing_bucket_is_created(minio: Endpoints) -> None:
    bucket = f"sfaas-new-{uuid.uuid4().hex[:10]}"
    remote = MinioRemote(minio.minio_endpoint, minio.minio_access_key, minio.minio_secret_key, bucket)
    client = Minio(minio.minio_endpoint, minio.minio_access_key, minio.minio_secret_key, secure=False)
    try:
        assert not client.bucket_exists(bucket)
        remote.put_blob("hello", b"world")
        assert client.bucket_exists(bucket)
        assert remote.get_blob("hello") == b"world"
    finally:
        remote.destroy()
        remote.close()
        client.remove_bucket(bucket)


def test_endpoint_with_scheme_is_accepted(minio: Endpoints) -> None:
    remote = MinioRemote(
        "http://" + minio.minio_endpoint, minio.minio_access_key, minio.minio_secret_key,
        TEST_BUCKET, prefix=f"t-{uuid.uuid4().hex[:8]}",
    )
    try:
        remote.put_blob("x", b"1")
        assert remote.get_blob("x") == b"1"
        assert not remote.secure
    finally:
        remote.destroy()
        remote.close()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"bucket": "Bad_Bucket"}, "Bad_Bucket"),
        ({"bucket": "ab"}, "'ab'"),
        ({"prefix": "../up"}, "prefix"),
        ({"prefix": "a//b"}, "prefix"),
        ({"endpoint": "127.0.0.1:9000/path"}, "endpoint"),
        ({"endpoint": ""}, "endpoint"),
        ({"secret_key": ""}, "secret_key"),
    ],
)
def test_bad_constructor_arguments(kwargs: dict[str, str], match: str) -> None:
    args = {"endpoint": "127.0.0.1:9000", "access_key": "a", "secret_key": "s", "bucket": "ok-bucket", "prefix": ""}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        MinioRemote(args["endpoint"], args["access_key"], args["secret_key"], args["bucket"], prefix=args["prefix"])


def test_retry_policy_is_bounded() -> None:
    p = RetryPolicy()
    delays = [p.delay(i) for i in range(1, p.attempts)]
    assert all(0 < d <= p.max_delay for d in delays)
    assert sum(min(p.max_delay, p.base_delay * 2 ** (i - 1)) for i in range(1, p.attempts)) <= p.deadline
    with pytest.raises(ValueError, match="attempts"):
        RetryPolicy(attempts=0)


def test_bucket_deleted_under_a_live_remote_is_recreated(minio: Endpoints) -> None:
    bucket = f"sfaas-gone-{uuid.uuid4().hex[:10]}"
    remote = MinioRemote(minio.minio_endpoint, minio.minio_access_key, minio.minio_secret_key, bucket)
    client = Minio(minio.minio_endpoint, minio.minio_access_key, minio.minio_secret_key, secure=False)
    try:
        remote.put_blob("a", b"1")
        remote.destroy()
        client.remove_bucket(bucket)
        remote.put_blob("b", b"2")
        assert client.bucket_exists(bucket)
        assert remote.get_blob("b") == b"2"
    finally:
        remote.destroy()
        remote.close()
        client.remove_bucket(bucket)


def test_pickles_and_reprs_hold_no_secret_and_background_uploads_still_work(
    minio: Endpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store pickles its MinioRemote to its background upload process: the pickle carries
    a reference, not the secret key, which the process gets from its parent over its pipe
    (here its environment has no key, and it started before the remote existed)."""
    import os
    import pickle

    import statestores
    from statestores import background

    if background.mode() != "process":
        pytest.skip("background mode 'thread' (SFAAS_BACKGROUND, set_mode) runs background work in this process")
    monkeypatch.delenv("SFAAS_MINIO_SECRET_KEY", raising=False)
    background.shutdown()
    background.warm_up("upload")
    remote = make_minio_remote(minio)
    try:
        secret = minio.minio_secret_key
        assert secret.encode() not in pickle.dumps(remote) and secret not in repr(remote)
        with statestores.open("lsm", tmp_path / "db", remote=remote, sync="os") as s:
            for i in range(50):
                s.put(b"k%02d" % i, b"v%d" % i)
            info = s.snapshot(1)
            assert info.files_uploaded >= 1
            proc = background._lane("upload").proc
            assert proc is not None and proc.pid != os.getpid()  # it ran there
        with statestores.open("lsm", tmp_path / "fresh", remote=remote, sync="os") as s:
            assert s.get(b"k07") == b"v7"
    finally:
        remote.destroy()
        remote.close()


def test_a_pickled_remote_without_its_secret_in_reach_fails_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unpickled where neither the parent's credentials nor SFAAS_MINIO_SECRET_KEY are
    known, a MinioRemote says which variable to set (and not the secret)."""
    import pickle

    from remotes import credentials

    remote = MinioRemote("127.0.0.1:1", "someone", SECRET, "some-bucket", prefix="p")
    data = pickle.dumps(remote)
    monkeypatch.setattr(credentials, "_by_ref", {})
    monkeypatch.delenv("SFAAS_MINIO_SECRET_KEY", raising=False)
    with pytest.raises(RemoteError, match="SFAAS_MINIO_SECRET_KEY") as info:
        pickle.loads(data)
    assert SECRET not in str(info.value)
