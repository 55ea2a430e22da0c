"""Random operation sequences against a remote, compared step by step with a dict model.

The model mirrors what gc may do: a file referenced by a retained manifest must survive;
an unreferenced file uploaded before the newest retained manifest must go; one uploaded
after it (possibly an in-flight snapshot) may go or stay, and the model follows reality.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from launcher.services import Endpoints
from remotes import FileInfo, Manifest, Remote, SnapshotNotFoundError
from remotes.path import PathRemote
from tests.conftest import make_minio_remote

NAMES = st.sampled_from([f"run-{i}" for i in range(8)])
IDS = st.integers(min_value=0, max_value=12)
DATA = st.binary(max_size=64)


class RemoteMachine(RuleBasedStateMachine):
    """Drives one remote; subclasses say which."""

    def make_remote(self, scratch: Path) -> Remote:
        raise TypeError("RemoteMachine is abstract; use a subclass")

    def __init__(self) -> None:
        super().__init__()
        self.scratch = Path(tempfile.mkdtemp(prefix="remote-model-"))
        self.remote = self.make_remote(self.scratch)
        self.clock = itertools.count()
        self.files: dict[str, tuple[bytes, int]] = {}  # name -> (data, upload time)
        self.manifests: dict[int, tuple[Manifest, int]] = {}  # id -> (manifest, write time)
        self.blobs: dict[str, bytes] = {}

    @initialize()
    def start_empty(self) -> None:
        assert self.remote.list_files() == {}

    def teardown(self) -> None:
        try:
            self.remote.destroy()
            self.remote.close()
        finally:
            shutil.rmtree(self.scratch, ignore_errors=True)

    @rule(name=NAMES, data=DATA)
    def put_file(self, name: str, data: bytes) -> None:
        src = self.scratch / f"src-{uuid.uuid4().hex}"
        src.write_bytes(data)
        assert self.remote.put_file(name, src) == len(data)
        self.files[name] = (data, next(self.clock))

    @rule(name=NAMES)
    def get_file(self, name: str) -> None:
        dst = self.scratch / "dst"
        if name in self.files:
            assert self.remote.get_file(name, dst) == len(self.files[name][0])
            assert dst.read_bytes() == self.files[name][0]
        else:
            with pytest.raises(Exception, match=name):
                self.remote.get_file(name, dst)

    @rule(name=NAMES)
    def delete_file(self, name: str) -> None:
        self.remote.delete_file(name)
        self.files.pop(name, None)

    @precondition(lambda self: bool(self.files))
    @rule(sid=IDS, pick=st.sets(NAMES, max_size=4))
    def snapshot(self, sid: int, pick: set[str]) -> None:
        # write-then-publish: reference only files that are already uploaded
        names = [n for n in pick if n in self.files]
        m = Manifest(
            sid, "model", {n: FileInfo(len(self.files[n][0]), crc32c(self.files[n][0])) for n in names}
        )
        self.remote.write_manifest(m)
        self.manifests[sid] = (m, next(self.clock))

    @rule(sid=IDS)
    def delete_snapshot(self, sid: int) -> None:
        self.remote.delete_snapshot(sid)
        self.manifests.pop(sid, None)

    @rule(sids=st.lists(IDS, max_size=3))
    def delete_snapshots(self, sids: list[int]) -> None:
        self.remote.delete_snapshots(sids)
        for sid in sids:
            self.manifests.pop(sid, None)

    @rule(sid=IDS)
    def read_manifest(self, sid: int) -> None:
        if sid in self.manifests:
            assert self.remote.read_manifest(sid) == self.manifests[sid][0]
        else:
            with pytest.raises(SnapshotNotFoundError):
                self.remote.read_manifest(sid)

    @rule(name=st.sampled_from(["g", "h"]), data=DATA)
    def put_blob(self, name: str, data: bytes) -> None:
        self.remote.put_blob(name, data)
        self.blobs[name] = data

    @rule(keep=st.integers(min_value=1, max_value=4))
    def gc(self, keep: int) -> None:
        ids = sorted(self.manifests)
        retained, dropped = ids[-keep:], ids[:-keep]
        referenced = {n for sid in retained for n in self.manifests[sid][0].files}
        horizon = self.manifests[retained[-1]][1] if retained else -1
        must_go = {n for n, (_, t) in self.files.items() if n not in referenced and t < horizon}
        may_go = {n for n, (_, t) in self.files.items() if n not in referenced and t > horizon}

        info = self.remote.gc(keep)

        assert info.snapshots_deleted == dropped
        for sid in dropped:
            del self.manifests[sid]
        present = set(self.remote.list_files())
        assert not (must_go & present), f"gc left unreferenced old files {must_go & present}"
        assert set(self.files) - must_go - may_go <= present, "gc deleted a file it must keep"
        gone = must_go | (may_go - present)
        assert info.files_deleted == len(gone)
        assert info.bytes_deleted == sum(len(self.files[n][0]) for n in gone)
        for n in gone:
            del self.files[n]

    @invariant()
    def listings_match(self) -> None:
        assert self.remote.list_files() == {n: len(d) for n, (d, _) in self.files.items()}
        assert self.remote.list_snapshots() == sorted(self.manifests)
        for name in ("g", "h"):
            assert self.remote.get_blob(name) == self.blobs.get(name)


class PathMachine(RemoteMachine):
    def make_remote(self, scratch: Path) -> Remote:
        return PathRemote(scratch / "remote")


_SETTINGS = settings(
    max_examples=40,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

TestPathRemoteModel = PathMachine.TestCase
TestPathRemoteModel.settings = _SETTINGS


@pytest.fixture
def minio_machine(minio: Endpoints) -> type[RemoteMachine]:
    class MinioMachine(RemoteMachine):
        def make_remote(self, scratch: Path) -> Remote:
            return make_minio_remote(minio)

    return MinioMachine


def test_minio_remote_model(minio_machine: type[RemoteMachine]) -> None:
    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(
        minio_machine,
        settings=settings(_SETTINGS, max_examples=15, stateful_step_count=20),
    )
