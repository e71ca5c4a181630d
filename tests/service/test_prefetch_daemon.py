"""The daemon with its prefetch (source.prefetch, on by default) learns exactly what it
learns without it, and a run stopped with a batch held loses nothing."""
from __future__ import annotations

import io

import numpy as np

from streamsvi.checkpoint import load_snapshot
from streamsvi.io import JsonCodec
from streamsvi.service.config import validate
from streamsvi.service.daemon import Daemon

from .conftest import blob_rows, gmm_config


def _data(tmp_path, n=1200):
    data = tmp_path / "records.jsonl"
    rows = [JsonCodec(2).encode(r) for r in blob_rows(n, seed=5)]
    rows[17] = b'{"not": "a vector"}'                  # a dead letter in the first batches
    data.write_bytes(b"\n".join(rows) + b"\n")
    return data


def _run(tmp_path, data, prefetch, name, **run):
    cfg = validate(gmm_config(tmp_path, name=name, source={"kind": "file", "path": str(data),
                                                           "prefetch": prefetch}))
    res = Daemon(cfg, out=io.StringIO()).run(**run)
    return res, load_snapshot(tmp_path / name)


def test_prefetch_learns_bit_for_bit_what_the_daemon_learns_without_it(tmp_path):
    data = _data(tmp_path)
    res_off, off = _run(tmp_path, data, False, "off", until_drained=True)
    res_on, on = _run(tmp_path, data, True, "on", until_drained=True)
    assert (res_on.records, res_on.dead, res_on.batches) == (res_off.records, res_off.dead,
                                                             res_off.batches) == (1179, 1, 24)
    assert on.offsets == off.offsets and [o["offset"] for o in on.offsets] == [1200]
    assert on.state.step == off.state.step and on.state.records_seen == off.state.records_seen
    assert set(on.state.lam) == set(off.state.lam)
    for name in off.state.lam:
        assert np.array_equal(on.state.lam[name], off.state.lam[name]), name


def test_a_run_stopped_with_a_batch_held_resumes_at_the_first_unlearned_record(tmp_path):
    data = _data(tmp_path)
    res, first = _run(tmp_path, data, True, "ck", max_batches=7)
    assert res.batches == 7                    # the 8th batch was read ahead and dropped
    resumed, last = _run(tmp_path, data, True, "ck", until_drained=True)
    _, whole = _run(tmp_path, data, False, "whole", until_drained=True)
    assert first.state.records_seen + resumed.records == whole.state.records_seen
    assert last.offsets == whole.offsets and [o["offset"] for o in last.offsets] == [1200]
