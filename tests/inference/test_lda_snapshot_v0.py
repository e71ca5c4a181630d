"""Snapshots of LDA written before its step moved onto the engine's scaled-columns storage
still load and resume (issue 24, gate "snapshots written by the previous version").

``tests/data/lda_snapshot_v0/`` was written by the code before the move (main at 61b6184;
``tests/data/make_lda_snapshot_v0.py`` says how), with λ in the scaled form after 5 SVI+
updates; ``lda_snapshot_v0_next.npz`` holds what that code computed when resuming it for 3
more updates. No pickle: the snapshot is JSON and a plain .npz.
"""
import shutil
from pathlib import Path

import numpy as np
import pytest

import streamsvi
from streamsvi.checkpoint import CheckpointStore
from streamsvi.datasets import make_lda_corpus
from streamsvi.models import LDA

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture
def snapshot_dir(tmp_path):
    shutil.copytree(DATA / "lda_snapshot_v0", tmp_path / "s")    # loading may take the store's lock
    return tmp_path / "s"


def test_old_lda_snapshot_loads_and_resumes_as_before(snapshot_dir):
    want = np.load(DATA / "lda_snapshot_v0_next.npz", allow_pickle=False)
    X = make_lda_corpus(n_docs=80, n_topics=3, n_words=150, doc_length=12, seed=3)[0]
    snap = CheckpointStore(snapshot_dir).latest()
    model = snap.engine.model
    assert isinstance(model, LDA) and model.is_scaled(snap.state.lam)
    assert snap.state.step == 5 and set(snap.state.aux) == {"stored_sqsum", "global_elbo",
                                                             "global_elbo_step"}
    np.testing.assert_array_equal(model.lam_matrix(snap.state.lam), want["lam_loaded"])
    state, infos = snap.engine.fit(snap.state, X, n_steps=3, batch_size=20)
    np.testing.assert_allclose(model.lam_matrix(state.lam), want["lam_next"], rtol=1e-12)
    np.testing.assert_allclose([i.elbo for i in infos], want["elbo"], rtol=1e-12)
    np.testing.assert_allclose([i.grad_norm for i in infos], want["grad_norm"], rtol=1e-10)
    np.testing.assert_allclose([i.grad_variance for i in infos], want["grad_variance"], rtol=1e-10)


def test_old_lda_snapshot_scores(snapshot_dir):
    want = np.load(DATA / "lda_snapshot_v0_next.npz", allow_pickle=False)
    X = make_lda_corpus(n_docs=80, n_topics=3, n_words=150, doc_length=12, seed=3)[0]
    fitted = streamsvi.load(snapshot_dir)
    assert set(fitted.lam) == {"topic_word"}
    np.testing.assert_array_equal(fitted.lam["topic_word"], want["lam_loaded"])
    model = LDA(3, 150, doc_topic_prior=0.3, topic_word_prior=0.05)
    assert fitted.perplexity(X) == pytest.approx(
        model.perplexity(streamsvi.models.NatParams(topic_word=want["lam_loaded"]), X), rel=1e-12)
