"""Containers: the images built offline and the compose clusters (``./run images``,
``./run cluster up|down|ps [--ha]``).

No image registry is needed. ``images`` makes a Debian base with ``debootstrap`` and
``docker import`` when it is missing (``local/debian:bookworm``), then builds on it:

- ``local/sfaas-base:bookworm``  Python 3.11 in a venv (with the build machine's extra CA
  certificates, for a proxy in front of PyPI);
- ``local/sfaas:dev``            the runtime (the repository's ``Dockerfile`` on the above);
- ``local/sfaas-kafka:dev``      KRaft brokers from the jars the project fetches with Maven;
- ``local/sfaas-minio:dev``      MinIO from the binary the project builds with Go;
- ``local/sfaas-prometheus:dev`` Prometheus from Debian's package.

``cluster`` runs ``docker-compose`` (v1, Debian's) on ``docker-compose.yml`` or, with
``--ha``, ``docker-compose.ha.yml``; it installs Docker when missing (root, apt) and starts
``dockerd`` when it is installed but not running (no systemd needed). The secrets the
processes need (``SFAAS_SECRET``, ``SFAAS_GATEWAY_TOKEN``, the MinIO key) come from the
environment or, when unset, from an env file it creates once with random values
(``~/.cache/sfaas/cluster.env``, mode 0600; its values are never printed).
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from launcher.procs import ServiceError, ServiceSettings

__all__ = ["IMAGES", "PROJECTS", "ensure_docker", "stop_docker", "build_images", "cluster",
           "compose", "running_profiles", "main"]

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "deploy" / "images"
DEBIAN = "local/debian:bookworm"
BASE = "local/sfaas-base:bookworm"
#: name → (Dockerfile, what goes into its context)
IMAGES = {
    "sfaas": "local/sfaas:dev",
    "kafka": "local/sfaas-kafka:dev",
    "minio": "local/sfaas-minio:dev",
    "prometheus": "local/sfaas-prometheus:dev",
}
#: the host's extra CA certificates, copied into the base image when present
CA_DIR = Path("/usr/local/share/ca-certificates")
MIRROR = "http://deb.debian.org/debian"
#: the secrets a cluster needs, made once per machine when the environment has none
SECRETS = ("SFAAS_SECRET", "SFAAS_GATEWAY_TOKEN", "SFAAS_MINIO_SECRET_KEY")


def _say(msg: str) -> None:
    print(f"[containers] {msg}", file=sys.stderr, flush=True)


def _run(argv: Sequence[str], *, what: str, quiet: bool = True, stdin: object = None,
         **kw: object) -> None:
    """Run ``argv`` (its input ``stdin``, else none); on failure raise naming ``what`` with
    the end of its output."""
    res = subprocess.run(list(argv), stdin=subprocess.DEVNULL if stdin is None else stdin,
                         text=True, capture_output=quiet, **kw)  # type: ignore[call-overload]
    if res.returncode != 0:
        tail = "\n".join(((res.stdout or "") + (res.stderr or "")).splitlines()[-30:])
        raise ServiceError(f"{what} failed (exit {res.returncode})"
                           + (f":\n{tail}" if tail else ""))


def _docker_up() -> bool:
    return subprocess.run(["docker", "info"], stdin=subprocess.DEVNULL,
                          capture_output=True).returncode == 0


def ensure_docker(cache: Path) -> subprocess.Popen[bytes] | None:
    """Docker and compose installed and the daemon running, or a clear error; the daemon
    if this call started it (its caller may stop it: :func:`stop_docker`)."""
    # (the engine, not just a client: some machines have a docker CLI and no dockerd)
    missing = [pkg for cmd, pkg in (("dockerd", "docker.io"), ("docker-compose", "docker-compose"),
                                    ("debootstrap", "debootstrap")) if shutil.which(cmd) is None]
    if missing:
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            raise ServiceError(f"missing {', '.join(missing)}: install them "
                               f"(e.g. `apt-get install {' '.join(missing)}`)")
        _say(f"installing {' '.join(missing)} with apt-get")
        t = time.monotonic()
        _run(["apt-get", "update", "-qq"], what="apt-get update")
        _run(["apt-get", "install", "-y", "-qq", *missing], what=f"apt-get install {missing}",
             env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
        _say(f"installed in {time.monotonic() - t:.0f} s")
    if _docker_up():
        return None
    if os.geteuid() != 0 or shutil.which("dockerd") is None:
        raise ServiceError("the Docker daemon is not running (`docker info` fails); start it "
                           "(e.g. `systemctl start docker`, or `dockerd &` as root)")
    log = cache / "dockerd.log"
    _say(f"starting dockerd (log {log})")
    with open(log, "ab") as out:
        daemon = subprocess.Popen(["dockerd"], stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                  start_new_session=True)
    deadline = time.monotonic() + 60
    while not _docker_up():
        if time.monotonic() > deadline:
            stop_docker(daemon)
            raise ServiceError(f"dockerd did not come up within 60 s; see {log}")
        time.sleep(0.5)
    return daemon


def stop_docker(daemon: subprocess.Popen[bytes]) -> None:
    """Stop a daemon :func:`ensure_docker` started (SIGTERM, then SIGKILL after 30 s)."""
    daemon.terminate()
    try:
        daemon.wait(30)
    except subprocess.TimeoutExpired:
        daemon.kill()
        daemon.wait()


def _have(image: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", image], stdin=subprocess.DEVNULL,
                          capture_output=True).returncode == 0


def _debian(cache: Path) -> None:
    """``local/debian:bookworm`` from debootstrap, unless it exists."""
    if _have(DEBIAN):
        return
    t = time.monotonic()
    with tempfile.TemporaryDirectory(dir=cache, prefix="debootstrap-") as tmp:
        root = Path(tmp) / "root"
        _say(f"debootstrap --variant=minbase bookworm (from {MIRROR}) ...")
        _run(["debootstrap", "--variant=minbase", "bookworm", str(root), MIRROR],
             what="debootstrap bookworm")
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        _run(["docker", "import", "-", DEBIAN], what="docker import", stdin=tar.stdout)
        tar.wait()
    _say(f"{DEBIAN} made in {time.monotonic() - t:.0f} s")


def _build(tag: str, dockerfile: Path, context: Path, **args: str) -> None:
    t = time.monotonic()
    argv = ["docker", "build", "-q", "-t", tag, "-f", str(dockerfile)]
    for k, v in args.items():
        argv += ["--build-arg", f"{k}={v}"]
    _run([*argv, str(context)], what=f"docker build {tag}")
    _say(f"{tag} built in {time.monotonic() - t:.0f} s")


def _context(cache: Path, name: str, files: dict[str, Path]) -> Path:
    """A build context ``cache/images/name`` holding ``files`` (name in it → source)."""
    ctx = cache / "images" / name
    if ctx.exists():
        shutil.rmtree(ctx)
    ctx.mkdir(parents=True)
    for dest, src in files.items():
        if src.is_dir():
            shutil.copytree(src, ctx / dest)
        else:
            (ctx / dest).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, ctx / dest)
    return ctx


def build_images(cache: Path, only: Sequence[str] = ()) -> None:
    """Build the images (see the module docstring); ``only``: a subset of :data:`IMAGES`."""
    from launcher.kafka_broker import ensure_kafka_libs
    from launcher.minio_server import ensure_minio_binary

    wanted = list(only) or list(IMAGES)
    for name in wanted:
        if name not in IMAGES:
            raise ServiceError(f"unknown image {name!r}: expected one of {', '.join(IMAGES)}")
    t0 = time.monotonic()
    ensure_docker(cache)
    _debian(cache)
    if "sfaas" in wanted:
        cas = {f"ca/{p.name}": p for p in sorted(CA_DIR.glob("*.crt"))} if CA_DIR.is_dir() else {}
        ctx = _context(cache, "base", {"Dockerfile": HERE / "base.Dockerfile", **cas})
        (ctx / "ca").mkdir(exist_ok=True)
        _build(BASE, ctx / "Dockerfile", ctx, DEBIAN=DEBIAN)
        _build(IMAGES["sfaas"], ROOT / "Dockerfile", ROOT, BASE=BASE)
    if "kafka" in wanted:
        libs = ensure_kafka_libs()
        ctx = _context(cache, "kafka", {"Dockerfile": HERE / "kafka.Dockerfile", "libs": libs,
                                        "kafka-entry.sh": HERE / "kafka-entry.sh",
                                        "log4j2.yaml": HERE / "log4j2.yaml"})
        _build(IMAGES["kafka"], ctx / "Dockerfile", ctx, DEBIAN=DEBIAN)
    if "minio" in wanted:
        ctx = _context(cache, "minio", {"Dockerfile": HERE / "minio.Dockerfile",
                                        "minio": ensure_minio_binary()})
        _build(IMAGES["minio"], ctx / "Dockerfile", ctx, DEBIAN=DEBIAN)
    if "prometheus" in wanted:
        ctx = _context(cache, "prometheus", {"Dockerfile": HERE / "prometheus.Dockerfile"})
        _build(IMAGES["prometheus"], ctx / "Dockerfile", ctx, DEBIAN=DEBIAN)
    _say(f"images ready in {time.monotonic() - t0:.0f} s: "
         + ", ".join(IMAGES[n] for n in wanted))


def env_file(cache: Path) -> Path:
    """The cluster's env file: secrets from the environment, else made once at random."""
    path = cache / "cluster.env"
    have: dict[str, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            k, _, v = line.partition("=")
            if k in SECRETS and v:
                have[k] = v
    values = {k: os.environ.get(k) or have.get(k) or secrets.token_urlsafe(32) for k in SECRETS}
    if values != have:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("# made by launcher/containers.py: the compose clusters' secrets\n")
            f.writelines(f"{k}={v}\n" for k, v in values.items())
    return path


#: the compose project of each profile (``--ha`` or not)
PROJECTS = {False: "sfaas", True: "sfaas-ha"}


def compose(ha: bool, *args: str, cache: Path | None = None) -> list[str]:
    """The ``docker-compose`` argv for the cluster (``ha``: the highly available one)."""
    cache = cache or ServiceSettings.from_env().cache_dir
    file = ROOT / ("docker-compose.ha.yml" if ha else "docker-compose.yml")
    return ["docker-compose", "-p", PROJECTS[ha], "-f", str(file),
            "--env-file", str(env_file(cache)), *args]


def running_profiles(stopped_too: bool = False) -> list[bool]:
    """The profiles (``ha`` or not) with running containers on this Docker host
    (``stopped_too``: with containers at all, e.g. left stopped)."""
    out = []
    for ha, project in PROJECTS.items():
        res = subprocess.run(["docker", "ps", *(["-a"] if stopped_too else []), "-q", "--filter",
                              f"label=com.docker.compose.project={project}"],
                             capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if res.returncode == 0 and res.stdout.split():
            out.append(ha)
    return out


def _port(name: str, default: int) -> str:
    """A published port: ``SFAAS_CLUSTER_<name>`` (e.g. ``KAFKA_PORT_2``), else its default."""
    return os.environ.get(f"SFAAS_CLUSTER_{name}") or str(default)


def _up(ha: bool, extra: Sequence[str], cache: Path, timeout: float) -> int:
    """``docker-compose up -d``, then wait until a call from the host would succeed
    (:func:`launcher.readiness.wait_serving`); 1 if it did not within ``timeout``."""
    from launcher.readiness import NotServing, wait_serving

    other = [h for h in running_profiles() if h != ha]
    if other:
        raise ServiceError(f"the {PROJECTS[other[0]]} cluster is running (its ports are the "
                           "same): stop it first with `./run cluster down`")
    missing = [img for img in IMAGES.values() if not _have(img)]
    if missing:
        _say(f"building the missing images first: {', '.join(missing)}")
        build_images(cache)
    t = time.monotonic()
    rc = subprocess.call(compose(ha, "up", "-d", *extra, cache=cache))
    if rc != 0 or extra:  # (some services only: no whole cluster to wait for)
        return rc
    kafka = ",".join(f"127.0.0.1:{_port(n, d)}" for n, d in
                     ([("KAFKA_PORT", 9092), ("KAFKA_PORT_2", 9093), ("KAFKA_PORT_3", 9094)]
                      if ha else [("KAFKA_PORT", 9092)]))
    status = f"http://127.0.0.1:{_port('STATUS_PORT', 9400)}"
    _say("waiting until a call from here round-trips through the cluster ...")
    try:
        ready = wait_serving(status, kafka, 3 if ha else 2, 1, timeout,
                             gateway=f"http://127.0.0.1:{_port('GATEWAY_PORT', 8080)}")
    except NotServing as e:
        _say(f"error: {e}; the cluster is left running (`./run cluster logs`, "
             "`./run cluster down`)")
        return 1
    _say(f"cluster {PROJECTS[ha]} up and serving app {ready.app!r} in "
         f"{time.monotonic() - t:.0f} s: status page {status}/, Kafka {kafka}, gateway "
         f"http://127.0.0.1:{_port('GATEWAY_PORT', 8080)}/ (token: SFAAS_GATEWAY_TOKEN in "
         f"{cache / 'cluster.env'}), Prometheus http://127.0.0.1:{_port('PROMETHEUS_PORT', 9090)}/")
    return 0


def _down(ha: bool | None, extra: Sequence[str], cache: Path) -> int:
    """Stop the cluster of profile ``ha``; None: whichever profiles are running (both, if
    both are), so the next ``up`` or ``sfaas services up`` finds its ports free."""
    profiles = [ha] if ha is not None else (running_profiles(stopped_too=True) or [False])
    rc = 0
    for h in profiles:
        _say(f"stopping {PROJECTS[h]}")
        rc = subprocess.call(compose(h, "down", "--volumes", "--remove-orphans", *extra,
                                     cache=cache)) or rc
    return rc


def cluster(action: str, ha: bool | None, extra: Sequence[str] = (),
            timeout: float = 300.0) -> int:
    """``./run cluster ACTION``; ``ha`` None (no ``--ha``): the default profile, but
    ``down`` stops whichever profiles run, and ``ps``/``logs`` show the one that runs."""
    cache = ServiceSettings.from_env().cache_dir
    cache.mkdir(parents=True, exist_ok=True)
    ensure_docker(cache)
    if action == "down":
        return _down(ha, extra, cache)
    if ha is None:
        running = running_profiles()
        ha = running[0] if action in ("ps", "logs") and len(running) == 1 else False
    if action == "up":
        return _up(ha, extra, cache, timeout)
    if action == "ps":
        return subprocess.call(compose(ha, "ps", *extra, cache=cache))
    if action == "logs":
        return subprocess.call(compose(ha, "logs", "--tail", "200", *extra, cache=cache))
    raise ServiceError(f"unknown cluster action {action!r}: expected up, down, ps or logs")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="./run", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    im = sub.add_parser("images", help="build the images (a local Debian base when missing)")
    im.add_argument("only", nargs="*", metavar="IMAGE", help=f"some of: {', '.join(IMAGES)}")
    cl = sub.add_parser("cluster", help="run a compose cluster")
    cl.add_argument("action", choices=["up", "down", "ps", "logs"])
    cl.add_argument("--ha", action="store_const", const=True, default=None,
                    help="3 Kafka brokers (RF 3), MinIO on 4 nodes, 3 workers with standbys "
                         "(without it, `down` stops whichever profile runs)")
    cl.add_argument("--timeout", type=float, default=300.0,
                    help="`up`: seconds to wait until a call from here succeeds (default 300)")
    cl.add_argument("extra", nargs="*", help="passed to docker-compose (e.g. service names)")
    a = p.parse_args(argv)
    try:
        if a.cmd == "images":
            build_images(ServiceSettings.from_env().cache_dir, a.only)
            return 0
        return cluster(a.action, a.ha, a.extra, a.timeout)
    except ServiceError as e:
        _say(f"error: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
