"""Snapshots written by the code before the block API (issue 24) still load and resume exactly.

The fixtures in tests/data/ were written by the pre-change code (commit 61b6184)
with tests/data/make_prechange_snapshots.py: a GMM and a PMF state after four
SVI+ updates, and the λ one more update gave then. Today's code must load the
state and make the same update bit for bit.
"""
import os

import numpy as np
import pytest

from streamsvi.inference.state import load_state

from tests.data.make_prechange_snapshots import gmm_data, pmf_data

DATA = os.path.join(os.path.dirname(__file__), "data")


def _expected(name):
    with np.load(os.path.join(DATA, f"prechange_{name}_next.npz"), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


@pytest.mark.parametrize("name", ["gmm", "pmf"])
def test_prechange_snapshot_resumes_bit_for_bit(name):
    engine, state = load_state(os.path.join(DATA, f"prechange_{name}_state.npz"))
    assert state.step == 4
    if name == "gmm":
        batch = gmm_data()[240:300]
    else:
        batch = pmf_data()[np.arange(400, 600)]
    new, info = engine.update(state, batch)
    want = _expected(name)
    for k, v in new.lam.items():
        np.testing.assert_array_equal(np.asarray(v), want[f"lam/{k}"], err_msg=k)
    for k, v in want.items():
        if k.startswith("aux/"):
            np.testing.assert_array_equal(np.asarray(new.aux[k[4:]]), v, err_msg=k)
