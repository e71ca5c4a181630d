"""Bad records never reach the model: they go to the dead-letter topic or file, counted.

Good rows and bad messages are mixed on the input; after draining, the model
has seen exactly the good rows (minus the held-out reservoir), the dead-letter
sink holds exactly the bad messages with their reason codes and source
positions, and ``streamsvi_records_dead_lettered_total{reason=...}`` agrees.
"""
import base64
import io
import json
from collections import Counter

from prometheus_client import CollectorRegistry

from streamsvi.checkpoint import load_snapshot
from streamsvi.io import JsonCodec
from streamsvi.service.config import validate
from streamsvi.service.daemon import Daemon

from .conftest import (blob_rows, committed_offsets, gmm_config, highwater_marks, produce_raw,
                       read_topic, snapshot_offsets)

MAX_BYTES = 200
MAX_ABS = 1000.0

#: (payload, reason): every kind of bad message the JSON codec and the validator know.
BAD = [
    (b"[1.0, 2.0", "json_invalid"),                         # malformed JSON
    (b"{not json}", "json_invalid"),
    (b"\xff\xfe[1, 2]", "json_invalid"),                    # not UTF-8
    (b"", "json_invalid"),                                  # empty message
    (b"[1.0, 2.0, 3.0]", "wrong_shape"),                    # three values for D = 2
    (b"[[1.0, 2.0]]", "wrong_shape"),                       # nested
    (b'"1.0, 2.0"', "wrong_shape"),                         # a string, not an array
    (b"[NaN, 1.0]", "non_finite"),                          # the JSON token NaN
    (b"[1.0, -Infinity]", "non_finite"),
    (b"[1e400, 0.0]", "non_finite"),                        # parses to inf
    (b"[null, 1.0]", "not_numeric"),                        # NaN sent as null
    (b"[true, 1.0]", "not_numeric"),
    (b'{"y": [1.0, 2.0]}', "missing_field"),
    (b"[5000.0, 1.0]", "out_of_range"),                     # |x| > max_abs
    (b"[1" + b"0" * 330 + b", 0]", "too_large"),            # also out of float range, but too long first
    (b"[1.0, " + b" " * 300 + b"2.0]", "too_large"),        # valid JSON, too many bytes
]


def _bad_int_out_of_range():
    # an integer too large for a float64, short enough to pass the size check
    return b"[1" + b"0" * 190 + b", 0]"


def _mixed_messages(n_good, seed):
    """Good rows with the bad messages spread among them; returns (payloads, is_bad, reason)."""
    good = [JsonCodec(2).encode(r) for r in blob_rows(n_good, seed=seed)]
    bad = BAD + [(_bad_int_out_of_range(), "out_of_range")]
    payloads, reasons = [], []
    step = n_good // (len(bad) + 1)
    gi = 0
    for payload, reason in bad:
        payloads += good[gi:gi + step]
        reasons += [None] * step
        gi += step
        payloads.append(payload)
        reasons.append(reason)
    payloads += good[gi:]
    reasons += [None] * (n_good - gi)
    return payloads, reasons


def test_bad_messages_go_to_the_dead_letter_topic_with_reason_and_position(
        kafka_broker, new_topic, new_group, tmp_path):
    bootstrap, topic, dead_topic, group = kafka_broker.bootstrap, new_topic(3), new_topic(1), new_group()
    n_good, H = 600, 10
    payloads, reasons = _mixed_messages(n_good, seed=4)
    positions = produce_raw(bootstrap, topic, payloads, partitions=3)
    expected = sorted((reason, topic, p, off, payload)
                      for (p, off), payload, reason in zip(positions, payloads, reasons) if reason)
    cfg = validate(gmm_config(tmp_path, bootstrap=bootstrap, topic=topic, group=group,
                              source={"dead_letter_topic": dead_topic},
                              inference={"max_wait_seconds": 0.5},
                              validation={"max_abs": MAX_ABS, "max_message_bytes": MAX_BYTES},
                              metrics={"heldout_size": H}))
    registry = CollectorRegistry()
    res = Daemon(cfg, registry=registry, out=io.StringIO()).run(until_drained=True, timeout=60)
    assert res.stopped_by == "drained"
    assert res.dead == len(expected) and res.records == n_good - H

    snap = load_snapshot(cfg["checkpoint"]["directory"])
    assert snap.state.records_seen == n_good - H                     # no bad record reached λ
    assert registry.get_sample_value("streamsvi_records_consumed_total") == n_good - H

    letters = [json.loads(v) for _, _, v in read_topic(bootstrap, dead_topic)]
    got = sorted((d["reason"], d["source"], d["partition"], d["offset"],
                  base64.b64decode(d["payload_b64"])) for d in letters)
    assert got == expected                                           # exactly the bad ones, once each
    assert all(d["message"] and d["row"] is None for d in letters)

    by_reason = Counter(r for r in reasons if r)
    for reason, count in by_reason.items():
        assert registry.get_sample_value("streamsvi_records_dead_lettered_total",
                                         {"reason": reason}) == count, reason
    assert set(by_reason) == {"json_invalid", "wrong_shape", "non_finite", "not_numeric",
                              "missing_field", "out_of_range", "too_large"}

    # dead letters count as consumed: the committed offsets cover them
    hw = highwater_marks(bootstrap, topic, 3)
    assert sum(hw.values()) == len(payloads)
    assert snapshot_offsets(snap) == hw == committed_offsets(bootstrap, group, topic, 3)


def test_file_source_bad_lines_go_to_the_dead_letter_file(tmp_path):
    n_good, H = 300, 10
    payloads, reasons = _mixed_messages(n_good, seed=6)
    lines, expected = [], []
    for payload, reason in zip(payloads, reasons):
        if payload == b"":                  # an empty line is skipped, not a dead letter
            lines.append(b"")
            continue
        if b"\n" in payload:
            continue
        lines.append(payload)
        if reason:
            expected.append((len(lines) - 1, reason, payload))
    data = tmp_path / "records.jsonl"
    data.write_bytes(b"\n".join(lines) + b"\n")
    dead_path = tmp_path / "dead" / "letters.jsonl"
    cfg = validate(gmm_config(tmp_path, source={"kind": "file", "path": str(data), "format": "jsonl",
                                                "dead_letter_path": str(dead_path)},
                              inference={"n_total": "auto"},
                              validation={"max_abs": MAX_ABS, "max_message_bytes": MAX_BYTES},
                              metrics={"heldout_size": H}))
    registry = CollectorRegistry()
    res = Daemon(cfg, registry=registry, out=io.StringIO()).run(until_drained=True, timeout=60)
    assert res.stopped_by == "drained"
    snap = load_snapshot(cfg["checkpoint"]["directory"])
    assert snap.state.records_seen == n_good - H
    assert snap.engine.n_total == len(lines)              # n_total = auto: the file's lines
    assert snapshot_offsets(snap) == {(str(data), 0): len(lines)}

    letters = [json.loads(line) for line in dead_path.read_text().splitlines()]
    got = sorted((d["offset"], d["reason"], base64.b64decode(d["payload_b64"])) for d in letters)
    assert got == sorted(expected)
    assert {d["source"] for d in letters} == {str(data)} and {d["partition"] for d in letters} == {0}
    for reason, count in Counter(r for _, r, _ in expected).items():
        assert registry.get_sample_value("streamsvi_records_dead_lettered_total",
                                         {"reason": reason}) == count, reason
