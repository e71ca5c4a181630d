"""LDA at real vocabulary sizes: streamsvi vs scikit-learn online LDA vs gensim on a
synthetic corpus with Zipf word frequencies, V = 10k … 1M, K = 100.

Corpus (``make_zipf_corpus``, deterministic in its seed): 100 true topics; a
document draws θ_d ~ Dirichlet(0.1) and N_d ~ Poisson(120) tokens; a token
of topic k draws a rank r from Zipf(1.0) truncated to V and maps it to the
word ``(r // 64) * 64 + (a_k * (r % 64) + b_k) % 64`` (a_k odd): every topic
shuffles the words within each block of 64 ranks its own way, so the corpus'
word frequencies follow Zipf's law block by block, the topics differ (mostly
in their head words), and no K × V topic matrix is ever stored. 6,000
training and 600 held-out documents (same corpus draw), ~720k training tokens.

Every run is a subprocess (``--worker``), so its peak RSS
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``, read right after training,
before evaluation) is its own; the table gives it in MiB and in topic-sized
arrays (K × V × 8 bytes), both the whole process and its growth over the
process after loading the corpus (the "baseline": interpreter, libraries and
the corpus).

Settings as ``bench/lda_nyt.py``: K = 100, α = η = 1/K, minibatches of 256
documents in corpus order, one pass, ρ_t = (10 + t)^(−0.7) for all three
(scikit-learn ``learning_offset=10, learning_decay=0.7``; gensim
``offset=11, decay=0.7``), at most 100 local sweeps, mean |Δγ| < 1e-3,
N = 6,000, single-threaded BLAS. Timed: the training updates only
(streamsvi ``SVI.update`` per batch, with its ELBO and gradient metrics;
scikit-learn ``partial_fit`` per batch; gensim ``LdaModel(corpus, ...)``,
``eval_every=None``). One evaluator for all: ``LDA.perplexity(λ, X_test,
topic_kl="none")`` (held-out local-step bound, mean |Δγ| < 1e-4, up to 500
sweeps). Methods alternate within each repeat (seeds 0, 1, …).

Run::

    python bench/lda_vocab.py                           # V = 10k, 30k, 100k (all three), 1M (streamsvi)
    python bench/lda_vocab.py --vocab 100000 --repeats 1
    python bench/lda_vocab.py --vocab 1000000 --methods streamsvi
"""
from __future__ import annotations

import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402

from _common import blas_build, cpu_model, fmt_table  # noqa: E402  (bench/ sibling)

OUT = Path(__file__).resolve().parent / "out"
K, BATCH, TAU0, KAPPA = 100, 256, 10.0, 0.7
TOL, MAX_IT = 1e-3, 100
N_TRAIN, N_TEST, DOC_LEN, TRUE_K, ZIPF_S, BLOCK = 6000, 600, 120, 100, 1.0, 64
T0 = time.time()


def log(msg):
    print(f"[lda_vocab {time.time() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def make_zipf_corpus(V, n_docs, seed=0):
    """(n_docs, V) CSR counts from the generator in the module docs."""
    rng = np.random.default_rng(seed)
    cdf = np.cumsum(1.0 / np.arange(1, V + 1) ** ZIPF_S)
    cdf /= cdf[-1]
    a = 2 * rng.integers(0, BLOCK // 2, TRUE_K) + 1
    b = rng.integers(0, BLOCK, TRUE_K)
    theta = rng.dirichlet(np.full(TRUE_K, 0.1), n_docs)
    lens = rng.poisson(DOC_LEN, n_docs)
    # topic of every token: per document, a multinomial split of its length
    counts = np.array([rng.multinomial(n, t) for n, t in zip(lens, theta)])
    doc = np.repeat(np.arange(n_docs), lens)
    topic = np.repeat(np.tile(np.arange(TRUE_K), n_docs), counts.ravel())
    r = np.minimum(np.searchsorted(cdf, rng.random(doc.size)), V - 1)
    word = (r // BLOCK) * BLOCK + (a[topic] * (r % BLOCK) + b[topic]) % BLOCK
    word = np.where(word < V, word, r)            # the last, partial block: unshuffled
    X = sp.csr_matrix((np.ones(doc.size), (doc, word)), shape=(n_docs, V))
    X.sum_duplicates()
    return X


def corpus_path(V):
    return OUT / f"lda_vocab_corpus_{V}.npz"


def ensure_corpus(V):
    p = corpus_path(V)
    if not p.exists():
        X = make_zipf_corpus(V, N_TRAIN + N_TEST, seed=0)
        p.parent.mkdir(parents=True, exist_ok=True)
        sp.save_npz(p, X)
    return p


# ------------------------------------------------------------------- worker
def _rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0   # Linux: KiB


def worker(method, V, seed):
    X = sp.load_npz(corpus_path(V)).tocsr()
    Xtr, Xte = X[:N_TRAIN], X[N_TRAIN:]
    batches = [Xtr[i:i + BATCH] for i in range(0, N_TRAIN, BATCH)]
    if method == "gensim":
        corpus = [list(zip(Xtr.indices[Xtr.indptr[i]:Xtr.indptr[i + 1]].tolist(),
                           Xtr.data[Xtr.indptr[i]:Xtr.indptr[i + 1]].tolist())) for i in range(N_TRAIN)]
    base = _rss_mib()
    from streamsvi.models import LDA, NatParams

    if method.startswith("streamsvi"):
        from streamsvi import SVI, RobbinsMonro

        model = LDA(K, V, doc_topic_prior=1.0 / K, topic_word_prior=1.0 / K,
                    mean_change_tol=TOL, max_doc_update_iter=MAX_IT)
        engine = SVI(model, n_total=N_TRAIN, schedule=RobbinsMonro(tau0=TAU0, kappa=KAPPA))
        t = time.perf_counter()
        state = engine.init(batches[0], seed=seed)
        for xb in batches:
            state, _ = engine.update(state, xb)
        secs = time.perf_counter() - t
        peak = _rss_mib()
        as_matrix = getattr(model, "lam_matrix", None)     # (releases before it: λ is lam itself)
        lam = NatParams(topic_word=as_matrix(state.lam) if as_matrix else state.lam["topic_word"])
        del state
    elif method == "scikit-learn":
        from sklearn.decomposition import LatentDirichletAllocation

        lda = LatentDirichletAllocation(
            n_components=K, doc_topic_prior=1.0 / K, topic_word_prior=1.0 / K,
            learning_method="online", learning_offset=TAU0, learning_decay=KAPPA,
            batch_size=BATCH, total_samples=N_TRAIN, mean_change_tol=TOL,
            max_doc_update_iter=MAX_IT, evaluate_every=-1, random_state=seed)
        t = time.perf_counter()
        for xb in batches:
            lda.partial_fit(xb)
        secs = time.perf_counter() - t
        peak = _rss_mib()
        lam = NatParams(topic_word=lda.components_)
        del lda
    elif method == "gensim":
        from gensim.models import LdaModel

        t = time.perf_counter()
        lda = LdaModel(corpus=corpus, num_topics=K, id2word={i: str(i) for i in range(V)},
                       alpha=np.full(K, 1.0 / K), eta=1.0 / K, chunksize=BATCH, passes=1,
                       update_every=1, decay=KAPPA, offset=TAU0 + 1, iterations=MAX_IT,
                       gamma_threshold=TOL, eval_every=None, random_state=seed, dtype=np.float64)
        secs = time.perf_counter() - t
        peak = _rss_mib()
        lam = NatParams(topic_word=lda.state.get_lambda())
        del lda
    else:
        raise SystemExit(f"unknown method {method!r}")
    ev = LDA(K, V, doc_topic_prior=1.0 / K, topic_word_prior=1.0 / K, mean_change_tol=1e-4,
             max_doc_update_iter=500)
    ppl = ev.perplexity(lam, Xte, topic_kl="none")
    print(json.dumps({"method": method, "V": V, "seed": seed, "secs": secs, "docs_per_s": N_TRAIN / secs,
                      "perplexity": ppl, "peak_mib": peak, "base_mib": base}))


def run_one(method, V, seed):
    out = subprocess.run([sys.executable, __file__, "--worker", method, str(V), str(seed)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        log(f"{method} V={V} failed (exit {out.returncode}): {out.stderr.strip().splitlines()[-1:]}")
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------- parent
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, nargs="+", default=[10_000, 30_000, 100_000, 1_000_000])
    ap.add_argument("--methods", nargs="+", default=["streamsvi", "scikit-learn", "gensim"])
    ap.add_argument("--peers-up-to", type=int, default=100_000,
                    help="run scikit-learn and gensim only up to this V (default 100k: at 1M "
                         "each update is a dense pass over 100 × 1M topics, minutes per run)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--worker", nargs=3, metavar=("METHOD", "V", "SEED"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        m, V, seed = args.worker
        worker(m, int(V), int(seed))
        return
    log(f"CPU {cpu_model()}, BLAS {blas_build()}, single-threaded; machine shared with other jobs")
    rows, ratios = [], []
    for V in args.vocab:
        ensure_corpus(V)
        X = sp.load_npz(corpus_path(V))
        log(f"V = {V:,}: {X.shape[0]:,} documents, {int(X.sum()):,} tokens, "
            f"{np.count_nonzero(np.asarray(X[:N_TRAIN].sum(0)).ravel()):,} distinct training words")
        methods = [m for m in args.methods if m.startswith("streamsvi") or V <= args.peers_up_to]
        res = {}
        for rep in range(args.repeats):
            for m in methods:
                log(f"V = {V:,}: {m}, repeat {rep + 1}/{args.repeats}")
                r = run_one(m, V, rep)
                if r is not None:
                    res.setdefault(m, []).append(r)
                    log(f"   {r['docs_per_s']:,.0f} docs/s, perplexity {r['perplexity']:,.1f}, "
                        f"peak RSS {r['peak_mib']:,.0f} MiB")
        arr_mib = K * V * 8 / 2 ** 20
        for m, rs in res.items():
            rates = np.array([r["docs_per_s"] for r in rs])
            ppl = np.array([r["perplexity"] for r in rs])
            se = ppl.std(ddof=1) / math.sqrt(len(ppl)) if len(ppl) > 1 else float("nan")
            peak = max(r["peak_mib"] for r in rs)
            base = min(r["base_mib"] for r in rs)
            rows.append([f"{V:,}", m, f"{np.median(rates):,.0f}", f"{ppl.mean():,.1f}", f"{se:.1f}",
                         f"{peak:,.0f}", f"{peak / arr_mib:.1f}", f"{(peak - base) / arr_mib:.1f}"])
        if "streamsvi" in res:
            ours = np.median([r["docs_per_s"] for r in res["streamsvi"]])
            our_ppl = np.mean([r["perplexity"] for r in res["streamsvi"]])
            for m in ("scikit-learn", "gensim"):
                if m in res:
                    theirs = np.median([r["docs_per_s"] for r in res[m]])
                    their_ppl = np.mean([r["perplexity"] for r in res[m]])
                    ratios.append(f"  V = {V:,}: streamsvi / {m} = {ours / theirs:.2f}x median docs/s; "
                                  f"perplexity {our_ppl:,.1f} vs {their_ppl:,.1f}")
    print(f"\nLDA, K = {K}, synthetic Zipf corpus, {N_TRAIN:,} training documents, one pass "
          f"(topic-sized array = K·V·8 bytes)")
    print(fmt_table(["V", "method", "docs/s (median)", "perplexity (mean)", "(s.e.)", "peak RSS MiB",
                     "in arrays", "growth in arrays"], rows, left=2))
    print("\n".join(ratios))


if __name__ == "__main__":
    main()
