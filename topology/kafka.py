"""The log transport's broker (issue 60): Apache Kafka in KRaft mode, one node that is both broker
and controller, started and stopped by the project: `python -m ccselect.topology.kafka up|down|status`
(`make kafka-up`, `make kafka-down`).

- **Jars**: `org.apache.kafka:kafka_2.13` and its dependencies from Maven Central, resolved by the
  Ivy that pyspark ships (the machinery behind `spark.jars.packages`, run on its own: no Spark
  session) with Ivy's default settings (Maven Central) and a cache of its own beside the jars (Spark's
  `~/.ivy2.5.2/cache` names Spark's resolvers, unknown to those settings), retrieved once into the
  virtual environment (`<venv>/kafka/<version>/lib`, `jars`). Plus log4j's SLF4J binding, which the
  server's pom leaves out (without it the broker logs nothing).
- **Node**: `process.roles=broker,controller`, node id 1, a static quorum of itself, formatted once
  by `kafka.tools.StorageTool format` with a cluster id generated at the first `up`; its log dirs,
  properties, log and pid file under `<home>` (default `<data_root>/kafka`). Listeners on loopback
  ports free at the first `up`, kept in `ports.json` and reused while free; clients read the
  broker's address from `<home>/bootstrap` (`bootstrap`).
- **Topics**: one per stream of the contract (`ccs.transport`, `ccs.access`, `ccs.qoe`), each
  `partitions` partitions. A record's key is its node (export/edge/shipper.py), and the default
  partitioner (murmur2 of the key, the Java clients' and Spark's; librdkafka's `murmur2_random`)
  puts each node's records in one partition, in order: partitioned by node.

The process goes through topology/proc.py's `Server` (own session, pid file, wait until it
listens, SIGTERM then SIGKILL of its group), as every server of the topology does.
"""
from __future__ import annotations

import argparse
import base64
import fcntl
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from ccselect.config import load_config
from ccselect.contract import STREAMS

from ccselect.topology.proc import ClusterError, Server, group_members, listening
# Imported inside the functions that use them (heavy, not needed to import this module): pyspark.

VERSION = "4.4.0"
SCALA = "2.13"
#: what the server's classpath is resolved from: the server and log4j's binding for its SLF4J 1.7 API
#: (the version of the log4j-core the server's pom brings)
MODULES = (("org.apache.kafka", f"kafka_{SCALA}", VERSION),
           ("org.apache.logging.log4j", "log4j-slf4j-impl", "2.25.5"))
TOPIC_PREFIX = "ccs."
#: partitions per topic: a node's records go to one (its key's), so this bounds a topic's readers
PARTITIONS = 4
#: one machine of 2 cores shared with Spark: a small heap (Kafka's own scripts default to 1 GiB)
HEAP = "256m"
NODE_ID = 1


def topic(stream: str) -> str:
    return TOPIC_PREFIX + stream


def jars_dir(version: str = VERSION) -> Path:
    return Path(sys.prefix) / "kafka" / version / "lib"


def ivy_jar() -> str:
    import pyspark
    found = glob.glob(os.path.join(os.path.dirname(pyspark.__file__), "jars", "ivy-*.jar"))
    if not found:
        raise ClusterError("pyspark ships no ivy-*.jar to resolve Kafka's jars with")
    return found[0]


def jars(version: str = VERSION, log=print) -> list[str]:
    """The server's classpath, resolved from Maven Central once (see the module's note)."""
    lib = jars_dir(version)
    done = lib / ".resolved"
    if done.exists():
        return sorted(str(p) for p in lib.glob("*.jar"))
    lib.parent.mkdir(parents=True, exist_ok=True)
    # two processes starting a broker at once (make test's Kafka lane and make test-cluster's, side by
    # side in .ci/run) resolve one at a time: the second finds the first's jars
    with open(lib.parent / ".resolve.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            _resolve(version, lib, log)
    return sorted(str(p) for p in lib.glob("*.jar"))


def _resolve(version: str, lib: Path, log) -> None:
    """Kafka's modules and their dependencies into `lib` (through `<lib>.part`, then renamed)."""
    if version != VERSION:
        raise ClusterError(f"only Kafka {VERSION}'s modules are pinned here, not {version}")
    tmp = lib.with_name(lib.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    deps = "\n".join(f'    <dependency org="{g}" name="{a}" rev="{v}" conf="default->default"/>'
                     for g, a, v in MODULES)
    (tmp / "ivy.xml").write_text(
        '<ivy-module version="2.0">\n  <info organisation="ccselect" module="kafka-server"/>\n'
        f'  <dependencies>\n{deps}\n  </dependencies>\n</ivy-module>\n')
    cache = lib.parent.parent / "ivy-cache"
    log(f"kafka: resolving Kafka {version}'s jars from Maven Central (Ivy cache {cache})")
    # `bundle` too: scala-logging and jackson-datatype-jdk8 are OSGi bundles, jars all the same
    r = subprocess.run(["java", "-jar", ivy_jar(), "-ivy", str(tmp / "ivy.xml"), "-confs", "default",
                        "-cache", str(cache), "-types", "jar", "bundle",
                        "-retrieve", str(tmp / "[artifact]-[revision](-[classifier]).[ext]")],
                       capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise ClusterError(f"Ivy could not resolve Kafka {version}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    (tmp / "ivy.xml").unlink()
    if not (tmp / f"kafka_{SCALA}-{version}.jar").exists():
        raise ClusterError(f"Ivy resolved no kafka_{SCALA}-{version}.jar:\n{r.stdout[-3000:]}")
    (tmp / ".resolved").write_text(f"{' '.join(':'.join(m) for m in MODULES)}\n")
    shutil.rmtree(lib, ignore_errors=True)
    os.replace(tmp, lib)


def default_home() -> Path:
    return Path(load_config().data_root) / "kafka"


class Broker:
    """The one-node broker under `home`."""

    def __init__(self, home: str | os.PathLike | None = None, partitions: int = PARTITIONS,
                 heap: str = HEAP):
        self.home = Path(home) if home else default_home()
        self.partitions = partitions
        self.heap = heap

    # ---- where it is ----------------------------------------------------------------------------
    @property
    def ports_file(self) -> Path:
        return self.home / "ports.json"

    def ports(self) -> dict[str, int] | None:
        try:
            return json.loads(self.ports_file.read_text())
        except (OSError, ValueError):
            return None

    def server(self) -> Server:
        p = self.ports()
        return Server("kafka", self.home, p["broker"] if p else None)

    def bootstrap(self) -> str:
        """The broker's client address ("127.0.0.1:port"), as the last `up` wrote it."""
        try:
            return (self.home / "bootstrap").read_text().strip()
        except OSError:
            raise ClusterError(f"no broker address under {self.home}: run `make kafka-up` first") from None

    # ---- up / down ------------------------------------------------------------------------------
    def _choose_ports(self) -> dict[str, int]:
        old = self.ports()
        if old and not any(listening("127.0.0.1", p) for p in old.values()):
            return old
        return {"broker": _free_port(), "controller": _free_port()}

    def _properties(self, ports: dict[str, int]) -> Path:
        b, c = ports["broker"], ports["controller"]
        props = {
            "process.roles": "broker,controller",
            "node.id": NODE_ID,
            "controller.quorum.voters": f"{NODE_ID}@127.0.0.1:{c}",
            "listeners": f"PLAINTEXT://127.0.0.1:{b},CONTROLLER://127.0.0.1:{c}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{b}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.home / "data"),
            "num.partitions": self.partitions,
            # one node: every internal topic has one replica
            "offsets.topic.replication.factor": 1,
            "transaction.state.log.replication.factor": 1,
            "transaction.state.log.min.isr": 1,
            "share.coordinator.state.topic.replication.factor": 1,
            "share.coordinator.state.topic.min.isr": 1,
            "group.initial.rebalance.delay.ms": 0,
            "auto.create.topics.enable": "false",   # topics are the contract's streams, made at `up`
        }
        path = self.home / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        (self.home / "log4j2.properties").write_text(
            "rootLogger.level=INFO\nrootLogger.appenderRef.out.ref=out\n"
            "appender.out.type=Console\nappender.out.name=out\n"
            "appender.out.layout.type=PatternLayout\nappender.out.layout.pattern=[%d] %p %m (%c)%n\n"
            "logger.kafka.name=org.apache.kafka\nlogger.kafka.level=WARN\n")
        return path

    def _java(self, main: str, *args: str, heap: str | None = None) -> list[str]:
        opts = [f"-Xmx{heap}", f"-Xms{heap}"] if heap else []
        classpath = self.home / "classpath.args"     # java @file: the 45 jars stay out of the log
        classpath.write_text(f"-cp\n{os.pathsep.join(jars())}\n")
        return ["java", *opts, "-XX:+UseG1GC", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self.home / 'log4j2.properties'}",
                f"@{classpath}", main, *args]

    def cluster_id(self) -> str:
        """The KRaft cluster id, generated once (a UUID in Kafka's text form: base64url, no padding).
        As Kafka's own `Uuid.randomUuid()` does (kafka-clients 4.4.0), an id whose text holds a '-'
        is drawn again: one that starts with it is taken for an option by the storage tool's
        argument parser (1 draw in 64; seen in a test run)."""
        path = self.home / "cluster.id"
        if not path.exists():
            text = "-"
            while "-" in text:
                text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            path.write_text(text + "\n")
        return path.read_text().strip()

    def up(self, timeout: float = 180.0, log=print) -> dict:
        """Format the node once, start it (a running one is left alone), make the stream topics;
        → status."""
        s = self.server()
        if not s.running():
            self.home.mkdir(parents=True, exist_ok=True)
            ports = self._choose_ports()
            self.ports_file.write_text(json.dumps(ports) + "\n")
            props = self._properties(ports)
            if not (self.home / "data" / "meta.properties").exists():
                r = subprocess.run(self._java("kafka.tools.StorageTool", "format", "-t", self.cluster_id(),
                                              "-c", str(props)), capture_output=True, text=True, timeout=300)
                if r.returncode != 0:
                    raise ClusterError(f"kafka-storage format failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
            s = self.server()
            t0 = time.monotonic()
            s.start(self._java("kafka.Kafka", str(props), heap=self.heap), timeout=timeout,
                    ready=lambda: self._serves(f"127.0.0.1:{ports['broker']}"))
            (self.home / "bootstrap").write_text(f"127.0.0.1:{ports['broker']}\n")
            log(f"kafka: broker up on 127.0.0.1:{ports['broker']} in {time.monotonic() - t0:.1f} s")
        self.create_topics()
        return self.status()

    @staticmethod
    def _serves(bootstrap: str) -> bool:
        """Whether the broker answers metadata with itself registered (unfenced)."""
        try:
            md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=2)
        except Exception:   # starting: no answer yet
            return False
        return NODE_ID in md.brokers

    def admin(self):
        return AdminClient({"bootstrap.servers": self.bootstrap()})

    def create_topics(self, streams: tuple[str, ...] = STREAMS) -> None:
        admin = self.admin()
        have = set(admin.list_topics(timeout=10).topics)
        new = [NewTopic(topic(s), num_partitions=self.partitions, replication_factor=1)
               for s in streams if topic(s) not in have]
        for name, fut in (admin.create_topics(new, operation_timeout=30).items() if new else ()):
            fut.result(timeout=60)

    def down(self) -> bool:
        """Stop the broker (SIGTERM: a controlled shutdown that flushes its logs); → whether it ran."""
        return self.server().stop(timeout=60)

    def kill(self) -> int | None:
        """SIGKILL the broker's process group, as a crash would: no controlled shutdown, so the next
        start recovers its logs. What it acknowledged stays (written to the page cache, which
        outlives the process; a power cut would not: one node, no replica). → the pid it had."""
        s = self.server()
        pid = s.pid()
        if pid is not None:
            os.killpg(pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while group_members(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if left := group_members(pid):
                raise ClusterError(f"broker processes {left} survived SIGKILL")
        s.pidfile.unlink(missing_ok=True)
        return pid

    def restart(self, timeout: float = 180.0, log=print) -> dict:
        """Start the broker again on the same data and ports (after `kill` or `down`), so its
        clients, which keep its address, find it again; → status. Refuses when a port it had is
        taken (`up` would move to free ones)."""
        ports = self.ports()
        if ports is None:
            raise ClusterError(f"no broker was started under {self.home}: nothing to restart")
        if self.server().running():
            raise ClusterError(f"the broker under {self.home} is running: kill or stop it first")
        if taken := [p for p in ports.values() if listening("127.0.0.1", p)]:
            raise ClusterError(f"the broker's ports {taken} are taken: it cannot come back at its address")
        return self.up(timeout, log)

    def status(self) -> dict:
        s = self.server()
        out = s.status()
        pid = s.pid()
        out["rss_mib"] = _rss_mib(pid) if pid else None
        if out["listening"]:
            md = self.admin().list_topics(timeout=10)
            out["topics"] = {t: len(m.partitions) for t, m in sorted(md.topics.items())
                             if t.startswith(TOPIC_PREFIX)}
        return out


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rss_mib(pid: int) -> float | None:
    """Resident memory of the process group led by `pid` (the JVM is the leader itself)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=("up", "down", "status"))
    ap.add_argument("--home", help="the broker's folder (default <data_root>/kafka)")
    ap.add_argument("--partitions", type=int, default=PARTITIONS)
    a = ap.parse_args(argv)
    b = Broker(a.home, a.partitions)
    if a.action == "up":
        print(json.dumps(b.up(), indent=1))
    elif a.action == "down":
        print("kafka: stopped" if b.down() else "kafka: was not running")
    else:
        st = b.status()
        print(json.dumps(st, indent=1))
        return 0 if st["running"] else 3
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
