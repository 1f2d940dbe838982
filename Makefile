# ccselect — the two commands are `make run` and `make test`; both call `make setup`.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
SYSSTAMP := $(VENV)/.sysdeps
export CCS_HOME := $(CURDIR)
# Debian packages the kernel side, the headless-browser tests, the agent, the topology's Postgres and
# monitoring (Prometheus, Alertmanager, node_exporter; promtool for the rules' tests), our JVM
# functions (javac: ccselect/spark.py udf_jar) and the edge's Kafka producer bench (librdkafka) need.
DEB_PKGS := clang llvm libbpf-dev bpftool libelf-dev zlib1g-dev libssl-dev libcjson-dev pkg-config iproute2 chromium \
            postgresql openjdk-17-jdk-headless prometheus prometheus-alertmanager prometheus-node-exporter \
            librdkafka-dev

.PHONY: help setup run test test-cluster bench results clean sysdeps python warm mlflow airflow notebooks \
        cluster-up cluster-down cluster-status kafka-up kafka-down kafka-status test-kafka test-loop
help:
	@echo "make run    - set up, then run the main job on the embedded default (infra/conf/local.yaml)"
	@echo "make test   - set up, then run the whole test suite"
	@echo "make bench  - run the benchmarks in bench/ (JSON under bench/results/ and var/bench/), then make results"
	@echo "make results - render docs/results/ from the JSON the benches, make run and ccs evaluate/emulate wrote"
	@echo "make setup  - install everything (.venv, Debian packages when root, Delta jars, the Spark drivers' class archive)"
	@echo "make mlflow / make airflow / make notebooks - the MLflow UI (:5000), Airflow UI (:8080), JupyterLab (:8888)"
	@echo "make cluster-up / cluster-down / cluster-status - the production topology on this machine (infra/conf/cluster-local.yaml)"
	@echo "make test-cluster - the tests that bring that topology up (CI runs them beside make test)"
	@echo "make kafka-up / kafka-down / kafka-status - the log transport's Kafka broker (KRaft, one node; KAFKA_HOME, default <data_root>/kafka)"
	@echo "make test-loop - the rollout loop through the stream (real agents, ccs simulate --follow, ccs stream, the canary's gate on silver); not in CI"
	@echo "make test-kafka - the Kafka lane alone: the stream's exactly-once test (a kill, a broker restart, a producer retry) and one lake from both sources (make test runs it too)"

# The eBPF enforcer and the ccs-edge agent (export/edge/build.mk); built when root (needs clang/libbpf).
-include export/edge/build.mk

setup: python sysdeps warm
	@if [ "$$(id -u)" = 0 ]; then $(MAKE) --no-print-directory edge; else echo "not root: not building the eBPF enforcer"; fi

python: $(STAMP)

# Re-install only when the lock or the package metadata changed.
$(STAMP): requirements.lock pyproject.toml
	@command -v uv >/dev/null 2>&1 || python3 -m pip install -q uv
	@[ -x $(PY) ] || uv venv -q --python 3.11 $(VENV)
	uv pip install -q --compile-bytecode --python $(PY) -r requirements.lock
	uv pip install -q --python $(PY) --no-deps -e .
	@touch $@

sysdeps: $(SYSSTAMP)

$(SYSSTAMP): Makefile
	@if [ "$$(id -u)" = 0 ]; then \
	  missing=""; for p in $(DEB_PKGS); do \
	    dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$p"; done; \
	  if [ -n "$$missing" ]; then \
	    echo "installing Debian packages:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  fi; \
	  mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf || true; \
	else echo "not root: skipping Debian packages (kernel tests will skip)"; fi
	@mkdir -p $(VENV) && touch $@

# Fetch the Delta Lake jars from Maven Central once (cached in ~/.ivy2*), so tests start warm.
warm: $(VENV)/.spark-warm
$(VENV)/.spark-warm: $(STAMP)
	$(PY) -m ccselect.spark --warm
	@touch $@

run: setup
	$(PY) -m ccselect.app.cli run

# A second pytest runs beside the main one (issue 63: `.ci/run` within 45 minutes on 2 cores): the
# kernel tests that start no Spark (no `spark`, `main_job`, `small_lake` or `small_fleet` fixture),
# which mostly wait on the agent, the kernel and the clock, then the tests that need a Spark session
# but none of the session-wide lakes, fleets or champions (`main_job`, `small_lake`, `small_fleet`,
# `lake_with_champion`, `kafka_broker`): they build what they read, so a second session costs them
# only its start. Measured at 655f002 (fresh clone, .ci/run): the cores were busy 98% of the time
# until the cluster suite ended, then 74% over the main run's last 640 s alone; the second group was
# 500 s of that main run. Its output follows the main run's; either failing fails `make test`.
SESSION_FIXTURES := main_job|small_lake|small_fleet|lake_with_champion|kafka_broker
KERNEL_BESIDE = $(shell grep -L -E '\b(spark|$(SESSION_FIXTURES))\b' tests/kernel/test_*.py)
SPARK_BESIDE = $(shell grep -l -E '\bspark\b' tests/test_*.py | xargs grep -L -E '\b($(SESSION_FIXTURES))\b' \
                 | xargs grep -L -E 'pytest\.mark\.(cluster|kafka)|kafka_stream')
# The Kafka lane (tests/test_kafka_stream.py, test_kafka_lake_types.py, issue 60) ends the second group: it
# starts when the others beside are done, about twelve minutes before the main run ends, with the broker the
# kafka_broker fixture brings up and this group's Spark session.
KAFKA_LANE := tests/test_kafka_lake_types.py tests/test_kafka_stream.py
BESIDE = $(KERNEL_BESIDE) $(SPARK_BESIDE) $(KAFKA_LANE)
BESIDE_LOG := var/test-beside.log

test: setup
	@mkdir -p var; echo "beside (output in $(BESIDE_LOG) until the main run ends): $(BESIDE)"; \
	$(if $(BESIDE),$(PY) -m pytest -q -p no:cacheprovider --durations=10 -m "not cluster and not rollout_loop" $(BESIDE),true) \
	  >$(BESIDE_LOG) 2>&1 & beside=$$!; \
	trap 'kill $$beside 2>/dev/null' INT TERM; \
	$(PY) -m pytest -q -p no:cacheprovider --durations=15 -m "not cluster and not rollout_loop" $(addprefix --ignore=,$(BESIDE)); \
	rc=$$?; wait $$beside; krc=$$?; \
	echo "---- the tests run beside ($(BESIDE_LOG)):"; cat $(BESIDE_LOG); \
	echo "make test: main run exit $$rc, tests beside exit $$krc"; exit $$(( rc || krc ))

# The production topology on one machine (topology/): Spark standalone, s3proxy, Postgres,
# the MLflow server, Airflow's scheduler. `ccs cluster status` exits 3 when a part is down.
CLUSTER_CONF ?= infra/conf/cluster-local.yaml
cluster-up: setup
	$(PY) -m ccselect.app.cli cluster up --config $(CLUSTER_CONF)
cluster-down: python
	$(PY) -m ccselect.app.cli cluster down --config $(CLUSTER_CONF)
cluster-status: python
	$(PY) -m ccselect.app.cli cluster status --config $(CLUSTER_CONF)

# The log transport's broker (topology/kafka.py, issue 60): Kafka in KRaft mode, its jars from
# Maven Central on the first `up` (cached in the venv), topics per stream. Its address: <home>/bootstrap.
KAFKA_HOME ?=
KAFKA_ARGS = $(if $(KAFKA_HOME),--home $(KAFKA_HOME))
kafka-up: setup
	$(PY) -m ccselect.topology.kafka up $(KAFKA_ARGS)
kafka-down: python
	$(PY) -m ccselect.topology.kafka down $(KAFKA_ARGS)
kafka-status: python
	$(PY) -m ccselect.topology.kafka status $(KAFKA_ARGS)

test-cluster: setup
	$(PY) -m pytest -q -p no:cacheprovider --durations=15 -m "cluster and not kafka_stream"

# The Kafka lane alone (KAFKA_LANE above; make test runs it at the end of its tests beside the main run): the
# stream's exactly-once test (tests/test_kafka_stream.py, issue 60: a kill, a broker restart and a producer
# retry in two `ccs stream` processes) and one lake from both sources (tests/test_kafka_lake_types.py, no
# broker); 330 s on a quiet 2-core machine (178 s and 106 s of calls, 2026-11-30).
test-kafka: setup
	$(PY) -m pytest -q -p no:cacheprovider --durations=5 -m kafka_stream

# The rollout loop through the stream (issue 58, tests/kernel/test_rollout_loop.py): real agents, ccs simulate
# --follow, ccs stream and the canary's gate reading silver, end to end; minutes on 2 cores (two Spark
# sessions), so not in make test or .ci/run. Needs root (the agents).
test-loop: setup
	$(PY) -m pytest -q -p no:cacheprovider --durations=5 -m rollout_loop

# bench/edge_produce.c (issue 60): the agent's segment writes against librdkafka producing in-process
export/build/edge-produce: bench/edge_produce.c
	@mkdir -p $(@D)
	$(CC) -O2 -g -Wall -Wextra -o $@ $< -lrdkafka

# bench/ingest's issue figure is 5 million connections (hours at today's speed):
# `make bench BENCH_INGEST_CONNS=5000000`.
BENCH_INGEST_CONNS ?= 200000
# the issues' sizes: BENCH_TRAIN_ROWS=500000 (issue 4), BENCH_EXPORT_ROWS=5000000 (issue 7)
BENCH_TRAIN_ROWS ?= 500000
BENCH_EXPORT_ROWS ?= 5000000
bench: setup
	@mkdir -p bench/results
	$(PY) bench/simulate.py
	$(PY) bench/kernel.py
	$(PY) bench/metrics_cost.py
	$(PY) bench/ingest.py --conns $(BENCH_INGEST_CONNS)
	$(PY) bench/train.py --rows $(BENCH_TRAIN_ROWS)
	$(PY) bench/infer.py
	$(PY) bench/export.py --rows $(BENCH_EXPORT_ROWS)
	$(PY) bench/autoplex.py
	$(PY) bench/invariance.py
	$(PY) bench/freshness.py
	$(PY) bench/capacity.py
	$(PY) bench/report.py

results: python
	$(PY) bench/report.py

mlflow: python
	$(PY) -m ccselect.app.ui mlflow

airflow: python
	$(PY) -m ccselect.app.ui airflow

notebooks: python
	$(PY) -m ccselect.app.ui notebooks

# The local fleet's enforcement first (make run attached it; ccs undeploy says what it could not
# remove and stops the clean), while the agent it detaches with is still built.
clean:
	@if [ "$$(id -u)" = 0 ] && [ -x export/build/ccs-edge ] && [ -f $(STAMP) ]; then $(PY) -m ccselect.app.cli undeploy; fi
	rm -rf var bench/results/*.json export/build
