"""The scaled-columns storage (``streamsvi/inference/storage_columns.py``) on its own.

Its exactness against the engine's dense update (every annealer, SVI+ clipping,
rescaling, the ELBO cadence) is checked through LDA in ``tests/models/test_lda.py``;
these are the storage's own contracts: what a model must declare, the initial state,
and the conversion of a plain λ.
"""
import numpy as np
import pytest

from streamsvi.datasets import make_lda_corpus
from streamsvi.inference import SVI
from streamsvi.inference.engine import storage_for
from streamsvi.inference.storage_columns import ScaledColumns
from streamsvi.models import LDA, NatParams
from streamsvi.models.blocks import DenseBlock, Gaussian1D


def _corpus(n=50, V=200, seed=0):
    return make_lda_corpus(n, n_topics=3, n_words=V, doc_length=10, seed=seed)[0]


def test_lda_declares_the_scaled_columns_storage_and_has_no_step_of_its_own():
    model = LDA(3, 200)
    assert isinstance(storage_for(model), ScaledColumns)
    for gone in ("svi_step", "init_state", "_scaled", "_rescale"):
        assert gone not in dir(model), gone


def test_an_unknown_storage_is_refused_by_name():
    class Odd(LDA):
        global_storage = "columns_of_some_kind"

    with pytest.raises(ValueError, match="declares global_storage 'columns_of_some_kind'; "
                                         "known: dense, scaled_columns"):
        SVI(Odd(3, 200), n_total=50).init(_corpus(), seed=0)


def test_the_storage_holds_only_a_dirichlet_block():
    class NotDirichlet(LDA):
        param_blocks = (DenseBlock(("topic_word",), Gaussian1D()),)

    with pytest.raises(ValueError, match="one Dirichlet block; model 'lda' declares Gaussian1D"):
        ScaledColumns(NotDirichlet(3, 200))


@pytest.mark.parametrize("init", ["gamma", "documents"])
def test_the_initial_state_is_init_params_in_the_scaled_form(init):
    """The same λ as ``init_params`` from the same draws, s = 1, c = 0, and the running
    sums Σ_w μ_kw and Σ_w μ_kw² of the stored rows."""
    X = _corpus()
    model = LDA(3, 200, init=init)
    lam, aux = ScaledColumns(model).init(np.random.default_rng(4), X, 50)
    want = model.init_params(np.random.default_rng(4), X, 50)["topic_word"]
    np.testing.assert_array_equal(model.lam_matrix(lam), want)
    np.testing.assert_array_equal(lam["topic_scale"], 1.0)
    np.testing.assert_array_equal(lam["topic_offset"], 0.0)
    np.testing.assert_allclose(lam["topic_stored_sum"], want.sum(axis=1), rtol=1e-13)
    np.testing.assert_allclose(aux["stored_sqsum"], (want ** 2).sum(axis=1), rtol=1e-13)
    assert aux["global_elbo"] is None and aux["global_elbo_step"] == -1


def test_prepare_converts_a_plain_lambda_once_and_leaves_a_dense_step_alone():
    X = _corpus()
    model = LDA(3, 200)
    st = ScaledColumns(model)
    plain = model.init_params(np.random.default_rng(0), X, 50)
    lam, aux = st.prepare(plain, None, dense=False)
    assert model.is_scaled(lam)
    np.testing.assert_array_equal(model.lam_matrix(lam), plain["topic_word"])
    np.testing.assert_allclose(aux["stored_sqsum"], (plain["topic_word"] ** 2).sum(axis=1), rtol=1e-13)
    again, aux2 = st.prepare(lam, aux, dense=False)
    assert again is lam and aux2 is aux                  # already scaled: nothing copied
    same, empty = st.prepare(plain, None, dense=True)
    assert same is plain and empty == {}
    assert isinstance(same, NatParams)
