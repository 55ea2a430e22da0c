"""The local single-node Kafka broker (KRaft): its jars (fetched with Maven) and starting it."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from launcher.procs import (
    _KAFKA,
    KAFKA_VERSION,
    LOG4J_VERSION,
    SCALA_VERSION,
    Progress,
    ServiceError,
    ServiceSettings,
    _file_lock,
    _mark_auto,
    _port_open,
    _reporter,
    _spawn,
    _stop,
    _wait_ready,
    _which,
    adopt_running,
    log_tail,
)

log = logging.getLogger("launcher.services")

_POM = """<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>io.sfaas</groupId>
  <artifactId>kafka-libs</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_{scala}</artifactId>
      <version>{kafka}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j-impl</artifactId>
      <version>{log4j}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-core</artifactId>
      <version>{log4j}</version>
    </dependency>
  </dependencies>
</project>
"""


def _kafka_libs_complete(libs: Path) -> bool:
    return (libs / f"kafka_{SCALA_VERSION}-{KAFKA_VERSION}.jar").is_file() and any(
        libs.glob("log4j-slf4j-impl-*.jar")
    )


def ensure_kafka_libs(progress: Progress = True) -> Path:
    """Directory of the Kafka broker jars, downloading them with Maven if missing (~45 MB)."""
    s = ServiceSettings.from_env()
    say = _reporter(progress)
    libs = s.kafka_libs
    if _kafka_libs_complete(libs):
        return libs
    with _file_lock(s.cache_dir / ".kafka-libs.lock"):
        if _kafka_libs_complete(libs):
            return libs
        mvn = _which("mvn")
        if mvn is None:
            raise ServiceError(
                "downloading Kafka needs Maven and a JDK: "
                "`apt-get install maven openjdk-17-jre-headless`"
            )
        libs.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=libs.parent, prefix=".mvn-") as work:
            Path(work, "pom.xml").write_text(
                _POM.format(scala=SCALA_VERSION, kafka=KAFKA_VERSION, log4j=LOG4J_VERSION)
            )
            out = Path(work) / "libs"
            say(f"downloading Kafka {KAFKA_VERSION} jars with Maven (first time only)")
            res = subprocess.run(
                [mvn, "-q", "-B", "dependency:copy-dependencies", "-DincludeScope=runtime",
                 f"-DoutputDirectory={out}"],
                cwd=work, stdin=subprocess.DEVNULL, capture_output=True, text=True,
            )
            if res.returncode != 0 or not _kafka_libs_complete(out):
                raise ServiceError(
                    f"`mvn dependency:copy-dependencies` for Kafka {KAFKA_VERSION} failed "
                    f"(exit {res.returncode}):\n"
                    + "\n".join((res.stdout + res.stderr).splitlines()[-30:])
                )
            if libs.exists():
                shutil.rmtree(libs)
            os.replace(out, libs)
        say(f"Kafka jars in {libs}")
    return libs


def _java() -> str:
    java = _which("java")
    if java is None:
        raise ServiceError(
            "running Kafka needs Java >= 17: `apt-get install openjdk-17-jre-headless`")
    return java


def _kafka_properties(s: ServiceSettings, data: Path) -> str:
    return "\n".join(
        [
            "# written by sfaas.services; single-node KRaft broker+controller",
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.bootstrap.servers=127.0.0.1:{s.kafka_controller_port}",
            f"listeners=PLAINTEXT://127.0.0.1:{s.kafka_port},CONTROLLER://127.0.0.1:{s.kafka_controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{s.kafka_port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            f"log.dirs={data}",
            "num.partitions=4",
            "default.replication.factor=1",
            "min.insync.replicas=1",
            "offsets.topic.replication.factor=1",
            "offsets.topic.num.partitions=4",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "transaction.state.log.num.partitions=4",
            "share.coordinator.state.topic.replication.factor=1",
            "share.coordinator.state.topic.min.isr=1",
            "group.initial.rebalance.delay.ms=0",
            "auto.create.topics.enable=false",
            "delete.topic.enable=true",
            "num.network.threads=2",
            "num.io.threads=4",
            "log.retention.hours=24",
            "log.segment.bytes=67108864",
            "",
        ]
    )


_LOG4J2 = """Configuration:
  name: sfaas-kafka
  Appenders:
    RollingFile:
      name: file
      fileName: "{dir}/server.log"
      filePattern: "{dir}/server.log.%i"
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
      Policies:
        SizeBasedTriggeringPolicy:
          size: 20MB
      DefaultRolloverStrategy:
        max: 3
  Loggers:
    Root:
      level: INFO
      AppenderRef:
        - ref: file
    Logger:
      - name: kafka
        level: INFO
      - name: org.apache.kafka
        level: INFO
      - name: state.change.logger
        level: WARN
      - name: kafka.request.logger
        level: WARN
"""


def _kafka_usable(s: ServiceSettings) -> bool:
    """The broker answers a metadata request listing at least one broker."""
    if not _port_open(s.kafka_port):
        return False
    result: list[bool] = [False]

    async def probe() -> None:
        from aiokafka.admin import AIOKafkaAdminClient

        admin = AIOKafkaAdminClient(
            bootstrap_servers=f"127.0.0.1:{s.kafka_port}", request_timeout_ms=3000
        )
        try:
            await asyncio.wait_for(admin.start(), 5)
            cluster = await asyncio.wait_for(admin.describe_cluster(), 5)
            result[0] = bool(cluster.get("brokers"))
        finally:
            await admin.close()

    def run() -> None:
        # A private loop in a thread: works even when the caller already runs an event loop.
        try:
            asyncio.run(probe())
        except Exception as e:  # not ready yet; the caller polls again
            log.debug("Kafka probe failed: %s: %s", type(e).__name__, e)

    t = threading.Thread(target=run, name="sfaas-kafka-probe", daemon=True)
    t.start()
    t.join(15)
    return result[0]


def new_cluster_id(draw: Callable[[], bytes] = lambda: uuid.uuid4().bytes) -> str:
    """A Kafka cluster id: 16 random bytes, url-safe base64 without padding — drawn again
    when it begins with '-', as Kafka's own ``Uuid.randomUuid`` does (the storage tool
    read one such id, 1 in 64, as an option: "--cluster-id: expected one argument")."""
    while (cid := base64.urlsafe_b64encode(draw()).decode().rstrip("=")).startswith("-"):
        pass
    return cid


def _up_kafka(s: ServiceSettings, say: Callable[[str], None], *, auto: bool,
              timeout: float = 180.0) -> None:
    svc = _KAFKA
    with _file_lock(svc.lock_file(s)):
        if adopt_running(svc, s, s.kafka_port, lambda: _kafka_usable(s), timeout, say, "Kafka",
                         f"127.0.0.1:{s.kafka_port}", "a Kafka broker", "SFAAS_KAFKA_PORT"):
            return
        if _port_open(s.kafka_controller_port):
            raise ServiceError(
                f"Kafka controller port {s.kafka_controller_port} is in use; stop what uses it "
                f"or set SFAAS_KAFKA_CONTROLLER_PORT to a free port"
            )
        libs = ensure_kafka_libs(say)
        java = _java()
        home = svc.pid_file(s).parent
        data = home / "data"
        logs = home / "logs"
        data.mkdir(parents=True, exist_ok=True)
        logs.mkdir(parents=True, exist_ok=True)
        props = home / "server.properties"
        props.write_text(_kafka_properties(s, data))
        log4j = home / "log4j2.yaml"
        log4j.write_text(_LOG4J2.format(dir=logs))
        classpath = f"{libs}/*"
        jvm_log = [f"-Dlog4j2.configurationFile={log4j}", f"-Dkafka.logs.dir={logs}"]
        if not (data / "meta.properties").exists():
            cluster_id = new_cluster_id()
            say(f"formatting Kafka storage in {data} (cluster id {cluster_id})")
            res = subprocess.run(
                [java, *jvm_log, "-cp", classpath, "kafka.tools.StorageTool", "format",
                 "-t", cluster_id, "-c", str(props), "--standalone"],
                stdin=subprocess.DEVNULL, capture_output=True, text=True,
            )
            if res.returncode != 0:
                raise ServiceError(
                    f"formatting Kafka storage in {data} failed (exit {res.returncode}):\n"
                    + "\n".join((res.stdout + res.stderr).splitlines()[-30:])
                )
        argv = [
            java, f"-Xmx{s.kafka_heap}", f"-Xms{s.kafka_heap}", "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20", "-Djava.awt.headless=true", *jvm_log,
            # the collector's pauses, as Kafka's own start script logs them (stall every
            # request); the path is quoted because it may hold ':'
            f"-Xlog:gc:file=\"{logs / 'gc.log'}\":time:filecount=2,filesize=20M",
            "-cp", classpath, "kafka.Kafka", str(props),
        ]
        t0 = time.monotonic()
        pid = _spawn(svc, s, argv, dict(os.environ))
        _mark_auto(svc, s, auto)
        say(f"starting Kafka {KAFKA_VERSION} (pid {pid}), data in {data}, logs in {logs}")
        try:
            _wait_ready(svc, s, pid, lambda: _kafka_usable(s), timeout)
        except ServiceError as e:
            with contextlib.suppress(ServiceError):
                _stop(svc, s)
            raise ServiceError(f"{e}\nbroker log {logs / 'server.log'} ends with:\n"
                               f"{log_tail(logs / 'server.log')}") from None

        say(f"Kafka ready at 127.0.0.1:{s.kafka_port} in {time.monotonic() - t0:.1f}s")


# ----------------------------------------------------------------------------- public API

