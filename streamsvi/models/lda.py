"""Latent Dirichlet allocation (Blei, Ng & Jordan 2003) with Hoffman's online local step.

Generative model (seed 000 §IV-B; seed 002 §4.1; Hoffman, Blei & Bach 2010)::

    β_k ~ Dirichlet(η, …, η)           k = 1..K topics over V words   η: ``topic_word_prior``
    θ_d ~ Dirichlet(α)                 per document                   α: ``doc_topic_prior``
    z_dn | θ_d ~ Categorical(θ_d)
    w_dn | z_dn = k ~ Categorical(β_k)

Mean-field family: q(β_k) = Dirichlet(λ_k), q(θ_d) = Dirichlet(γ_d),
q(z_dn = k) = φ_dwk for every occurrence of word w in document d.

Natural parameters (the array in λ)::

    topic_word  (K, V)   λ_kw   prior η   statistic Σ_d n_dw φ_dwk

so CAVI is ``λ = η + Σ_d E_q[t(θ_d)]`` (scikit-learn calls λ ``components_``;
the Dirichlet's natural parameter is λ − 1, and the update is affine, so
storing λ itself changes nothing). The domain is λ_kw > 0.

Local step (Hoffman et al. 2010, Algorithm 2, "E step"), per document d and
its words w with counts n_dw, starting from γ_d = 1 (scikit-learn's
``transform``)::

    repeat   φ_dwk ∝ exp(E[log θ_dk] + E[log β_kw])
             γ_dk = α_k + Σ_w n_dw φ_dwk
    until    mean_k |Δγ_dk| < ``mean_change_tol``, or ``max_doc_update_iter`` sweeps,

with E[log θ_dk] = ψ(γ_dk) − ψ(Σ_j γ_dj) and E[log β_kw] = ψ(λ_kw) − ψ(Σ_v λ_kv).
φ is never stored: with Z_dw = Σ_k exp(E[log θ_dk] + E[log β_kw]) the γ update
is ``γ_d = α + exp(E[log θ_d]) ⊙ Σ_w (n_dw / Z_dw) exp(E[log β_·w])``. The
returned γ is the first one that meets the tolerance, and φ (hence the
statistics and the ELBO) is taken at that γ, as in scikit-learn.

Vectorisation. All documents of a minibatch are fitted together: they are
sorted by length and cut into blocks whose padded (docs × words × K) array
of exp E[log β] fits in cache; each sweep of a block is two batched
matrix–vector products (Z, then the γ update) and one digamma over the
block's γ. A document that meets the tolerance leaves its block (its γ is
final); blocks are compacted when a quarter of their documents have left.
The normaliser needs exp(E[log θ_dk]) only up to a factor per document, so
a sweep uses exp(ψ(γ_dk)) (ψ(Σγ) cancels), or exp(ψ(γ_dk) − ψ(max_k γ_dk))
when α < ~0.0033 would let the former underflow. Z at the final γ comes
from the last sweep, so φ costs no extra product.

Held topics. A document uses few of the K topics, and the others' θ̃_dk
collapse to ~exp(ψ(α_k)) within a few sweeps (NYT, K = 50: ~7 live topics
per document after 30 sweeps). At sweeps 4, 8, 12, 16, 24, … a topic is *held*
when θ̃_dk <= ε min_w Z_dw, ε = 1e-14: since exp(E[log β_kw] − m_w) <= 1,
its share of every Z_dw is then below ε and its next γ_dk is within N_d ε
of α_k; it is set to α_k (that change still counts in the convergence
test), drops out of the products, and the block's arrays are narrowed to
the widest document's live topics. At the end, a held topic must still
satisfy exp(ψ(α_k)) <= ε min_w Z_dw on the final γ's scale; a document
where one does not (its words moved away from its live topics) is fitted
again without holding. The result is the plain iteration's to ~1e-12
(same sweeps; tested), at ~0.6x its cost on NYT.

Compiled kernel. ``_ldakernel.c`` (built by ``setup.py`` when a C compiler
is present; :data:`COMPILED` says whether it was) runs the same iteration,
stopping rule, held topics and final check one document at a time, with
the document's exp E[log β] rows in a (live topics × words) buffer that
stays in cache through its sweeps, and releases the GIL. It is the default
when built (~2.5x the numpy kernel on NYT, the same sweeps, γ to ~1e-12);
otherwise the numpy kernels above run.
Each document's iterations depend on nothing but its own words, so the
result does not depend on how documents are batched. For a small vocabulary
(V·K small next to a document's words, e.g. in tests) a sweep is instead two
dense (documents × V) BLAS products for the whole batch; the arithmetic is
the same. ``accelerate=True`` extrapolates the sweeps with SQUAREM (see
:meth:`LDA._fit_gamma_squarem`): same fixed points, stopping rule and cap,
fewer sweeps, but no held topics, so on NYT (K = 50) it is slower than the
default, and its held-out perplexity was ~0.5 % worse (γ closer to each
document's fixed point early in training did not help).

Sparse global step (Hoffman et al. 2010 §3.3 and Mimno, Hoffman & Blei 2012
keep λ this way). The engine's update ``λ ← (1 − ρ)λ + ρ(η + (N/|S|) Σ_d w_d
n_dw φ_dwk)`` moves a word the batch does not hold only towards η:
λ'_kw − η = (1 − ρ)(λ_kw − η). So the model declares ``global_storage =
"scaled_columns"``, and the engine keeps λ as

    λ_kw = s_k · μ_kw + c_k        (``word_topic`` μᵀ (V, K), ``topic_scale`` s,
                                   ``topic_offset`` c, ``topic_stored_sum`` Σ_w μ_kw)

and makes the step itself (:mod:`streamsvi.inference.storage_columns`, whose
docs are the storage's spec): it folds (1 − ρ_k) into s_k and c_k and writes μ
only in the batch's words. This file holds only the math the step needs: the
local step on the batch's columns (which reads λ there through
:meth:`LDA.lam_columns`, and the row sums Σ_w λ_kw = s_k Σ_w μ_kw + V c_k of
E[log β] in O(K), so every E[log β] it uses is the dense computation's, bit for
bit; the λ columns it read travel on :class:`LDALocal` as ``lam_cols`` so the
step does not read them again), the statistics over those columns
(:meth:`LDA.column_suffstats`), the prior η as one number
(:attr:`LDA.column_prior`), the initial topics one at a time
(:meth:`LDA.init_topics`) and the ELBO terms. The step equals the dense update
to rounding (tested to 1e-10 over many steps, with SVI+ weights and the
fraction-to-boundary rule). A step with ρ_k = 1 (batch VI) forgets λ and is
done densely; its λ is the plain ``NatParams(topic_word=λ)``, which the next
sparse step converts with one copy (so do snapshots of releases before the
scaled form). μ is updated in place: the state passed to an update shares it
with the state returned. Everything here that takes λ accepts both forms
(:meth:`LDA.lam_matrix` gives λ itself, a dense pass; a loaded snapshot's
``fitted.lam`` is λ).

Annealing (:mod:`streamsvi.inference.annealing`; LDA declares all four kinds).
Deterministic (T_t ≠ 1): the local step runs at T_t on the batch's columns
(:meth:`LDA._fit_gamma_tempered`), the target is tempered, λ̂_T = 1 + (λ̂ − 1)/T_t,
and a word the batch does not hold moves towards η_T = 1 + (η − 1)/T_t, a
constant that folds into c_k as η does: the step stays sparse, at the cost of a
second (untempered) local step per update for the reported ELBO. Stochastic
(ρ^a_t > 0): λ̂ ← (1 − ρ^a_t) λ̂ + ρ^a_t η_t with η_t = :meth:`LDA.random_init`, a
dense K × V draw, so the engine's step is dense (λ materialised, the target,
η_t and the new λ: a few K × V arrays and the K·V Dirichlet draws) and returns
the plain λ; the first step after the annealer is off converts it back with one
copy. Both equal the engine's dense annealed update to rounding (tested to 1e-10).

Metrics of an update, and what they cost (the storage's docs): the ELBO's
documents' part and the gradient variance come from the batch; ‖ĝ‖ is exact,
from the batch's words and per-topic sums of μ and μ² kept in ``aux``; the
global term −Σ_k KL(q(β_k) ‖ p(β_k)) (:meth:`LDA.global_elbo`) is a dense pass
over λ (~0.4 s at K = 100, V = 100k), recomputed at update 1, at every update
with ρ_k = 1, and every max(1, round(K·V / 2^16)) updates (every 2nd at NYT,
K = 50; every 153rd at K = 100, V = 100k); in between the reported ELBO reuses
the last value, and ``aux["global_elbo_step"]`` says which λ it was computed
at. Scoring (held-out bound, perplexity with ``topic_kl="none"``, topic
proportions) reads only the scored documents' words;
``topic_kl="full"``/``"apportioned"`` and :meth:`LDA.global_elbo` are a dense
pass when called.

ELBO (all constants). Per document, at φ optimal for the final γ::

    L_d = Σ_w n_dw log Z_dw + log Γ(Σα) − Σ_k log Γ(α_k) − log Γ(Σγ_d) + Σ_k log Γ(γ_dk)
          + Σ_k (α_k − γ_dk) E[log θ_dk]

(= E_q[log p(w_d, z_d, θ_d | α, β)] − E_q[log q(z_d, θ_d)], the β terms taken
under q(β)); globally −Σ_k KL(Dirichlet(λ_k) ‖ Dirichlet(η)).

Perplexity. ``perword_bound(lam, x, topic_kl=...)`` is
``(Σ_d L_d + c · G) / Σ_d N_d`` with G = −Σ_k KL(q(β_k) ‖ p(β_k)) and
N_d = Σ_w n_dw, and ``perplexity = exp(−perword_bound)``; which share c of
the topic term is charged to the words of ``x``:

``"none"``         c = 0: the documents' own bound, the local step's held-out
                   perplexity (Hoffman et al. 2010 §3.1). The benchmark's evaluator.
``"full"``         c = 1: scikit-learn's ``perplexity(X)`` (``_approx_bound``
                   with ``sub_sampling=False``).
``"apportioned"``  c = |x| / ``n_docs``: gensim's ``log_perplexity(chunk,
                   total_docs=n_docs)`` (the documents' part scaled to the
                   corpus, divided by the scaled word count).

Examples
--------
>>> import numpy as np
>>> X = np.zeros((60, 6))
>>> X[:30, :3] = 4.0        # documents about words 0-2
>>> X[30:, 3:] = 4.0        # and about words 3-5
>>> model = LDA(n_components=2, n_features=6, doc_topic_prior=0.5, topic_word_prior=0.1)
>>> lam = model.init_params(np.random.default_rng(0), X, n_total=len(X))
>>> for _ in range(30):   # batch VI (CAVI)
...     lam = model.prior() + model.suffstats(model.local_step(lam, X), X)
>>> theta = model.topic_proportions(lam, X)
>>> bool(theta[0].argmax() != theta[-1].argmax()), bool(theta.max(axis=1).min() > 0.9)
(True, True)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import scipy.sparse as sp
from scipy.special import digamma, gammaln

from ..settings import ConfigKind, Setting
from .base import (ChecksState, ConjugateModel, NatParams, PairedStats, RandomRestart, RowWise, ScoresRecords,
                   StoredScaled, Tempered)
from .blocks import DenseBlock, Dirichlet

try:
    from . import _ldakernel    # the compiled local step (setup.py; optional)
except ImportError:             # built without a C compiler: the numpy kernels run
    _ldakernel = None
#: True when the compiled local step is available (see the module docs)
COMPILED = _ldakernel is not None

#: Largest padded block (documents × padded length × K) of the local step, in
#: float64 elements: 2**19 × 8 bytes = 4 MiB, so a block stays in cache across
#: its sweeps (one batch-wide array was ~2x slower per sweep on NYT, K = 50).
_BLOCK_ELEMENTS = 2 ** 19
#: A block may hold at most this much padding relative to its words ...
_BLOCK_WASTE = 1.5
#: ... unless it is smaller than this (padding is cheaper than another block).
_BLOCK_SMALL = 2 ** 16
#: Sweeps after which a document's negligible topics are held (module docs) ...
_HOLD_AT = (4, 8, 12, 16, 24, 32, 48, 64)
#: ... namely those with θ̃_dk <= this × min_w Z_dw (then θ̃_dk β̃_kw / Z_dw <= this for every w).
_HOLD_EPS = 1e-14
#: A block drops its finished rows once the working ones are at most this share.
_COMPACT = 0.75
#: A block's arrays are narrowed to the topics still free when that saves this much.
_NARROW = 0.8
#: Dense passes over λ (global ELBO, rescaling) go through column blocks of this many elements.
_CHUNK = 2 ** 20


@dataclass(frozen=True)
class LDALocal:
    """Local factors of a minibatch of documents.

    ``x`` is the batch as CSR (documents × words); ``gamma`` (n, K) the
    Dirichlet parameters γ_d of q(θ_d); ``exp_theta`` (n, K) is
    exp(E[log θ_dk] − c_d) with c_d = max_k E[log θ_dk]; ``ratio`` (nnz,) is
    n_dw / Z'_dw in the CSR order of ``x``, Z' the normaliser of φ computed with
    the shifted exponentials (so φ_dwk n_dw = exp_theta_dk · exp_beta_kw · ratio_dw);
    ``exp_beta`` (K, V) is exp(E[log β_kw] − m_w), m_w = max_k E[log β_kw];
    ``log_norm`` (n,) the per-document ELBO L_d; ``n_iter`` (n,) the sweeps used.

    ``cols``: None when ``exp_beta`` has all V columns; otherwise the sorted word
    ids of the batch, and ``exp_beta`` (K, len(cols)) holds only those columns
    (the local step never reads the others). ``xc`` is ``x`` with its word ids
    renumbered into ``cols`` (``x`` itself when ``cols`` is None).
    ``lam_cols``: λ in those columns, word-major (len(cols), K), as the local step
    read them (the engine's step reuses them); None when ``cols`` is None.
    """

    x: sp.csr_matrix
    gamma: np.ndarray
    exp_theta: np.ndarray
    ratio: np.ndarray
    exp_beta: np.ndarray
    log_norm: np.ndarray
    n_iter: np.ndarray
    cols: np.ndarray | None = None
    xc: sp.csr_matrix | None = None
    lam_cols: np.ndarray | None = None


def _blocks(lens_sorted: np.ndarray, K: int):
    """Cut documents sorted by length into (start, stop, padded length) blocks.

    A block grows while its padded array stays under ``_BLOCK_ELEMENTS`` and
    either its padding stays under ``_BLOCK_WASTE`` times its words or the
    whole block is small (then a Python-level sweep costs more than padding).
    """
    out, n, i = [], len(lens_sorted), 0
    while i < n:
        j, total = i, 0
        while j < n:
            L = int(lens_sorted[j])
            size = (j - i + 1) * L
            if j > i and (size * K > _BLOCK_ELEMENTS
                          or (size > _BLOCK_WASTE * (total + L) + 8 and size * K > _BLOCK_SMALL)):
                break
            total += L
            j += 1
        out.append((i, j, int(lens_sorted[j - 1])))
        i = j
    return out


class _Words:
    """The words of a batch laid out for the blocked local step.

    ``index``/``count`` are the CSR word ids and counts with one padding slot
    appended at position nnz (word V, count 0); ``eb`` is exp E[log β] (K, V+1)
    whose column V is 1, so padding has Z > 0 and n/Z = 0.
    """

    def __init__(self, eb_ext, X):
        self.eb, self.X = eb_ext, X
        self.lens = np.diff(X.indptr)
        self.index = np.append(X.indices, eb_ext.shape[1] - 1)
        self.count = np.append(X.data, 0.0)

    def block(self, docs, Lmax):
        """(B, cnt, pos) of the documents ``docs``, padded to ``Lmax`` words.

        ``pos`` (nb, Lmax) are their CSR positions (padding: nnz); ``cnt`` their
        counts; ``B`` (nb, K, Lmax) exp E[log β] of their words, topic-major per
        document, so both products of a sweep (θ·B and B·(n/Z)) run along
        contiguous rows. ``B`` is a view of one (K, nb, Lmax) gather (numpy
        hands its strided rows to BLAS as they are).
        """
        pos = self.positions(docs, Lmax)
        B = np.take(self.eb, self.index[pos], axis=1).transpose(1, 0, 2)
        return B, self.count[pos], pos

    def positions(self, docs, Lmax):
        """CSR positions (len(docs), Lmax) of the documents' words; padding is nnz."""
        ar = np.arange(Lmax)
        pos = self.X.indptr[docs].astype(np.intp)[:, None] + ar
        pos[ar >= self.lens[docs][:, None]] = self.X.nnz
        return pos


def _check_prior(name, v, size):
    a = np.asarray(v, dtype=float)
    a = np.full(size, float(a)) if a.ndim == 0 else a
    if a.shape != (size,) or not np.all(np.isfinite(a)) or not np.all(a > 0):
        raise ValueError(f"{name} must be > 0 (a number or {size} numbers), got {v!r}")
    return a


class LDA(ConjugateModel, Tempered, RandomRestart, RowWise, StoredScaled, ChecksState, ScoresRecords,
          PairedStats):
    """Latent Dirichlet allocation over a fixed vocabulary of V words.

    Parameters
    ----------
    n_components : int
        K, the number of topics.
    n_features : int
        V, the vocabulary size (word ids are 0 … V − 1; with the hashing
        trick, the number of buckets).
    doc_topic_prior : float, sequence of K floats, or None
        α of Dirichlet(α) on each document's topic proportions θ_d. None
        means 1/K (scikit-learn's default).
    topic_word_prior : float or None
        η of the symmetric Dirichlet(η) on each topic β_k. None means 1/K.
    max_doc_update_iter : int
        Cap on the local step's sweeps per document (scikit-learn: 100).
    mean_change_tol : float
        A document's local step stops when mean_k |Δγ_dk| < this
        (scikit-learn: 1e-3; gensim's ``gamma_threshold``).
    accelerate : bool
        Extrapolate the local step's fixed-point iteration with SQUAREM
        (Varadhan & Roland 2008): the same fixed points and stopping rule,
        fewer sweeps, no held topics (module docs; slower on NYT). Off by
        default (then γ is scikit-learn's to ~1e-12).
    init : {"gamma", "documents"}
        How :meth:`init_params` starts: λ_kw ~ Gamma(100, 1/100) iid (Hoffman
        et al. 2010; scikit-learn and gensim do the same), or each topic seeded
        by one random document of the batch (its word frequencies carrying a
        1/K share of the corpus' words, on top of η), which gives distinct
        topics from the first step.

    Records are bags of words: a ``(n, V)`` matrix of non-negative counts,
    sparse (CSR, the stream's form, see :mod:`streamsvi.io.bow`) or dense.
    """

    name = "lda"
    record_kind = "bow"
    config_kinds = {"lda": ConfigKind("latent Dirichlet allocation, a topic model on bags of words")}
    settings = {
        "n_components": Setting("int", 10, "K, the topics", low=1, required=True),
        "n_features": Setting("int", 1000, "V, the vocabulary size (or the hashing trick's buckets)",
                              low=1, required=True),
        "doc_topic_prior": Setting("numbers", None, "alpha of Dirichlet(alpha) on each document's topic "
                                   "proportions (a number or K numbers); unset = 1/K", low=0, low_open=True),
        "topic_word_prior": Setting("float", None, "eta of Dirichlet(eta) on each topic; unset = 1/K",
                                    low=0, low_open=True),
        "max_doc_update_iter": Setting("int", 100, "cap on the local step's sweeps per document", low=1),
        "mean_change_tol": Setting("float", 1e-3, "a document's local step stops at mean |change of "
                                   "gamma| < this", low=0),
        "init": Setting("str", "gamma", "the start: gamma (random topics, as scikit-learn and gensim) "
                        "or documents (topics seeded from random documents)", choices=("gamma", "documents")),
        "accelerate": Setting("bool", False, "SQUAREM-accelerated local step (same fixed points, fewer "
                              "sweeps)"),
    }
    #: what ``streamsvi.load(...)`` offers for this model (λ filled in)
    score_column_names = ("topic", "topic_proportions", "log_bound", "perword_bound")
    scoring_methods = ("topic_proportions", "predict", "predictive_logpdf", "perword_bound",
                       "perplexity")
    #: how the engine stores and steps λ (:mod:`streamsvi.inference.storage_columns`):
    #: λ_kw = s_k μ_kw + c_k, written only in a batch's words (module docs)
    global_storage = "scaled_columns"
    # annealing kinds (``streamsvi.inference.annealing``): all four, from Tempered and
    # RandomRestart; the engine's scaled-columns step takes T_t, ρ^a_t and η_t (module docs)

    #: Settings that only shape the initial λ (``init_params``): a snapshot made with
    #: other values still resumes (``streamsvi.checkpoint.check_compatible``).
    START_SETTINGS = ("init",)

    @classmethod
    def param_size(cls, settings) -> int:
        """λ's size from the settings (``Model.param_size``)."""
        K, V = int(settings["n_components"]), int(settings["n_features"])
        return K * V                                # topic_word (stored as μ, with s and c of K each)

    @classmethod
    def check_cases(cls) -> dict:
        """The check suite's case: 3 topics over 30 words, 300 documents of ~40 words.

        Dense counts (len() and row indexing work; the model converts to CSR).
        Topics seeded from documents and a cap of 30 sweeps keep the 6,000 local
        steps of the variance check affordable (from near-uniform random topics
        some documents need hundreds of sweeps). LDA's per-document objective is
        not concave in γ: from its fixed start the local step can land in a
        slightly worse optimum than the previous sweep's, and CAVI's ELBO can
        then dip (~1e-6 relative); with these clear documents it does not
        (checked for the three seeds of the monotone check).
        """
        from ..datasets import make_lda_corpus

        def lda():
            topics = np.full((3, 30), 0.02 / 20)
            for k in range(3):
                topics[k, 10 * k:10 * k + 10] = 0.098
            X, _, _ = make_lda_corpus(300, n_topics=3, n_words=30, doc_length=40, alpha=0.3, seed=3,
                                      topics=topics / topics.sum(axis=1, keepdims=True))
            return cls(n_components=3, n_features=30, doc_topic_prior=0.3, topic_word_prior=0.05,
                       mean_change_tol=1e-4, max_doc_update_iter=30, init="documents"), X.toarray()
        return {"lda": lda}

    def __init__(self, n_components=10, n_features=1000, doc_topic_prior=None,
                 topic_word_prior=None, max_doc_update_iter=100, mean_change_tol=1e-3,
                 init="gamma", accelerate=False):
        p = self.check_settings({k: v for k, v in locals().items() if k in self.settings})
        K, V = p["n_components"], p["n_features"]
        alpha = _check_prior("doc_topic_prior", 1.0 / K if doc_topic_prior is None
                             else doc_topic_prior, K)
        eta = 1.0 / K if topic_word_prior is None else p["topic_word_prior"]
        it, tol = p["max_doc_update_iter"], p["mean_change_tol"]
        self.n_components, self.n_features = K, V
        self.init = init
        self.accelerate = p["accelerate"]
        self.doc_topic_prior = doc_topic_prior
        self.topic_word_prior = topic_word_prior
        self.max_doc_update_iter = int(it)
        self.mean_change_tol = float(tol)
        self._alpha, self._eta = alpha, float(eta)
        self._alpha_const = float(gammaln(alpha.sum()) - gammaln(alpha).sum())
        self._eta_const = float(gammaln(V * self._eta) - V * gammaln(self._eta))
        self._prior = NatParams(topic_word=np.full((K, V), self._eta))
        self._cache = None
        self._rowsum_cache = None

    # ------------------------------------------------------------ settings
    def get_params(self) -> dict:
        a = self.doc_topic_prior
        return {"n_components": self.n_components, "n_features": self.n_features,
                "doc_topic_prior": np.asarray(a).tolist() if a is not None and not np.isscalar(a) else a,
                "topic_word_prior": self.topic_word_prior,
                "max_doc_update_iter": self.max_doc_update_iter,
                "mean_change_tol": self.mean_change_tol, "init": self.init,
                "accelerate": self.accelerate}

    def prior(self) -> NatParams:
        """η (shared object: treat as read-only)."""
        return self._prior

    @property
    def column_prior(self) -> float:
        """η as one number: the symmetric prior every λ_kw moves towards (the engine's
        scaled-columns storage folds it into its per-topic offsets)."""
        return self._eta

    def check_batch(self, x) -> sp.csr_matrix:
        """The documents as a CSR matrix (n, V) of float64 counts.

        Accepts any scipy sparse matrix or a dense 2-D array. Raises
        ``ValueError`` naming the problem: wrong vocabulary size, negative or
        non-finite counts, no documents.
        """
        V = self.n_features
        if sp.issparse(x):
            X = x if x.format == "csr" else x.tocsr()
            if X.dtype != np.float64:
                X = X.astype(np.float64)
        else:
            try:
                arr = np.asarray(x, dtype=np.float64)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"documents must be a sparse matrix or a numeric array, "
                                 f"got {type(x).__name__}: {exc}") from None
            if arr.ndim == 1 and arr.shape[0] == V:
                arr = arr[None, :]
            if arr.ndim != 2:
                raise ValueError(f"documents must be 2-D (documents × vocabulary), got shape {arr.shape}")
            X = sp.csr_matrix(arr)
        if X.ndim != 2 or X.shape[0] == 0:
            raise ValueError(f"documents must hold at least one document, got shape {X.shape}")
        if X.shape[1] != V:
            raise ValueError(f"documents must have n_features={V} columns (the vocabulary size), "
                             f"got {X.shape[1]}")
        d = X.data
        if d.size and not (np.isfinite(d).all() and d.min() >= 0):
            rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
            bad = np.unique(rows[~(np.isfinite(d) & (d >= 0))])
            raise ValueError(f"word counts must be finite and >= 0; documents {bad[:10].tolist()} "
                             f"are not")
        return X

    # ---------------------------------------------------------------- init
    def init_params(self, rng: np.random.Generator, x, n_total) -> NatParams:
        """A random initial λ (see ``init``).

        ``"gamma"``: λ_kw ~ Gamma(100, 1/100), ignoring ``x`` and ``n_total``.
        ``"documents"``: λ_k = η + (W/K) · x_{d_k} / N_{d_k} for K distinct
        random documents d_k of ``x`` (with replacement if |x| < K), where
        W = (n_total/|x|) Σ_d N_d estimates the corpus' word count.
        """
        return NatParams(topic_word=self._init_matrix(rng, x, n_total))

    def _init_matrix(self, rng, x, n_total) -> np.ndarray:
        """The initial λ (K, V) of :meth:`init_params` as a plain array."""
        X = self.check_batch(x)
        K, V = self.n_components, self.n_features
        if self.init == "gamma":
            return rng.gamma(100.0, 0.01, (K, V))
        n = X.shape[0]
        Nd = np.asarray(X.sum(axis=1)).ravel()
        nonempty = np.flatnonzero(Nd > 0)
        if nonempty.size == 0:
            raise ValueError("init='documents' needs at least one non-empty document")
        pick = rng.choice(nonempty, size=K, replace=nonempty.size < K)
        W = float(n_total) / n * Nd.sum()
        seeds = X[pick].toarray() / Nd[pick][:, None]
        return self._eta + (W / K) * seeds

    def init_topics(self, rng: np.random.Generator, x, n_total):
        """The K rows of the initial λ of :meth:`init_params`, one (V,) row at a time.

        The same values from the same draws in the same order as :meth:`init_params`
        (``"gamma"`` draws one topic at a time), so the engine's scaled-columns storage
        fills its buffer without a K × V temporary."""
        X = self.check_batch(x)
        if self.init == "gamma":
            K, V = self.n_components, self.n_features
            return (rng.gamma(100.0, 0.01, V) for _ in range(K))
        return iter(self._init_matrix(rng, X, n_total))

    def check_state(self, lam: NatParams, aux) -> None:
        """Raise ``ValueError`` unless (λ, aux) is an LDA state of this model (either form:
        plain, or the engine's scaled columns, :mod:`streamsvi.inference.storage_columns`)."""
        K, V = self.n_components, self.n_features
        names = set(lam)
        want = {"topic_word": (K, V)}
        if names != {"topic_word"}:
            want = {"word_topic": (V, K), "topic_scale": (K,), "topic_offset": (K,),
                    "topic_stored_sum": (K,)}
        if names != set(want):
            raise ValueError(f"state parameters {sorted(names)} do not match an LDA state "
                             f"(['topic_word'] or {sorted(want)})")
        for k, shape in want.items():
            if lam[k].shape != shape:
                raise ValueError(f"parameter {k} has shape {lam[k].shape}, model expects {shape}")
        if aux is not None:
            if not isinstance(aux, dict):
                raise ValueError(f"an LDA state's aux must be a mapping, got {type(aux).__name__}")
            q = aux.get("stored_sqsum")
            if q is not None and np.shape(q) != (K,):
                raise ValueError(f"aux stored_sqsum must have {K} entries, got shape {np.shape(q)}")

    # ---------------------------------------------------------- local step
    def _expectations(self, lam: NatParams, cols=None) -> dict:
        """E[log β], its per-word max m_w and exp(E[log β] − m_w); cached for the last λ.

        ``exp_beta_ext`` (K, V+1) holds exp(E[log β] − m) with a column of ones
        appended (the local step's padding word); ``exp_beta`` is a view of it;
        ``exp_beta_t`` (V, K) its transpose (the compiled kernel's layout).
        With ``cols`` (sorted word ids) only those columns are computed, word-major
        (``exp_beta_t`` first, ``exp_beta`` its transposed view, ``exp_beta_ext``
        built when a numpy kernel asks for it), and nothing is cached. Every value
        is a function of λ_kw, Σ_v λ_kv and its own column only.
        """
        if cols is not None:
            LT = self.lam_columns(lam, cols)
            elog = digamma(LT)
            elog -= digamma(self._rowsums(lam))
            m = elog.max(axis=1)
            ebt = np.subtract(elog, m[:, None])
            np.exp(ebt, out=ebt)
            return {"elog_beta": elog.T, "m": m, "exp_beta": ebt.T, "exp_beta_ext": None,
                    "exp_beta_t": ebt, "lam_cols": LT}
        cache = self._cache
        if cache is not None and cache[0] is lam:
            return cache[1]
        L = self.lam_matrix(lam)
        K, V = L.shape
        elog = digamma(L)
        elog -= digamma(self._rowsums(lam))[:, None]
        m = elog.max(axis=0)
        ext = np.empty((K, V + 1))
        eb = ext[:, :V]
        np.subtract(elog, m, out=eb)
        np.exp(eb, out=eb)
        ext[:, V] = 1.0
        ex = {"elog_beta": elog, "m": m, "exp_beta": eb, "exp_beta_ext": ext, "exp_beta_t": None}
        self._cache = (lam, ex)
        return ex

    @staticmethod
    def _ext(ex) -> np.ndarray:
        """``ex["exp_beta_ext"]``, built from ``exp_beta`` if it is not there yet."""
        if ex["exp_beta_ext"] is None:
            K, n = ex["exp_beta"].shape
            ext = np.empty((K, n + 1))
            ext[:, :n] = ex["exp_beta"]
            ext[:, n] = 1.0
            ex["exp_beta_ext"] = ext
        return ex["exp_beta_ext"]

    # ------------------------------------------------------- λ's two forms
    @staticmethod
    def is_scaled(lam: NatParams) -> bool:
        """True when ``lam`` holds λ in the scaled form (module docs, "Sparse global step")."""
        return "word_topic" in lam

    def lam_matrix(self, lam: NatParams) -> np.ndarray:
        """λ (K, V) itself: ``lam["topic_word"]``, or s_k·μ_kw + c_k for the scaled form
        (then a new array: a dense K×V pass)."""
        if not self.is_scaled(lam):
            return lam["topic_word"]
        out = np.empty((self.n_components, self.n_features))
        for lo, hi in self._chunks():
            out[:, lo:hi] = self.lam_columns(lam, slice(lo, hi)).T
        return out

    def dense_params(self, lam: NatParams) -> NatParams:
        """λ as a plain ``NatParams(topic_word=λ)`` (the form every release before wrote)."""
        return lam if not self.is_scaled(lam) else NatParams(topic_word=self.lam_matrix(lam))

    def lam_columns(self, lam: NatParams, cols) -> np.ndarray:
        """λ[:, cols]ᵀ (len(cols), K), word-major: a new array (``cols`` an index array or a slice)."""
        if not self.is_scaled(lam):
            return np.ascontiguousarray(lam["topic_word"][:, cols].T)
        out = lam["word_topic"][cols] * lam["topic_scale"]
        out += lam["topic_offset"]
        return out

    def _rowsums(self, lam: NatParams) -> np.ndarray:
        """Σ_v λ_kv (K,): s_k·Σ_v μ_kv + V·c_k from the stored sums (scaled form), else a
        sum over λ (cached for the last λ)."""
        if self.is_scaled(lam):
            return lam["topic_scale"] * lam["topic_stored_sum"] + self.n_features * lam["topic_offset"]
        cache = self._rowsum_cache
        if cache is not None and cache[0] is lam:
            return cache[1]
        T = lam["topic_word"].sum(axis=1)
        self._rowsum_cache = (lam, T)
        return T

    def _elog_theta(self, gamma):
        return digamma(gamma) - digamma(gamma.sum(axis=1))[:, None]

    def _theta_unshifted(self) -> bool:
        """True when exp(ψ(γ)) can stand for exp(E[log θ]) unshifted (module docs).

        Every γ_k >= min α, so exp(ψ(γ_k)) >= exp(ψ(min α)); above e^-300 no
        product of the sweep under- or overflows. Below (α < ~0.0033) each
        sweep subtracts ψ(max_k γ_k) first.
        """
        return bool(digamma(self._alpha.min()) > -300.0)

    def _fit_gamma(self, words: _Words, hold: bool = True):
        """γ of every document (the fixed point above), the sweeps used, and Z at the final γ.

        Returns ``(gamma, n_iter, Z, zlog)``: ``Z`` (nnz,) in CSR order is
        Σ_k exp(ψ(γ_dk) − s_d) exp(E[log β_kw] − m_w) at each document's final
        γ, and ``zlog`` (n,) is s_d − ψ(max_k γ_dk), so ``Z · exp(zlog)`` is
        the normaliser for exp(E[log θ_d] − max_k E[log θ_dk]).

        Each working row has W topic slots (``tid``: the topic of a slot, −1 a
        held one, see :meth:`_hold`); a held slot has exp E[log β] = 0 and
        α = γ = 1, so it adds nothing. ``hold=False`` never holds a topic.
        """
        X = words.X
        n, K = X.shape[0], self.n_components
        alpha, max_it = self._alpha, self.max_doc_update_iter
        tolK = self.mean_change_tol * K         # Σ_k |Δγ_dk| < K · tol  ⇔  mean < tol
        unshifted = self._theta_unshifted()
        hold_at = frozenset(_HOLD_AT) if hold else frozenset()
        lens = words.lens
        order = np.argsort(lens, kind="stable")
        gamma = np.ones((n, K))
        shift = np.zeros(n)
        held_docs = np.zeros(n, dtype=bool)
        n_iter = np.zeros(n, dtype=np.int64)
        Zall = np.empty(X.nnz + 1)
        for a, b, Lmax in _blocks(lens[order], K):
            live = order[a:b]                     # document of each working row
            nb = b - a
            B, cnt, pos = words.block(live, Lmax)
            g = np.ones((nb, K))
            th = np.ones((nb, K))                 # exp(E[log θ]) up to a factor, at γ = 1
            A = np.broadcast_to(alpha, (nb, K))   # α of each slot
            tid = None                            # topic of each slot (None: slot k is topic k)
            pend = None                           # |Δγ| of slots held last sweep (γ_k → α_k)
            s = None
            Z = np.matmul(th[:, None, :], B)[:, 0, :]
            act = np.ones(nb, dtype=bool)         # rows whose γ is not final yet
            thr = np.full(nb, tolK)               # their threshold; −1 once final
            for it in range(1, max_it + 1):
                np.divide(cnt, Z, out=Z)
                G = np.matmul(B, Z[:, :, None])[:, :, 0]
                G *= th
                G += A
                change = np.abs(np.subtract(G, g, out=g), out=g).sum(axis=1)
                if pend is not None:
                    change += pend
                    pend = None
                g = G
                # φ ∝ exp(E[log θ_k]) β_kw is unchanged by a factor per document, so
                # exp(ψ(γ_k)) serves (ψ(Σγ) cancels); or exp(ψ(γ_k) − ψ(max γ)), see above
                e = digamma(g)
                if not unshifted:
                    s = digamma(g.max(axis=1))
                    e -= s[:, None]
                th = np.exp(e, out=e)
                Z = np.matmul(th[:, None, :], B)[:, 0, :]
                done = (change < thr) if it < max_it else act.copy()
                if it in hold_at:
                    B, g, th, A, tid, pend = self._hold(B, Z, g, th, A, tid, act & ~done)
                if done.any():
                    fin = live[done]
                    if tid is None:
                        gamma[fin] = g[done]
                    else:
                        td = tid[done]
                        gamma[fin] = alpha
                        ri, ci = np.nonzero(td >= 0)
                        gamma[fin[ri], td[ri, ci]] = g[done][ri, ci]
                        held_docs[fin] = (td >= 0).sum(axis=1) < K
                    n_iter[fin] = it
                    Zall[pos[done]] = Z[done]
                    if s is not None:
                        shift[fin] = s[done]
                    act &= ~done
                    thr[done] = -1.0
                    nk = int(act.sum())
                    if nk == 0:
                        break
                    # finished rows keep sweeping (harmlessly: their γ is saved) until
                    # a quarter of the working rows have finished; then compact
                    if nk <= _COMPACT * len(act):
                        B, cnt, pos, g, th, Z, live, A = (B[act], cnt[act], pos[act], g[act],
                                                          th[act], Z[act], live[act], A[act])
                        thr = thr[act]
                        if tid is not None:
                            tid = tid[act]
                        if pend is not None:
                            pend = pend[act]
                        if s is not None:
                            s = s[act]
                        act = np.ones(nk, dtype=bool)
        zlog = shift - digamma(gamma.max(axis=1))
        Zall = Zall[:X.nnz]
        if held_docs.any():
            # a held topic stays negligible iff exp(ψ(α_k) − s_d) <= ε min_w Z_dw at the end
            docs = np.flatnonzero(held_docs)
            zmin = np.minimum.reduceat(np.where(X.data > 0, Zall, np.inf), X.indptr[docs])
            bad = docs[np.exp(digamma(alpha.max()) - shift[docs]) > _HOLD_EPS * zmin]
            if bad.size:
                self._refit(words, bad, gamma, n_iter, Zall, zlog)
        return gamma, n_iter, Zall, zlog

    @staticmethod
    def _hold(B, Z, g, th, A, tid, free):
        """Hold the negligible topics of the rows ``free``; narrow the arrays when it pays.

        Slot k of a document is held when θ̃_k <= ε min_w Z_w (ε = ``_HOLD_EPS``,
        θ̃ and Z on the sweep's scale). Since exp E[log β] − m <= 1, the topic's
        share of every Z_w is then at most ε, and its next γ_k is within N_d·ε
        of α_k: it is set to α_k (that change counts in the next sweep's
        convergence test) and takes no further part. The exact iteration would
        keep the topic negligible unless some Z_w falls far below its current
        value; :meth:`_fit_gamma` checks this at the end and refits the
        document without holding if it happened.
        """
        nr, W = g.shape
        # padding has Z = Σ_k θ̃_k >= every Z_w (exp E[log β] − m <= 1): min over all is min over words
        held = th <= _HOLD_EPS * Z.min(axis=1)[:, None]
        held &= free[:, None]
        if tid is not None:
            held &= tid >= 0
        if not held.any():
            return B, g, th, A, tid, None
        if tid is None:
            tid = np.broadcast_to(np.arange(W), (nr, W)).copy()
            A = A.copy()
        pend = ((g - A) * held).sum(axis=1)      # γ_k >= α_k always
        tid[held] = -1
        A[held] = 1.0
        g[held] = 1.0
        th[held] = 0.0
        kept = tid >= 0
        width = int(kept.sum(axis=1).max())
        if width <= _NARROW * W:
            keep = np.argsort(~kept, axis=1, kind="stable")[:, :width]
            rows = np.arange(nr)[:, None]
            B, g, th, A, tid = B[rows, keep], g[rows, keep], th[rows, keep], A[rows, keep], tid[rows, keep]
            held = tid < 0
        B[held] = 0.0
        return B, g, th, A, tid, pend

    def _refit(self, words, docs, gamma, n_iter, Zall, zlog):
        """Fit ``docs`` again without holding topics; write their results in place."""
        X = words.X
        sub = _Words(words.eb, X[docs])
        g, it, Z, zl = self._fit_gamma(sub, hold=False)
        gamma[docs], n_iter[docs], zlog[docs] = g, it, zl
        pos = words.positions(docs, int(sub.lens.max()))
        Zall[pos[pos < X.nnz]] = Z                     # row by row: the sub-batch's CSR order

    def _fit_gamma_compiled(self, ex, X, hold: bool = True):
        """:meth:`_fit_gamma` in C (``_ldakernel.c``), one document at a time: same
        iteration, stopping rule, held topics and final check; only the order of
        the floating-point sums differs. Returns the same four arrays."""
        n, K = X.shape[0], self.n_components
        ebt = ex["exp_beta_t"]
        if ebt is None:
            ebt = ex["exp_beta_t"] = np.ascontiguousarray(ex["exp_beta"].T)
        max_it = self.max_doc_update_iter
        hold_at = np.zeros(max_it + 2, dtype=np.uint8)
        if hold:
            hold_at[[h for h in _HOLD_AT if h <= max_it]] = 1
        gamma = np.empty((n, K))
        n_iter = np.empty(n, dtype=np.int64)
        Z = np.empty(X.nnz)
        shift = np.empty(n)
        _ldakernel.fit_gamma(ebt, K, np.ascontiguousarray(X.indptr, dtype=np.int64),
                             np.ascontiguousarray(X.indices, dtype=np.int64),
                             np.ascontiguousarray(X.data, dtype=np.float64), self._alpha,
                             self.mean_change_tol * K, _HOLD_EPS, max_it,
                             float(digamma(self._alpha.max())), hold_at, self._theta_unshifted(),
                             gamma, n_iter, Z, shift)
        return gamma, n_iter, Z, shift - digamma(gamma.max(axis=1))

    def _fit_gamma_squarem(self, words: _Words):
        """:meth:`_fit_gamma` with SQUAREM extrapolation (``accelerate=True``).

        Varadhan & Roland (2008), scheme S3, on the map F: γ → α + exp E[log θ]
        ⊙ Σ_w (n_w/Z_w) exp E[log β_w]. A cycle from γ0: γ1 = F(γ0), γ2 = F(γ1),
        r = γ1 − γ0, v = γ2 − γ1 − r, a = −‖r‖/‖v‖ (at most −1), γ' = γ0 − 2a r
        + a² v (γ2 if some γ'_k ≤ 0), γ3 = F(γ'). The stopping rule is the same
        (mean |Δγ| < tol between an evaluation of F and its input), checked
        after every evaluation; every evaluation counts towards the cap. Same
        fixed points, fewer sweeps for slowly converging documents (measured
        on NYT, K = 50: ~1.7x fewer evaluations, and a final γ closer to the
        fixed point).
        """
        X = words.X
        n, K = X.shape[0], self.n_components
        alpha, max_it = self._alpha, self.max_doc_update_iter
        tolK = self.mean_change_tol * K
        lens = words.lens
        order = np.argsort(lens, kind="stable")
        gamma = np.ones((n, K))
        n_iter = np.zeros(n, dtype=np.int64)

        def theta(g):
            e = digamma(g)
            e -= digamma(g.max(axis=1))[:, None]
            return np.exp(e, out=e)

        for a, b, Lmax in _blocks(lens[order], K):
            live = order[a:b]
            B, cnt, _ = words.block(live, Lmax)
            act = np.ones(len(live), dtype=bool)
            state = {"evals": 0}

            def F(th):
                Z = np.matmul(th[:, None, :], B)[:, 0, :]
                np.divide(cnt, Z, out=Z)
                G = np.matmul(B, Z[:, :, None])[:, :, 0]
                G *= th
                G += alpha
                return G

            def check(new, old):
                """Finalise the rows that met the tolerance (or the cap); True if none is left."""
                state["evals"] += 1
                done = np.abs(new - old).sum(axis=1) < tolK
                if state["evals"] >= max_it:
                    done[:] = True
                done &= act
                if done.any():
                    gamma[live[done]] = new[done]
                    n_iter[live[done]] = state["evals"]
                    act[done] = False
                return not act.any()

            g0 = gamma[live]
            th0 = np.ones((len(live), K))            # γ = 1
            while True:
                g1 = F(th0)
                if check(g1, g0):
                    break
                g2 = F(theta(g1))
                if check(g2, g1):
                    break
                r = g1 - g0
                v = g2 - g1 - r
                nv = np.sqrt(np.einsum("ij,ij->i", v, v))
                with np.errstate(divide="ignore", invalid="ignore"):
                    s = np.where(nv > 0, -np.sqrt(np.einsum("ij,ij->i", r, r)) / nv, -1.0)
                s = np.minimum(s, -1.0)[:, None]
                gp = g0 - 2.0 * s * r + (s * s) * v
                bad = ~(gp > 0).all(axis=1)
                if bad.any():
                    gp[bad] = g2[bad]
                g3 = F(theta(gp))
                if check(g3, gp):
                    break
                g0, th0 = g3, theta(g3)
                if act.sum() <= _COMPACT * len(act):  # compact between cycles
                    B, cnt, g0, th0, live = B[act], cnt[act], g0[act], th0[act], live[act]
                    act = np.ones(len(live), dtype=bool)
        return gamma, n_iter

    def _fit_gamma_dense(self, Eb: np.ndarray, X: sp.csr_matrix):
        """As :meth:`_fit_gamma` with dense (documents × V) products, for small V·K.

        Two BLAS matrix products per sweep for the whole batch; cheaper than
        one small product per document when the vocabulary is small.
        """
        n, K = X.shape[0], self.n_components
        alpha, max_it = self._alpha, self.max_doc_update_iter
        tolK = self.mean_change_tol * K
        C = X.toarray()
        EbT = Eb.T
        gamma = np.ones((n, K))
        n_iter = np.zeros(n, dtype=np.int64)
        g, th = gamma.copy(), np.ones((n, K))
        live = np.arange(n)
        act = np.ones(n, dtype=bool)
        for it in range(1, max_it + 1):
            Z = th @ Eb
            np.divide(C, Z, out=Z)
            G = Z @ EbT
            G *= th
            G += alpha
            change = np.abs(np.subtract(G, g, out=g), out=g).sum(axis=1)
            g = G
            e = digamma(g)
            e -= digamma(g.max(axis=1))[:, None]
            th = np.exp(e, out=e)
            done = (change < tolK) if it < max_it else np.ones(len(live), dtype=bool)
            done &= act
            if done.any():
                gamma[live[done]] = g[done]
                n_iter[live[done]] = it
                act &= ~done
                nk = int(act.sum())
                if nk == 0:
                    break
                if nk <= _COMPACT * len(act):  # as in _fit_gamma: compact now and then
                    C, g, th, live = C[act], g[act], th[act], live[act]
                    act = np.ones(nk, dtype=bool)
        return gamma, n_iter

    def _use_dense(self, X) -> bool:
        """Dense products when V·K is small next to the documents' words (measured rule)."""
        if self._local_path is not None:
            return self._local_path == "dense"
        K, V = self.n_components, self.n_features
        return V * K <= 1.5 * K * X.nnz / max(X.shape[0], 1) + 1000

    #: None (compiled if built, else by size), "compiled", "dense" or "blocked": which
    #: local-step kernel runs (for tests)
    _local_path = None

    def _fit_gamma_tempered(self, ex, X, T: float, cols=None, Xc=None):
        """γ and φ at temperature T ≠ 1 (detAVI; Abrol et al. 2014), as an :class:`LDALocal`.

        The tempered local objective E_q[log p] − T E_q[log q] is maximised by
        φ_dwk ∝ exp((E[log θ_dk] + E[log β_kw]) / T) and q(θ_d) with natural
        parameter (α − 1 + Σ_w n_dw φ_dw)/T, i.e. γ_d = α_T + (1/T) Σ_w n_dw φ_dw
        with α_T = 1 + (α − 1)/T. Same start (γ = 1), stopping rule and cap as
        at T = 1. The compiled kernel runs it (with its held topics) when it
        runs at T = 1; otherwise a sparse numpy sweep (nnz × K, no held
        topics). ``log_norm`` is NaN: the engine reports the untempered ELBO.
        ``cols``, ``Xc``: as in :meth:`_finish` (``ex`` holds only the batch's
        columns, ``Xc`` is the batch renumbered into them).
        """
        Xc = X if Xc is None else Xc
        n, K = X.shape[0], self.n_components
        inv = 1.0 / T
        a_T = 1.0 + (self._alpha - 1.0) * inv
        tolK = self.mean_change_tol * K
        EbT = np.power(ex["exp_beta"], inv)                # exp((E[log β] − m)/T), (K, |cols|)
        rows = np.repeat(np.arange(n), np.diff(X.indptr))
        if COMPILED and self._local_path in (None, "compiled") and not self.accelerate:
            max_it = self.max_doc_update_iter
            hold_at = np.zeros(max_it + 2, dtype=np.uint8)
            hold_at[[h for h in _HOLD_AT if h <= max_it]] = 1
            gamma, n_iter = np.empty((n, K)), np.empty(n, dtype=np.int64)
            Zc, shift = np.empty(X.nnz), np.empty(n)
            _ldakernel.fit_gamma(np.ascontiguousarray(EbT.T), K,
                                 np.ascontiguousarray(Xc.indptr, dtype=np.int64),
                                 np.ascontiguousarray(Xc.indices, dtype=np.int64),
                                 np.ascontiguousarray(X.data, dtype=np.float64), a_T, tolK, _HOLD_EPS,
                                 max_it, float(digamma(a_T.max())), hold_at,
                                 bool(digamma(a_T.min()) > -300.0), gamma, n_iter, Zc, shift, inv)
            th = self._theta_tempered(gamma, inv)
            # the kernel's θ̃ is exp((ψ(γ) − s)/T) = th · exp((ψ(max γ) − s)/T)
            Z = Zc * np.exp((shift - digamma(gamma.max(axis=1))) * inv)[rows]
        else:
            EbW = np.ascontiguousarray(EbT.T[Xc.indices])    # (nnz, K)
            gamma = np.ones((n, K))
            n_iter = np.zeros(n, dtype=np.int64)
            act = np.ones(n, dtype=bool)
            th = self._theta_tempered(gamma, inv)
            for it in range(1, self.max_doc_update_iter + 1):
                Z = np.einsum("ij,ij->i", th[rows], EbW)
                R = sp.csr_matrix((X.data / Z, Xc.indices, Xc.indptr), shape=Xc.shape)
                G = (R @ EbT.T) * th
                G *= inv
                G += a_T
                change = np.abs(G - gamma).sum(axis=1)
                gamma = np.where(act[:, None], G, gamma)
                n_iter[act] = it
                act &= ~(change < tolK)
                th = self._theta_tempered(gamma, inv)
                if not act.any():
                    break
            Z = np.einsum("ij,ij->i", th[rows], EbW)
        return LDALocal(x=X, gamma=gamma, exp_theta=th, ratio=X.data / Z, exp_beta=EbT,
                        log_norm=np.full(n, np.nan), n_iter=n_iter, cols=cols,
                        xc=Xc, lam_cols=ex.get("lam_cols"))

    @staticmethod
    def _theta_tempered(gamma, inv):
        """exp((E[log θ_dk] − max_k E[log θ_dk]) / T) (ψ(Σγ) cancels)."""
        e = digamma(gamma)
        e -= e.max(axis=1)[:, None]
        e *= inv
        return np.exp(e, out=e)

    #: λ's one block (:mod:`streamsvi.models.blocks`): K Dirichlet rows over the V words,
    #: ``topic_word`` in the plain form (the engine's scaled-columns storage steps it
    #: through the same family, :mod:`streamsvi.inference.storage_columns`)
    param_blocks = (DenseBlock(("topic_word",), Dirichlet(per="row")),)

    def temper(self, target: NatParams, T: float) -> NatParams:
        """Natural parameter ÷ T (seed 002 eq. 8): ``topic_word`` holds Dirichlet
        concentrations λ (natural parameter λ − 1), so λ_T = 1 + (λ − 1)/T."""
        if T == 1.0:
            return target
        (fam,) = (b.family for b in self.param_blocks)
        return NatParams(topic_word=fam.temper((self.lam_matrix(target),), T)[0])

    def random_init(self, rng: np.random.Generator, x, n_total) -> NatParams:
        """Seed 002 §4.1: λ_k = η + s·u_k, u_k ~ Dirichlet(1, …, 1), s = c·D/K.

        c is the mean number of words per document of ``x`` and D = ``n_total``
        documents. η_t of stochastic annealing (``init`` is not consulted).
        """
        return NatParams(topic_word=self.random_topics(rng, self.mean_doc_length(x), n_total))

    def restart_documents(self, local: LDALocal, rng: np.random.Generator, rho: float) -> LDALocal:
        """stochAVI's document-level restart (seed 002 §4.1), for ``Stochastic(local_restart=True)``.

        γ_d ← (1 − ρ) γ_d + ρ η_d with η_d = (c/K)·u_d, u_d ~ Dirichlet(1, …, 1) and c the
        batch's mean document length (the paper's scale c/K for q(π_d)); φ is recomputed at
        the mixed γ, so the statistics follow it. ``log_norm`` is NaN: the engine reports the
        ELBO of the local step before the restart. Draws n·K numbers from ``rng``.
        """
        X = local.x
        Xc = X if local.xc is None else local.xc
        n, K = local.gamma.shape
        eta = (float(X.sum()) / n / K) * rng.dirichlet(np.ones(K), size=n)
        gamma = (1.0 - rho) * local.gamma + rho * eta
        elog_t = self._elog_theta(gamma)
        Et = np.exp(elog_t - elog_t.max(axis=1)[:, None])
        rows = np.repeat(np.arange(n), np.diff(X.indptr))
        Z = np.einsum("ij,ji->i", Et[rows], local.exp_beta[:, Xc.indices])
        return replace(local, gamma=gamma, exp_theta=Et, ratio=X.data / Z, log_norm=np.full(n, np.nan))

    def mean_doc_length(self, x) -> float:
        """c of :meth:`random_init`: the mean number of words per document of ``x``."""
        X = self.check_batch(x)
        return float(X.sum()) / X.shape[0]

    def random_topics(self, rng: np.random.Generator, mean_length: float, n_total) -> np.ndarray:
        """η_t of :meth:`random_init` (K, V) from c = ``mean_length`` instead of the batch
        (the same draws): a scale-out applier draws it from a worker's number."""
        K, V = self.n_components, self.n_features
        return self._eta + (float(mean_length) * float(n_total) / K) * rng.dirichlet(np.ones(V), size=K)

    def local_step(self, lam: NatParams, x, temperature=1.0) -> LDALocal:
        """γ, φ of every document given λ (module docs), with the per-document ELBO.

        Reads λ only in the batch's words (and the topics' row sums), except on
        the dense path (V·K small), so its cost does not grow with V.
        ``temperature`` T ≠ 1: the tempered local step of :meth:`_fit_gamma_tempered`
        (detAVI), on the same columns; T == 1 runs exactly the untempered code.
        """
        X = self.check_batch(x)
        dense = not self.accelerate and not (COMPILED and self._local_path in (None, "compiled")) \
            and self._use_dense(X)
        cols, Xc = None, X
        if not dense:
            seen = np.zeros(self.n_features, dtype=bool)
            seen[X.indices] = True
            cols = np.flatnonzero(seen)
            if cols.size == self.n_features:
                cols = None
            else:
                pos = np.cumsum(seen, dtype=X.indices.dtype)
                pos -= 1
                Xc = sp.csr_matrix((X.data, pos[X.indices], X.indptr), shape=(X.shape[0], cols.size))
        ex = self._expectations(lam, cols)
        if temperature != 1.0:
            return self._fit_gamma_tempered(ex, X, float(temperature), cols, Xc)
        if self.accelerate:
            gamma, n_iter = self._fit_gamma_squarem(_Words(self._ext(ex), Xc))
            Z = zlog = None
        elif COMPILED and self._local_path in (None, "compiled"):
            gamma, n_iter, Z, zlog = self._fit_gamma_compiled(ex, Xc)
        elif dense:
            gamma, n_iter = self._fit_gamma_dense(ex["exp_beta"], X)
            Z = zlog = None
        else:
            gamma, n_iter, Z, zlog = self._fit_gamma(_Words(self._ext(ex), Xc))
        return self._finish(ex, X, gamma, n_iter, Z, zlog, cols, Xc)

    def _finish(self, ex, X, gamma, n_iter, Z=None, zlog=None, cols=None, Xc=None) -> LDALocal:
        """φ at the final γ: ratios n_dw/Z'_dw, shifted exp E[log θ], and L_d.

        ``Z``, ``zlog``: None (Z computed here) or as returned by :meth:`_fit_gamma`.
        ``cols``, ``Xc``: the batch's word ids and the batch renumbered into them
        when ``ex`` holds only those columns (see :class:`LDALocal`).
        """
        Xc = X if Xc is None else Xc
        n, K = gamma.shape
        elog_t = self._elog_theta(gamma)
        c = elog_t.max(axis=1)
        Et = np.exp(elog_t - c[:, None])
        rows = np.repeat(np.arange(n), np.diff(X.indptr))
        if Z is None:
            Z = np.einsum("ij,ji->i", Et[rows], ex["exp_beta"][:, Xc.indices])
        else:
            Z = Z * np.exp(zlog)[rows]
        ratio = X.data / Z
        word_ll = np.bincount(rows, weights=X.data * (np.log(Z) + ex["m"][Xc.indices]), minlength=n)
        Nd = np.bincount(rows, weights=X.data, minlength=n)
        log_norm = (word_ll + Nd * c + self._alpha_const - gammaln(gamma.sum(axis=1))
                    + gammaln(gamma).sum(axis=1) + ((self._alpha - gamma) * elog_t).sum(axis=1))
        return LDALocal(x=X, gamma=gamma, exp_theta=Et, ratio=ratio, exp_beta=ex["exp_beta"],
                        log_norm=log_norm, n_iter=n_iter, cols=cols, xc=Xc,
                        lam_cols=ex.get("lam_cols"))

    # ------------------------------------------------- sufficient statistics
    def _ratio_matrix(self, local: LDALocal, ratio=None) -> sp.csr_matrix:
        X = local.x if local.xc is None else local.xc
        return sp.csr_matrix((local.ratio if ratio is None else ratio, X.indices, X.indptr),
                             shape=X.shape)

    def _full(self, local: LDALocal, S: np.ndarray) -> np.ndarray:
        """Statistics over the batch's columns ``local.cols`` placed in a (K, V) array."""
        if local.cols is None:
            return S
        out = np.zeros((self.n_components, self.n_features))
        out[:, local.cols] = S
        return out

    def _suffstats_cols(self, local: LDALocal, weights=None) -> np.ndarray:
        """Σ_d w_d n_dw φ_dwk in the columns of ``local.exp_beta`` (the batch's words)."""
        Et = local.exp_theta if weights is None else local.exp_theta * np.asarray(weights)[:, None]
        S = (self._ratio_matrix(local).T @ Et).T
        S *= local.exp_beta
        return S

    def _suffstats_pair_cols(self, local: LDALocal, weights):
        K = self.n_components
        Et = local.exp_theta
        M = np.concatenate([Et * np.asarray(weights)[:, None], Et], axis=1)
        S = (self._ratio_matrix(local).T @ M).T
        S[:K] *= local.exp_beta
        S[K:] *= local.exp_beta
        return S[:K], S[K:]

    def column_suffstats(self, local: LDALocal, weights=None):
        """(cols, weighted, unweighted): the statistics over the batch's columns only.

        ``cols`` are the batch's sorted word ids (all V when the local step read every
        column); the two arrays (K, len(cols)) are Σ_d w_d n_dw φ_dwk and Σ_d n_dw φ_dwk
        (the same array when ``weights`` is None). The engine's scaled-columns storage
        steps λ from them (:mod:`streamsvi.inference.storage_columns`)."""
        cols = np.arange(self.n_features) if local.cols is None else local.cols
        if weights is None:
            S = self._suffstats_cols(local)
            return cols, S, S
        return (cols, *self._suffstats_pair_cols(local, weights))

    def suffstats(self, local: LDALocal, x=None, weights=None) -> NatParams:
        """Σ_d w_d n_dw φ_dwk for every (k, w): (K, V). ``x`` is read from ``local``."""
        return NatParams(topic_word=self._full(local, self._suffstats_cols(local, weights)))

    def suffstats_pair(self, local: LDALocal, x, weights):
        """(weighted, unweighted) statistics with one sparse product."""
        Sw, S = self._suffstats_pair_cols(local, weights)
        return NatParams(topic_word=self._full(local, Sw)), NatParams(topic_word=self._full(local, S))

    def suffstats_sqnorm(self, local: LDALocal, x=None) -> np.ndarray:
        """Σ_{k,w} (n_dw φ_dwk)² per document."""
        R2 = self._ratio_matrix(local, local.ratio ** 2)
        Eb2T = (local.exp_beta ** 2).T
        return ((R2 @ Eb2T) * local.exp_theta ** 2).sum(axis=1)

    # ---------------------------------------------------------------- ELBO
    def local_elbo(self, local: LDALocal) -> np.ndarray:
        return local.log_norm

    def global_elbo(self, lam: NatParams, aux=None) -> float:
        """−Σ_k KL(Dirichlet(λ_k) ‖ Dirichlet(η)), all constants included.

        One dense pass over λ in column blocks of ``_CHUNK`` elements (no K×V
        temporaries): G = K·c_η + Σ_k [−log Γ(T_k) − ψ(T_k)(Vη − T_k)]
        + Σ_kw [log Γ(λ_kw) + (η − λ_kw) ψ(λ_kw)], T_k = Σ_w λ_kw.
        """
        K, V = self.n_components, self.n_features
        eta = self._eta
        T = np.zeros(K)
        acc = 0.0
        for lo, hi in self._chunks():
            Lc = self.lam_columns(lam, slice(lo, hi))
            T += Lc.sum(axis=0)
            f = digamma(Lc)
            f *= eta - Lc
            f += gammaln(Lc)
            acc += float(f.sum())
        return float(K * self._eta_const - gammaln(T).sum() - (digamma(T) * (V * eta - T)).sum() + acc)

    def _chunks(self):
        """Column ranges of about ``_CHUNK`` elements of a (K, V) array."""
        V = self.n_features
        step = max(1, _CHUNK // self.n_components)
        return [(lo, min(V, lo + step)) for lo in range(0, V, step)]

    # -------------------------------------------------------------- domain
    def in_domain(self, lam: NatParams) -> bool:
        """True when every λ_kw is finite and > 0."""
        if not lam.all_finite():
            return False
        if not self.is_scaled(lam):
            return bool(lam["topic_word"].min() > 0)
        s, c = lam["topic_scale"], lam["topic_offset"]
        if not (s > 0).all():
            return False
        return bool((s * lam["word_topic"].min(axis=0) + c).min() > 0)

    def max_step(self, lam: NatParams, target: NatParams):
        """One block per topic: the largest s keeping every λ_kw of topic k > 0."""
        (fam,) = (b.family for b in self.param_blocks)
        return [(("topic_word",), fam.max_step((self.lam_matrix(lam),), (self.lam_matrix(target),)))]

    # ------------------------------------------------------------- scoring
    def topics(self, lam: NatParams, aux=None) -> np.ndarray:
        """E_q[β] (K, V): each topic's word distribution."""
        L = self.lam_matrix(lam)
        return L / self._rowsums(lam)[:, None]

    def topic_proportions(self, lam: NatParams, x, aux=None) -> np.ndarray:
        """E_q[θ_d] = γ_d / Σγ_d (n, K) for new documents (scikit-learn's ``transform``)."""
        g = self.local_step(lam, x).gamma
        return g / g.sum(axis=1, keepdims=True)

    def responsibilities(self, lam: NatParams, x, aux=None) -> np.ndarray:
        """Topic proportions E_q[θ_d] (the scoring interface's name)."""
        return self.topic_proportions(lam, x)

    def score_columns(self, lam: NatParams, x, aux=None) -> dict:
        """Scores per document (``streamsvi score``, ``ScoresRecords``): the dominant ``topic``,
        the ``topic_proportions`` E_q[θ_d], the document's bound ``log_bound`` L_d (as
        :meth:`predictive_logpdf`) and ``perword_bound`` L_d / N_d (NaN, so absent, for a
        document of no words). One local step for all of them."""
        X = self.check_batch(x)
        local = self.local_step(lam, X)
        g = local.gamma
        theta = g / g.sum(axis=1, keepdims=True)
        bound = np.asarray(local.log_norm, dtype=np.float64)
        words = np.asarray(X.sum(axis=1), dtype=np.float64).reshape(-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            per_word = np.where(words > 0, bound / np.where(words > 0, words, 1.0), np.nan)
        return {"topic": theta.argmax(axis=1), "topic_proportions": theta, "log_bound": bound,
                "perword_bound": per_word}

    def predict(self, lam: NatParams, x, aux=None) -> np.ndarray:
        """The dominant topic of each document."""
        return self.topic_proportions(lam, x).argmax(axis=1)

    def predictive_logpdf(self, lam: NatParams, x, aux=None) -> np.ndarray:
        """L_d per document: the local-step lower bound on log p(w_d | α, data).

        The words of a document are scored as a sequence (no multinomial
        coefficient), with β integrated under q(β) inside the bound; the
        topics' KL term is not included (``topic_kl="none"`` below).
        """
        return self.local_step(lam, x).log_norm

    def heldout_bound(self, lam: NatParams, x, topic_kl: str = "none", n_docs=None, aux=None):
        """(Σ_d L_d + c·G, Σ_d N_d) for the documents ``x``; see the module docs for c."""
        X = self.check_batch(x)
        docs = float(np.sum(self.local_step(lam, X).log_norm))
        words = float(X.data.sum())
        if topic_kl == "none":
            c = 0.0
        elif topic_kl == "full":
            c = 1.0
        elif topic_kl == "apportioned":
            if n_docs is None or not n_docs >= X.shape[0]:
                raise ValueError(f"topic_kl='apportioned' needs n_docs >= {X.shape[0]} (the number "
                                 f"of documents the model was fitted to), got {n_docs!r}")
            c = X.shape[0] / float(n_docs)
        else:
            raise ValueError(f"topic_kl must be 'none', 'full' or 'apportioned', got {topic_kl!r}")
        return docs + (c * self.global_elbo(lam) if c else 0.0), words

    def perword_bound(self, lam: NatParams, x, topic_kl: str = "none", n_docs=None, aux=None) -> float:
        """Held-out bound per word; see the module docs."""
        b, w = self.heldout_bound(lam, x, topic_kl, n_docs)
        if w <= 0:
            raise ValueError("the documents hold no words")
        return b / w

    def perplexity(self, lam: NatParams, x, topic_kl: str = "none", n_docs=None, aux=None) -> float:
        """exp(−perword_bound): lower is better."""
        return math.exp(-self.perword_bound(lam, x, topic_kl, n_docs))
