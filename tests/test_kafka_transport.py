"""Logs over Kafka (issue 60), first phase: the project's own broker (app/kafka_broker.py).
One broker for the session (kafka_testing)."""
from __future__ import annotations

import pytest

from ccselect.contract import STREAMS
from kafka_testing import kafka_broker  # noqa: F401  (the session's broker)

pytestmark = [pytest.mark.cluster]


def test_broker_serves_a_topic_per_stream(kafka_broker):
    st = kafka_broker.status()
    print(f"broker: pid {st['pid']}, rss {st['rss_mib']:.0f} MiB, {st['address']}")
    assert st["running"] and st["listening"], f"broker not serving: {st}"
    assert st["topics"] == {f"ccs.{s}": kafka_broker.partitions for s in STREAMS}, \
        f"topics per stream with {kafka_broker.partitions} partitions each, got {st['topics']}"
