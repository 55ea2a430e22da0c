# A Kafka broker (KRaft, combined broker + controller) from the jars the project fetches with
# Maven (launcher/kafka_broker.py, ensure_kafka_libs): libs/ beside this file in the build
# context. kafka-entry.sh writes server.properties from KAFKA_* variables (see there).
ARG DEBIAN=local/debian:bookworm
FROM ${DEBIAN}
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/*
COPY libs/ /opt/kafka/libs/
COPY kafka-entry.sh log4j2.yaml /opt/kafka/
VOLUME /var/lib/kafka
ENTRYPOINT ["bash", "/opt/kafka/kafka-entry.sh"]
