"""A stored offset past the end of the log is reported, not silently reset (issue 30, item 8).

A broker restarted empty (as tansu with memory storage is, and as a recreated
or truncated topic is on a real cluster) leaves the daemon's snapshot offsets
past the end of the log. kafka-python then goes back to the earliest offset
(``auto_offset_reset``) without a word; before the fix there was no streamsvi
warning and no metric. Now the source logs a warning naming the partition and
both offsets, and ``streamsvi_offset_resets_total{topic,partition}`` counts it;
the records the broker has now are read and applied once.
"""
import io
import logging

from prometheus_client import CollectorRegistry

from streamsvi.checkpoint import load_snapshot
from streamsvi.io import JsonCodec
from streamsvi.io.broker import LocalBroker, create_topic
from streamsvi.service.config import validate
from streamsvi.service.daemon import Daemon

from .conftest import blob_rows, gmm_config, highwater_marks, produce_raw, snapshot_offsets


def _payloads(n, seed):
    return [JsonCodec(2).encode(r) for r in blob_rows(n, seed=seed)]


def test_a_broker_restarted_empty_is_reported_and_its_new_records_applied_once(tmp_path, caplog):
    broker = LocalBroker().start()
    try:
        port, topic = broker.port, "reset-topic"
        assert create_topic(broker.bootstrap, topic, partitions=1)
        produce_raw(broker.bootstrap, topic, _payloads(300, seed=1), partitions=1)
        cfg = validate(gmm_config(tmp_path, bootstrap=broker.bootstrap, topic=topic, group="g-reset",
                                  metrics={"heldout_size": 0}))
        res = Daemon(cfg, registry=CollectorRegistry(), out=io.StringIO()).run(until_drained=True, timeout=90)
        assert res.stopped_by == "drained" and res.records == 300
        assert snapshot_offsets(load_snapshot(cfg["checkpoint"]["directory"])) == {(topic, 0): 300}

        broker.stop()                                   # memory storage: it comes back empty
        broker = LocalBroker(port=port).start()
        assert create_topic(broker.bootstrap, topic, partitions=1)
        produce_raw(broker.bootstrap, topic, _payloads(60, seed=2), partitions=1)
        registry = CollectorRegistry()
        with caplog.at_level(logging.WARNING, logger="streamsvi"):
            res = Daemon(cfg, registry=registry, out=io.StringIO()).run(until_drained=True, timeout=90)
        assert res.stopped_by == "drained" and res.records == 60
        assert registry.get_sample_value("streamsvi_offset_resets_total",
                                         {"topic": topic, "partition": "0"}) == 1
        warned = [r.getMessage() for r in caplog.records if "past the end of the log" in r.getMessage()]
        assert warned == [f"{topic}/0: the consumer was reset from offset 300 to 0: offset 300 is past "
                          f"the end of the log (the topic was recreated or truncated, or the broker lost "
                          f"its data); reading on from offset 0 (auto_offset_reset)"]
        snap = load_snapshot(cfg["checkpoint"]["directory"])
        assert snapshot_offsets(snap) == highwater_marks(broker.bootstrap, topic, 1) == {(topic, 0): 60}
        assert snap.state.records_seen == 360
    finally:
        broker.stop()
