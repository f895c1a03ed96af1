# The two commands of the README: `make demo` and `make test`. Everything else is a helper.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV := .venv
PY := $(VENV)/bin/python
# The interpreter that creates the virtualenv: python3.11 when present, else python3 (>= 3.11).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
PYTHON := $(PYTHON)
# Spark's Python workers must run the venv's interpreter (with versiq and its dependencies).
export PYSPARK_PYTHON := $(abspath $(PY))
# The generated-client test runs ruff from PATH.
export PATH := $(abspath $(VENV))/bin:$(PATH)

# Reinstall only when pyproject.toml changes (or the venv is new).
BASE_STAMP := $(VENV)/.installed-base
DEV_STAMP := $(VENV)/.installed-dev

DEMO_ARGS ?=
DEMO_KAFKA_ARGS ?=
PYTEST_ARGS ?=
# `make test` runs the suite in two pytest-xdist workers (each with its own SparkSession, Kafka
# broker and S3 server when its tests ask for them): about 25% quicker than one on a 2-core machine,
# whose tests spend much of their time waiting for child JVMs and servers. TEST_WORKERS=0 runs it in
# one process.
TEST_WORKERS ?= 2
# pip prints ~180 lines per install: quiet unless `make V=1 ...`. Quiet also hides setuptools'
# "Editable installation" banner (a BuildBackendWarning of the editable build): a warning filter
# passed down to the build backend's interpreter (pip builds in a subprocess that inherits it).
PIP_QUIET := $(if $(V),,--quiet)
PIP_ENV := $(if $(V),,PYTHONWARNINGS=ignore::UserWarning)
# Maven, quiet and in batch mode, with no colour: -Dstyle.color=never turns Maven's own colours
# off, and Debian's Maven 3.8 (with jansi 2) still writes an ANSI reset (ESC[0m) when its console
# starts and ends unless jansi.noreset is set in the JVM's options (a -D of mvn comes too late).
MVN := MAVEN_OPTS="$$MAVEN_OPTS -Djansi.noreset=true" mvn -q -B -Dstyle.color=never

.PHONY: help demo demo-kafka test lint bench java chromium clean-demo conformance kafka s3

help:
	@echo "make demo   generate sample data, ingest it into ./warehouse, serve it on 127.0.0.1:8080"
	@echo "make test   run the whole test suite"
	@echo "make lint   ruff + mypy;  make bench  run the benchmarks;  make clean-demo  remove demo data"
	@echo "make conformance   10,000 random scenarios per store kind and operator through versiq and Kafka Streams,"
	@echo "                   from a fresh seed (VERSIQ_CONFORMANCE_SEED=N repeats one)"
	@echo "make kafka  a local Kafka broker with the sample changelog in topic 'prices';  make s3  a local S3 server"
	@echo "make demo-kafka    the Kafka round trip in one command: broker, sample, versiq ingest --continuous,"
	@echo "                   versiq serve on 127.0.0.1:8081, and a record produced then answered over HTTP"

$(PY):
	@test -n "$(PYTHON)" || { echo "Python 3.11+ is required (python3.11 or python3 on PATH)" >&2; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' || \
	  { echo "Python 3.11+ is required; $(PYTHON) is $$($(PYTHON) --version 2>&1)" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(BASE_STAMP): pyproject.toml | $(PY)
	$(PIP_ENV) $(PY) -m pip install $(PIP_QUIET) -e .
	@touch $@

$(DEV_STAMP): pyproject.toml | $(PY)
	$(PIP_ENV) $(PY) -m pip install $(PIP_QUIET) -e '.[dev]'
	@touch $@ $(BASE_STAMP)

java:
	@bash scripts/ensure-java.sh

# Debian's Chromium for the console's browser tests (driven by Playwright with the system browser).
chromium:
	@bash scripts/ensure-chromium.sh

# The Kafka Streams side of the differential tests (tests/conformance): a small Maven project whose
# artifacts are cached under .cache/m2 (git-ignored); rebuilt only when its sources change.
CONFORMANCE_JAR := conformance/kafka/target/versiq-conformance-1.jar
CONFORMANCE_SRC := conformance/kafka/pom.xml $(shell find conformance/kafka/src -name '*.java' 2>/dev/null)

$(CONFORMANCE_JAR): $(CONFORMANCE_SRC) | java
	@bash scripts/ensure-maven.sh
	$(MVN) -Dmaven.repo.local=$(abspath .cache/m2) -f conformance/kafka/pom.xml package -DskipTests
	@touch $@

# The jars Spark loads beside PySpark's own, fetched/built with Maven into .cache/jars (git-ignored),
# where versiq/ingest/spark.py finds them:
# - jars/pom.xml: Delta's Spark connector (delta-spark + delta-storage for the pinned PySpark) and
#   Spark's Kafka source, without their transitive dependencies;
# - jars/s3/pom.xml: Hadoop's S3A file system (hadoop-aws), the S3 analytics accelerator and the
#   AWS SDK v2 modules S3A uses, with their transitive dependencies minus what PySpark ships;
# - jars/logstore: versiq's Delta LogStore for S3 (conditional-put commits) and Hadoop local file
#   system (permissions without a chmod process per file), built from source.
SPARK_JARS := .cache/jars/.fetched
LOGSTORE_SRC := jars/logstore/pom.xml $(shell find jars/logstore/src -name '*.java' 2>/dev/null)

$(SPARK_JARS): jars/pom.xml jars/s3/pom.xml $(LOGSTORE_SRC) | java
	@bash scripts/ensure-maven.sh
	rm -rf .cache/jars .cache/build/logstore
	$(MVN) -Dmaven.repo.local=$(abspath .cache/m2) -f jars/pom.xml dependency:copy-dependencies \
	  -DoutputDirectory=$(abspath .cache/jars) -DexcludeTransitive=true
	$(MVN) -Dmaven.repo.local=$(abspath .cache/m2) -f jars/s3/pom.xml dependency:copy-dependencies \
	  -DoutputDirectory=$(abspath .cache/jars) -DincludeScope=runtime
	$(MVN) -Dmaven.repo.local=$(abspath .cache/m2) -f jars/logstore/pom.xml package -DskipTests
	cp .cache/build/logstore/versiq-delta-logstore-1.jar .cache/jars/
	@touch $@

# A real Apache Kafka broker for the tests (tests/kafka-broker/pom.xml: kafka_2.13 with its
# transitive dependencies and a log4j2 binding), fetched with Maven into .cache/kafka-broker
# (git-ignored); tests/support/kafka_broker.py runs it as a single-node KRaft broker.
KAFKA_BROKER := .cache/kafka-broker/.fetched

$(KAFKA_BROKER): tests/kafka-broker/pom.xml | java
	@bash scripts/ensure-maven.sh
	rm -rf .cache/kafka-broker
	$(MVN) -Dmaven.repo.local=$(abspath .cache/m2) -f tests/kafka-broker/pom.xml dependency:copy-dependencies \
	  -DoutputDirectory=$(abspath .cache/kafka-broker)
	@touch $@

# A real Confluent-compatible schema registry for the tests (tests/schema-registry/pom.xml: Apicurio
# Registry's JVM distribution from Maven Central, a Quarkus runner jar and its lib/), unpacked with
# Maven into .cache/schema-registry (git-ignored); tests/support/schema_registry.py runs it with
# H2 in a file (its schemas and ids survive a restart). The plugin's markers go to .cache/build (removed with it: stale markers would
# skip the unpacking).
SCHEMA_REGISTRY := .cache/schema-registry/.fetched

$(SCHEMA_REGISTRY): tests/schema-registry/pom.xml | java
	@bash scripts/ensure-maven.sh
	rm -rf .cache/schema-registry .cache/build/schema-registry-markers
	$(MVN) -Dmaven.repo.local=$(abspath .cache/m2) -f tests/schema-registry/pom.xml dependency:unpack-dependencies \
	  -DoutputDirectory=$(abspath .cache/schema-registry) -DmarkersDirectory=$(abspath .cache/build/schema-registry-markers)
	@touch $@

# The driver JVM's class-data-sharing archive (versiq/ingest/class_archive.py), written once per JDK,
# PySpark and recipe into .cache/jvm (git-ignored): every Spark start after it is shorter. Best
# effort: a JVM that cannot write it within CLASS_ARCHIVE_TIMEOUT seconds (a busy machine) or fails
# is killed with its process group, one line says so, and the command goes on without an archive.
CLASS_ARCHIVE := .cache/jvm/.written
CLASS_ARCHIVE_TIMEOUT ?= 300

$(CLASS_ARCHIVE): $(BASE_STAMP) $(SPARK_JARS) ingest/class_archive.py ingest/warm_up.py | java
	@$(PY) -c "from versiq.ingest.class_archive import write_class_archive as w; p = w($(CLASS_ARCHIVE_TIMEOUT)); \
	  print('JVM class archive:', p or 'none (Spark starts without one)')" || true
	@mkdir -p $(@D) && touch $@

demo: $(BASE_STAMP) java $(SPARK_JARS) $(CLASS_ARCHIVE)
	$(VENV)/bin/versiq demo $(DEMO_ARGS)

test: $(DEV_STAMP) java chromium $(SPARK_JARS) $(CLASS_ARCHIVE) $(CONFORMANCE_JAR) $(KAFKA_BROKER) \
  $(SCHEMA_REGISTRY)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

lint: $(DEV_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

bench: $(DEV_STAMP) java $(SPARK_JARS) $(CLASS_ARCHIVE) $(KAFKA_BROKER)
	@test -f bench/run.py || { echo "bench/run.py does not exist yet" >&2; exit 1; }
	$(PY) bench/run.py

# 10,000 random scenarios (VERSIQ_CONFORMANCE_SCENARIOS) for stores and for each operator, through
# versiq and Kafka Streams; prints a summary (about 30 minutes on 2 cores). Each run draws a fresh
# seed and prints it first; VERSIQ_CONFORMANCE_SEED=N repeats run N's scenarios exactly (`make test`
# runs the same tests on a fixed seed, with few scenarios).
conformance: $(DEV_STAMP) java $(SPARK_JARS) $(CONFORMANCE_JAR)
	@seed=$${VERSIQ_CONFORMANCE_SEED:-$$($(PY) -c 'import secrets; print(secrets.randbelow(2**32))')}; \
	echo "conformance: seed $$seed (VERSIQ_CONFORMANCE_SEED=$$seed make conformance repeats this run)"; \
	VERSIQ_CONFORMANCE_SEED=$$seed VERSIQ_CONFORMANCE_SCENARIOS=$${VERSIQ_CONFORMANCE_SCENARIOS:-10000} \
	  VERSIQ_CONFORMANCE_GROUP=$${VERSIQ_CONFORMANCE_GROUP:-500} \
	  $(PY) -m pytest tests/conformance -q -s -p no:cacheprovider

# The broker and S3 server the tests use, in the foreground, to try versiq by hand
# (docs/kafka-and-s3-locally.md): scripts/local_server.py prints what to set and run.
kafka: $(DEV_STAMP) java $(KAFKA_BROKER)
	$(PY) scripts/local_server.py kafka --sample demo-data

# `make kafka` and what it prints, run for you (scripts/demo_kafka.py): the broker with the sample,
# a continuous ingest of its topic, the server, and one record produced once the store is served,
# whose curl and answer it prints; Ctrl-C stops all three. DEMO_KAFKA_ARGS='--port N' serves on N.
demo-kafka: $(DEV_STAMP) java $(KAFKA_BROKER) $(SPARK_JARS) $(CLASS_ARCHIVE)
	$(PY) scripts/demo_kafka.py --sample demo-data $(DEMO_KAFKA_ARGS)

s3: $(DEV_STAMP)
	$(PY) scripts/local_server.py s3

clean-demo:
	rm -rf warehouse demo-data
