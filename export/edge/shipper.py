"""The edge's log shipper (issue 60): the files the agent, nginx and the players' beacons leave in
the contract's folder (`<root>/<stream>/<node_id>/<name>`, docs/architecture.md "Inputs") published
to the broker's topic per stream (topology/kafka.py: `ccs.transport`, `ccs.access`, `ccs.qoe`),
at least once, resumable:

    python -m ccselect.export.edge.shipper --root DIR --bootstrap 127.0.0.1:PORT [--follow SECONDS]

- **What is a record**: a line of a file the contract names (`contract.FILE_NAME`: an hourly file, a
  rotated segment, either gzipped), as batch ingest cuts them (jobs/sources.py: at each newline).
  The agent's segment being written (`.<name>.part`) is not read until renamed; folders starting
  with `_` are not logs. A line still being written (no newline yet) waits; a file's last line
  without a newline is whole once the file is: a segment or a gzip (complete when it appears), an
  hourly file once its hour is `GRACE_S` past. An entry of the folder that is not a log is reported
  in the pass's `skipped` with why, as `ccs ingest` reports it.
- **The message**: the line's bytes unchanged (one parser: the lake's, jobs/parse.py, judges it, and
  quarantines a malformed line with its reason: the shipper drops nothing), keyed by the node (the
  topic is partitioned by node: a node's records stay in order in one partition), with headers
  `ccs.stream`, `ccs.hour`, `ccs.origin` (`<stream>/<node>/<file>:<line>`) and `ccs.identity`:
  the record's identity as the lake reads it (`contract.IDENTITY`: node_id/conn_id, node_id/
  session_id, or for a request, which has no id, the SHA-256 of its fields as sorted JSON); absent
  for a line that is no JSON object. The lake keeps one row per identity (jobs/README.md
  "Identity"), so a record sent twice is deduplicated there, never here.
- **At least once, resumable**: the producer is idempotent (`enable.idempotence`, `acks=all`: the
  broker keeps no duplicate of its own retries). What the broker has acknowledged is recorded per
  file (`state.json`: the byte offset and line count of the acknowledged prefix) after every
  `batch` lines and at each file's end, written atomically; a restarted shipper starts each file
  there, so it resends at most the batch it was sending when it stopped: `batch` lines per file
  (tests/test_kafka_transport.py kills one with SIGKILL mid-pass). A record the broker refuses (or
  does not acknowledge within `FLUSH_S`) stops the pass with `ShipError` after recording the
  prefix before it; the next pass resends from there.
- Not handled yet: a file rewritten in place under the same name (its recorded offset would skip
  or split lines); the contract's writers only append or rename into place.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from confluent_kafka import Producer

from ccselect.contract import FILE_NAME, IDENTITY, STREAMS

TOPIC_PREFIX = "ccs."         # topology/kafka.py's topics (topology may import export, not the reverse)
BATCH = 5000                  # lines between two records of the state (the most a restart resends per file)
GRACE_S = 120.0               # an hourly file's last line without a newline is whole this long after its hour
FLUSH_S = 60.0                # how long a batch waits for the broker's acknowledgements
STATE = os.path.join("_shipper", "state.json")


class ShipError(RuntimeError):
    pass


@dataclass(frozen=True)
class LogFile:
    stream: str
    node_id: str
    hour: str
    path: str
    rel: str                  # <stream>/<node>/<name>: its key in the state and its origin header
    whole: bool               # its last line is whole without a newline


def topic(stream: str) -> str:
    return TOPIC_PREFIX + stream


def find(root: str, streams: tuple[str, ...] = STREAMS, now: float | None = None
         ) -> tuple[list[LogFile], list[tuple[str, str]]]:
    """(the log files under `root`, sorted; (path, why) of every other entry not read)."""
    now = time.time() if now is None else now
    found, skipped = [], []
    for stream in streams:
        sdir = os.path.join(root, stream)
        if not os.path.isdir(sdir):
            continue
        for node in sorted(os.listdir(sdir)):
            ndir = os.path.join(sdir, node)
            if node.startswith("_"):
                continue
            if not os.path.isdir(ndir):
                skipped.append((ndir, "not in a <stream>/<node_id>/ folder"))
                continue
            for name in sorted(os.listdir(ndir)):
                path = os.path.join(ndir, name)
                m = FILE_NAME.match(name)
                if name.startswith("."):
                    if not name.endswith(".part"):          # .part: a segment still being written
                        skipped.append((path, "hidden file"))
                elif not m or not os.path.isfile(path):
                    skipped.append((path, "not <YYYY-MM-DDTHH>.jsonl, a segment <YYYY-MM-DDTHHMM>[.<seq>].jsonl, "
                                          "or either .gz"))
                else:
                    hour, minute, _seq, gz = m.groups()
                    end = datetime.strptime(hour, "%Y-%m-%dT%H").replace(tzinfo=timezone.utc) + timedelta(hours=1)
                    whole = bool(minute or gz) or end.timestamp() + GRACE_S <= now
                    found.append(LogFile(stream, node, hour, path, f"{stream}/{node}/{name}", whole))
    return found, skipped


def identity(stream: str, line: bytes) -> bytes | None:
    """The record's identity as the lake reads it (module note), or None for a line that is no
    JSON object or lacks an identity field (the lake quarantines it with its reason)."""
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    if not isinstance(rec, dict):
        return None
    fields = IDENTITY[stream]
    if not fields:
        return hashlib.sha256(json.dumps(rec, sort_keys=True, separators=(",", ":")).encode()).hexdigest().encode()
    if any(rec.get(f) is None for f in fields):
        return None
    return "/".join(str(rec[f]) for f in fields).encode()


def _lines(f: LogFile, offset: int):
    """(line bytes without its newline, offset after it) of every whole line from `offset`."""
    opener = gzip.open if f.path.endswith(".gz") else open
    with opener(f.path, "rb") as fh:
        fh.seek(offset)
        pos = offset
        for line in fh:
            if not line.endswith(b"\n") and not f.whole:
                return                                  # still being written: next pass
            pos += len(line)
            yield line[:-1] if line.endswith(b"\n") else line, pos


class Shipper:
    def __init__(self, root: str, bootstrap: str, state: str | None = None, streams: tuple[str, ...] = STREAMS,
                 batch: int = BATCH, producer: dict | None = None):
        self.root = os.path.abspath(root)
        self.state_path = state or os.path.join(self.root, STATE)
        self.streams = streams
        self.batch = batch
        self.conf = {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                     "linger.ms": 20, "compression.type": "lz4",
                     # the Java clients' partitioner (murmur2 of the key): Spark's reader and Java
                     # producers put a node where this one does
                     "partitioner": "murmur2_random", "message.timeout.ms": 120_000, **(producer or {})}
        self._producer = None
        self.state = self._load()

    # ---- the state: per file, the acknowledged prefix ---------------------------------------------
    def _load(self) -> dict[str, dict]:
        try:
            with open(self.state_path) as fh:
                return json.load(fh)["files"]
        except FileNotFoundError:
            return {}

    def _save(self) -> None:
        os.makedirs(os.path.dirname(self.state_path), exist_ok=True)
        tmp = self.state_path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump({"files": self.state}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.state_path)

    @property
    def producer(self):
        if self._producer is None:
            self._producer = Producer(self.conf)
        return self._producer

    # ---- one pass ----------------------------------------------------------------------------------
    def ship(self, limit: int | None = None) -> dict:
        """Publish every whole line not yet acknowledged (at most `limit` lines); → counts:
        `sent` (lines acknowledged in this pass), `files`, `skipped` ([path, why]), `by_stream`."""
        files, skipped = find(self.root, self.streams)
        present = {f.rel for f in files}
        for gone in [k for k in self.state if k not in present]:
            del self.state[gone]                    # rotated away: nothing of it is left to send
        sent, by_stream = 0, {}
        for f in files:
            if limit is not None and sent >= limit:
                break
            n = self._ship_file(f, None if limit is None else limit - sent)
            sent += n
            if n:
                by_stream[f.stream] = by_stream.get(f.stream, 0) + n
        self._save()
        return {"sent": sent, "files": len(files), "by_stream": by_stream, "skipped": [list(s) for s in skipped]}

    def _ship_file(self, f: LogFile, limit: int | None) -> int:
        at = self.state.get(f.rel, {"offset": 0, "lines": 0})
        offset, line_no, sent = at["offset"], at["lines"], 0
        pending: list[tuple[int, int]] = []           # (line number, offset after it) produced, in order
        acked: set[int] = set()
        failed: list[str] = []

        def on_delivery(err, msg, n):
            if err is None:
                acked.add(n)
            else:
                failed.append(f"{f.rel}:{n}: {err}")

        key = f.node_id.encode()
        for line, end in _lines(f, offset):
            line_no += 1
            headers = [("ccs.stream", f.stream.encode()), ("ccs.hour", f.hour.encode()),
                       ("ccs.origin", f"{f.rel}:{line_no}".encode())]
            if (ident := identity(f.stream, line)) is not None:
                headers.append(("ccs.identity", ident))
            self._produce(topic(f.stream), key, line, headers, lambda e, m, n=line_no: on_delivery(e, m, n))
            pending.append((line_no, end))
            if len(pending) >= self.batch or (limit is not None and sent + len(pending) >= limit):
                sent += self._commit(f, pending, acked, failed)
                pending = []
                if limit is not None and sent >= limit:
                    break
        if pending:
            sent += self._commit(f, pending, acked, failed)
        return sent

    def _produce(self, topic_name, key, value, headers, cb) -> None:
        while True:
            try:
                self.producer.produce(topic_name, value=value, key=key, headers=headers, on_delivery=cb)
                self.producer.poll(0)
                return
            except BufferError:                         # the local queue is full: let it drain
                self.producer.poll(0.1)

    def _commit(self, f: LogFile, pending, acked: set[int], failed: list[str]) -> int:
        """Wait for the batch's acknowledgements, record the acknowledged prefix; → lines recorded."""
        left = self.producer.flush(FLUSH_S)
        done = 0
        for n, end in pending:
            if n not in acked:
                break
            self.state[f.rel] = {"offset": end, "lines": n}
            done += 1
        self._save()
        if done < len(pending):
            why = failed[0] if failed else f"{left} records not acknowledged within {FLUSH_S:.0f} s"
            raise ShipError(f"{f.rel}: acknowledged up to line {self.state.get(f.rel, {}).get('lines', 0)}; {why}")
        return done

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(FLUSH_S)
            self._producer = None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True, help="the contract's folder: <root>/<stream>/<node_id>/<file>")
    ap.add_argument("--bootstrap", required=True, help="the broker, host:port (topology/kafka.py: <home>/bootstrap)")
    ap.add_argument("--state", help=f"where the acknowledged prefixes are kept (default <root>/{STATE})")
    ap.add_argument("--stream", action="append", choices=STREAMS, help="only these streams (repeatable)")
    ap.add_argument("--batch", type=int, default=BATCH)
    ap.add_argument("--follow", type=float, metavar="SECONDS", help="ship again every SECONDS until stopped")
    a = ap.parse_args(argv)
    sh = Shipper(a.root, a.bootstrap, a.state, tuple(a.stream or STREAMS), a.batch)
    try:
        while True:
            print(json.dumps(sh.ship()), flush=True)
            if not a.follow:
                return 0
            time.sleep(a.follow)
    finally:
        sh.close()


if __name__ == "__main__":
    raise SystemExit(main())
