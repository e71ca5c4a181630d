"""How ``lda_snapshot_v0/`` and ``lda_snapshot_v0_next.npz`` were made, with the code before
LDA's step moved onto the engine's scaled-columns storage (main at 61b6184):

    /work/wt-base/.venv/bin/python tests/data/make_lda_snapshot_v0.py tests/data

The snapshot holds LDA's scaled λ (word_topic, topic_scale, topic_offset,
topic_stored_sum) and aux (stored_sqsum, global_elbo, global_elbo_step) after 5 SVI+
updates; the .npz holds, from that snapshot resumed by the same code, λ after 3 more
updates and their ELBOs and gradient norms (``tests/inference/test_lda_snapshot_v0.py``).
"""
import os
import shutil
import sys
import tempfile

import numpy as np

from streamsvi.checkpoint import CheckpointStore
from streamsvi.datasets import make_lda_corpus
from streamsvi.inference import SVI, RobbinsMonro
from streamsvi.models import LDA


def corpus():
    return make_lda_corpus(n_docs=80, n_topics=3, n_words=150, doc_length=12, seed=3)[0]


def main(out):
    X = corpus()
    model = LDA(3, 150, doc_topic_prior=0.3, topic_word_prior=0.05)
    engine = SVI(model, n_total=80, schedule=RobbinsMonro(tau0=1.0, kappa=0.7), effective_batch_size=10)
    state, _ = engine.fit(engine.init(X, seed=0), X, n_steps=5, batch_size=20)
    snap = os.path.join(out, "lda_snapshot_v0")
    CheckpointStore(snap).save(engine, state, offsets=[])
    os.remove(os.path.join(snap, ".lock"))
    with tempfile.TemporaryDirectory() as tmp:          # resume from a copy, as the test does
        shutil.copytree(snap, os.path.join(tmp, "s"))
        resumed = CheckpointStore(os.path.join(tmp, "s")).latest()
        lam_loaded = resumed.engine.model.lam_matrix(resumed.state.lam)
        st, infos = resumed.engine.fit(resumed.state, X, n_steps=3, batch_size=20)
        np.savez(os.path.join(out, "lda_snapshot_v0_next.npz"), lam_loaded=lam_loaded,
                 lam_next=resumed.engine.model.lam_matrix(st.lam),
                 elbo=np.array([i.elbo for i in infos]), grad_norm=np.array([i.grad_norm for i in infos]),
                 grad_variance=np.array([i.grad_variance for i in infos]))


if __name__ == "__main__":
    main(sys.argv[1])
