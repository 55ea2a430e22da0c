#!/usr/bin/env bash
# A KRaft broker+controller in a container. Environment:
#   KAFKA_NODE_ID       this node's id (1, 2, 3, ...)
#   KAFKA_VOTERS        the controller quorum, e.g. 1@kafka-1:9093,2@kafka-2:9093,3@kafka-3:9093
#   KAFKA_HOST          this node's name on the compose network (advertised to containers)
#   KAFKA_EXTERNAL      host:port advertised to clients outside (the host's published port),
#                       served on port 19092 inside the container ("" = no external listener)
#   KAFKA_REPLICATION   replication factor of every topic (default 1)
#   KAFKA_MIN_ISR       min.insync.replicas (default 1)
#   KAFKA_CLUSTER_ID    the cluster id every node formats its storage with (same on all nodes)
#   KAFKA_HEAP          JVM heap (default 512m)
#   KAFKA_SESSION_TIMEOUT_MS       a silent broker is fenced after this (default 1000)
#   KAFKA_QUORUM_FETCH_TIMEOUT_MS  a silent active controller is replaced after this (1000)
set -euo pipefail
: "${KAFKA_NODE_ID:?KAFKA_NODE_ID is required (this broker's node id, e.g. 1)}"
: "${KAFKA_VOTERS:?KAFKA_VOTERS is required (e.g. 1@kafka:9093)}"
: "${KAFKA_HOST:?KAFKA_HOST is required (this broker's name on the network)}"
: "${KAFKA_CLUSTER_ID:?KAFKA_CLUSTER_ID is required (22 characters, the same on every node)}"
rf="${KAFKA_REPLICATION:-1}"
isr="${KAFKA_MIN_ISR:-1}"
data=/var/lib/kafka/data
conf=/var/lib/kafka/server.properties
mkdir -p "$data"
listeners="PLAINTEXT://:9092,CONTROLLER://:9093"
advertised="PLAINTEXT://${KAFKA_HOST}:9092"
protocols="CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
if [ -n "${KAFKA_EXTERNAL:-}" ]; then
  listeners="$listeners,EXTERNAL://:19092"
  advertised="$advertised,EXTERNAL://${KAFKA_EXTERNAL}"
  protocols="$protocols,EXTERNAL:PLAINTEXT"
fi
cat > "$conf" <<PROPS
process.roles=broker,controller
node.id=${KAFKA_NODE_ID}
controller.quorum.voters=${KAFKA_VOTERS}
listeners=${listeners}
advertised.listeners=${advertised}
listener.security.protocol.map=${protocols}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
log.dirs=${data}
num.partitions=4
default.replication.factor=${rf}
min.insync.replicas=${isr}
offsets.topic.replication.factor=${rf}
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=${rf}
transaction.state.log.min.isr=${isr}
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=${rf}
share.coordinator.state.topic.min.isr=${isr}
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
delete.topic.enable=true
unclean.leader.election.enable=false
# a lost broker is fenced (and dropped from every ISR, its partitions led elsewhere) after
# 1 s without a heartbeat to the controller, not the default 9 s; a lost active controller is
# replaced after 1 s without a fetch from it (default 2 s) and an election of 0.5 s: the reply
# gap of a broker loss is about these (benchmarks/README.md, "The HA compose cluster")
broker.session.timeout.ms=${KAFKA_SESSION_TIMEOUT_MS:-1000}
broker.heartbeat.interval.ms=$(( ${KAFKA_SESSION_TIMEOUT_MS:-1000} / 4 ))
controller.quorum.fetch.timeout.ms=${KAFKA_QUORUM_FETCH_TIMEOUT_MS:-1000}
controller.quorum.election.timeout.ms=$(( ${KAFKA_QUORUM_FETCH_TIMEOUT_MS:-1000} / 2 ))
replica.lag.time.max.ms=5000
num.network.threads=2
num.io.threads=4
log.retention.hours=24
log.segment.bytes=67108864
PROPS
cp=/opt/kafka/libs/*
heap="${KAFKA_HEAP:-512m}"
if [ ! -f "$data/meta.properties" ]; then
  echo "[kafka-entry] formatting $data (node ${KAFKA_NODE_ID}, cluster ${KAFKA_CLUSTER_ID})"
  java -cp "$cp" kafka.tools.StorageTool format -t "$KAFKA_CLUSTER_ID" -c "$conf"
fi
echo "[kafka-entry] node ${KAFKA_NODE_ID}: $advertised (replication $rf, min ISR $isr)"
exec java -Dlog4j2.configurationFile=/opt/kafka/log4j2.yaml "-Xmx$heap" "-Xms$heap" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true \
  -cp "$cp" kafka.Kafka "$conf"
