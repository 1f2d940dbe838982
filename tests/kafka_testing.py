"""Helpers for the tests of the log transport over Kafka (the broker itself is the session fixture
`kafka_broker` of tests/conftest.py; those tests are marked `cluster`)."""
from __future__ import annotations


def consume_all(bootstrap: str, topics: list[str]) -> list:
    """Every record of `topics`, each partition read from its start to its end as of now."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "ccs-tests", "enable.auto.commit": False,
                  "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    try:
        md = c.list_topics(timeout=10)
        parts = []
        for t in topics:
            for p in md.topics[t].partitions:
                lo, hi = c.get_watermark_offsets(TopicPartition(t, p), timeout=10)
                if hi > lo:
                    parts.append((TopicPartition(t, p, lo), hi))
        c.assign([tp for tp, _ in parts])
        left = {(tp.topic, tp.partition): hi for tp, hi in parts}
        out = []
        while left:
            msg = c.poll(10)
            assert msg is not None, f"no record within 10 s; still to read: {left}"
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise AssertionError(f"consumer error: {msg.error()}")
            out.append(msg)
            if msg.offset() + 1 >= left.get((msg.topic(), msg.partition()), 0):
                left.pop((msg.topic(), msg.partition()), None)
        return out
    finally:
        c.close()
