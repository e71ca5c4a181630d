"""``[model] prior_from = "data"`` (or "auto" on nearly collinear columns): the daemon computes m0 and W0 from the
records of its start (the first ``init_batches`` = 4 minibatches) once; a restarted daemon resumes with the
snapshot's prior, never recomputing it.

Real CLI (``streamsvi run --until-drained``) against the real broker. The second
run starts on records from elsewhere (shifted by +6): a prior recomputed from its
first minibatch would differ, and the final λ would not be the uninterrupted run's.
"""
import numpy as np
import pytest

from streamsvi.checkpoint import load_snapshot
from streamsvi.io import JsonCodec, produce_rows

from .conftest import blob_rows, gmm_config, write_config

BATCH = 25
START = 4 * BATCH      # the GMM's default init_batches = 4: the start sees the first 100 records


def _config(tmp_path, bootstrap, topic, group, name, prior_from):
    raw = gmm_config(tmp_path, bootstrap=bootstrap, topic=topic, group=group, name=f"ck-{name}",
                     model={"prior_from": prior_from, "scale": None, "n_features": 3},
                     inference={"batch_size": BATCH, "max_wait_seconds": 3.0, "n_total": 400},
                     checkpoint={"every_batches": 1, "every_seconds": 3600.0, "keep": 2},
                     metrics={"enabled": False, "heldout_size": 0})
    return write_config(tmp_path / f"{name}.toml", raw), tmp_path / f"ck-{name}"


def _collinear(x):
    """A third column nearly equal to the first: condition number ~1e5, so "auto" takes the data prior."""
    return np.column_stack([x[:, 0], x[:, 1], x[:, 0] + 0.01 * x[:, 1]])


@pytest.mark.parametrize("prior_from", ["data", "auto"])
def test_resume_keeps_the_prior_computed_from_the_start(kafka_broker, new_topic, new_group,
                                                                  tmp_path, daemons, prior_from):
    bootstrap, topic = kafka_broker.bootstrap, new_topic(1)
    first = _collinear(blob_rows(200, seed=11) * np.array([1.0, 3.0]))
    later = _collinear(blob_rows(200, seed=12) + 6.0)
    produce_rows(bootstrap, topic, first, JsonCodec(3))

    cfg, ck_dir = _config(tmp_path, bootstrap, topic, new_group(), "resumed", prior_from)
    d = daemons(cfg, "--until-drained", tag="first")
    assert d.wait(120) == 0, d.stderr()[-3000:]
    before = load_snapshot(ck_dir)
    assert before.state.records_seen == 200
    params = before.engine.model.get_params()
    assert params["prior_from"] == prior_from
    np.testing.assert_allclose(params["mean"], first[:START].mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(np.linalg.inv(params["scale"]), np.cov(first[:START].T), rtol=1e-3, atol=1e-6)

    produce_rows(bootstrap, topic, later, JsonCodec(3))
    d = daemons(cfg, "--until-drained", tag="second")
    assert d.wait(120) == 0, d.stderr()[-3000:]
    assert "resumed from snapshot" in d.stderr() + d.stdout_path.read_text(), d.stderr()[-3000:]
    after = load_snapshot(ck_dir)
    assert after.state.records_seen == 400
    assert after.engine.model.get_params() == params                  # the snapshot's prior, kept
    assert np.array_equal(after.engine.model.prior()._flat, before.engine.model.prior()._flat)

    ref_cfg, ref_dir = _config(tmp_path, bootstrap, topic, new_group(), "reference", prior_from)
    ref = daemons(ref_cfg, "--until-drained", tag="reference")
    assert ref.wait(120) == 0, ref.stderr()[-3000:]
    reference = load_snapshot(ref_dir)
    assert reference.engine.model.get_params() == params
    assert reference.state.step == after.state.step
    assert after.state.lam.array_equal(reference.state.lam), "λ differs from the uninterrupted run"
