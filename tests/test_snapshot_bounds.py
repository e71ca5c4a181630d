"""Crafted snapshot directories cannot exhaust memory or CPU (issue 30, item 5).

Each case forges a snapshot the way an attacker could: the checksums in
``snapshot.json`` are integrity checks, not signatures, so they are recomputed
for the forged files. Before the fix:

* a 6.7 MB ``state.npz`` with a hidden 1.6 GB deflated member was read whole
  (1.66 GB of RSS) before names or shapes were checked;
* ``snapshot.json``, ``latest`` or ``state.npz`` as a symbolic link to
  ``/dev/zero`` was read (or hashed) without end.

The loads that could hang or blow up run in a subprocess under an address-space
limit (1 GiB) and a time limit, so a regression fails the test instead of the
machine.
"""
import json
import os
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest

import streamsvi.checkpoint as ckpt
from streamsvi import SVI
from streamsvi.checkpoint import CheckpointStore, CorruptSnapshotError, load_snapshot
from streamsvi.inference.state import state_to_arrays
from streamsvi.models import BayesianGMM

LIMIT_BYTES = 1 << 30


@pytest.fixture
def store(tmp_path):
    X = np.random.default_rng(0).normal(size=(200, 2))
    engine = SVI(BayesianGMM(2, 2), n_total=200)
    state = engine.init(X, seed=0)
    st = CheckpointStore(tmp_path / "ck")
    for i in range(2):
        state, _ = engine.update(state, X[100 * i:100 * (i + 1)])
        st.save(engine, state, [])
    return tmp_path / "ck", engine, state


def _forge_state(snapdir, write):
    """Replace state.npz by what ``write(path)`` writes and make the metadata agree with it."""
    path = snapdir / "state.npz"
    path.unlink()
    write(path)
    with open(path, "rb") as f:
        digest, size = ckpt._sha256_of_file(f)
    meta = json.loads((snapdir / "snapshot.json").read_text())
    meta["state_file"] = {"name": "state.npz", "sha256": digest, "size": size}
    meta["checksum"]["value"] = ckpt._json_checksum(meta)
    (snapdir / "snapshot.json").write_text(json.dumps(meta))


def _load_limited(directory, what="snapshot", timeout=120):
    """Load in a subprocess under a 1 GiB address-space limit; (returncode, stdout + stderr)."""
    code = textwrap.dedent(f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, ({LIMIT_BYTES}, {LIMIT_BYTES}))
        from streamsvi.checkpoint import load_snapshot, CorruptSnapshotError
        from streamsvi.scoring import SnapshotWatcher
        try:
            if {what!r} == "snapshot":
                load_snapshot(sys.argv[1])
            else:
                w = SnapshotWatcher(sys.argv[1])
                w.refresh()
                print("watching", w.current().number)
        except CorruptSnapshotError as e:
            print("refused:", e)
        # VmHWM is this process's own peak; ru_maxrss would carry the parent's (pytest's) peak
        # over fork and exec on Linux, so a long test session would read as this load's memory
        with open("/proc/self/status") as f:
            print("maxrss_kb", next(l.split()[1] for l in f if l.startswith("VmHWM:")))
    """)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-c", code, str(directory)], capture_output=True, text=True,
                       timeout=timeout, env=env)
    return p.returncode, p.stdout + p.stderr


def _maxrss_mb(out):
    return int(out.rsplit("maxrss_kb", 1)[1].split()[0]) / 1024


def test_a_hidden_deflated_member_is_refused_before_anything_is_read(store):
    ck, engine, state = store
    snap = ck / "snap-00000002"
    n = 200_000_000                                     # 1.6 GB of float64 in a ~7 MB file

    def write(path):
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
            for k, v in state_to_arrays(engine, state).items():
                with zf.open(k + ".npy", "w") as m:
                    np.lib.format.write_array(m, v, allow_pickle=False)
            with zf.open("lam/hidden.npy", "w", force_zip64=True) as m:
                np.lib.format.write_array_header_1_0(m, {"descr": "<f8", "fortran_order": False, "shape": (n,)})
                chunk = bytes(1 << 24)
                for _ in range(n * 8 // len(chunk)):
                    m.write(chunk)
                m.write(bytes(n * 8 % len(chunk)))

    _forge_state(snap, write)
    assert (snap / "state.npz").stat().st_size < 20 << 20
    rc, out = _load_limited(snap)
    assert rc == 0 and "refused:" in out and "is compressed" in out, out
    assert _maxrss_mb(out) < 800, out                      # the import alone is 200-450 MB; it read 1.66 GB


def test_members_that_declare_more_than_the_file_or_odd_dtypes_are_refused(store):
    ck, engine, state = store
    snap = ck / "snap-00000002"
    arrays = state_to_arrays(engine, state)

    def lying_header(path):                 # a stored member whose header claims 10**9 rows
        with zipfile.ZipFile(path, "w") as zf:
            for k, v in arrays.items():
                with zf.open(k + ".npy", "w") as m:
                    np.lib.format.write_array(m, v)
            with zf.open("lam/big.npy", "w") as m:
                np.lib.format.write_array_header_1_0(m, {"descr": "<f8", "fortran_order": False,
                                                         "shape": (10 ** 9,)})
                m.write(bytes(64))

    _forge_state(snap, lying_header)
    with pytest.raises(CorruptSnapshotError, match=r"declares shape \(1000000000,\)"):
        load_snapshot(snap)

    def strings(path):
        np.savez(path, **arrays, **{"lam/names": np.array(["a", "b"])})

    _forge_state(snap, strings)
    with pytest.raises(CorruptSnapshotError, match="only numeric arrays are read"):
        load_snapshot(snap)


@pytest.mark.parametrize("name", ["snapshot.json", "state.npz"])
def test_a_file_linked_to_dev_zero_is_refused(store, name):
    ck, _, _ = store
    snap = ck / "snap-00000002"
    (snap / name).unlink()
    os.symlink("/dev/zero", snap / name)
    rc, out = _load_limited(snap, timeout=60)
    assert rc == 0 and "refused:" in out and "symbolic link" in out, out
    # the checkpoint directory falls back to the older snapshot
    assert load_snapshot(ck).number == 1


def test_latest_linked_to_dev_zero_is_refused_and_the_newest_snapshot_is_used(store):
    ck, _, _ = store
    (ck / "latest").unlink()
    os.symlink("/dev/zero", ck / "latest")
    rc, out = _load_limited(ck, what="watcher", timeout=60)
    assert rc == 0 and "watching 2" in out, out
    assert load_snapshot(ck).number == 2
    assert "refused" in ckpt.pointer_text(ck)


def test_a_linked_snapshot_directory_or_a_fifo_is_refused(store, tmp_path):
    ck, _, _ = store
    outside = tmp_path / "elsewhere"
    os.rename(ck / "snap-00000002", outside)
    os.symlink(outside, ck / "snap-00000002")
    with pytest.raises(CorruptSnapshotError, match="is a symbolic link"):
        load_snapshot(ck / "snap-00000002")
    assert load_snapshot(ck).number == 1
    snap = ck / "snap-00000001"
    (snap / "snapshot.json").unlink()
    os.mkfifo(snap / "snapshot.json")                  # opening it must not block
    with pytest.raises(CorruptSnapshotError, match="not a regular file"):
        load_snapshot(snap)


def test_settings_that_imply_a_huge_lambda_are_refused_before_any_model_is_built(store):
    """A forged n_features made the loader build the model's prior first (about 3 GB); now the
    settings are checked against the state file's size before anything is built."""
    ck, _, _ = store
    snap = ck / "snap-00000002"
    meta = json.loads((snap / "snapshot.json").read_text())
    meta["model"]["params"]["n_features"] = 20_000         # λ of 2 × 20000² float64: 6.4 GB
    meta["checksum"]["value"] = ckpt._json_checksum(meta)
    (snap / "snapshot.json").write_text(json.dumps(meta))
    rc, out = _load_limited(snap)
    assert rc == 0 and "refused:" in out and "imply a λ of" in out and "do not belong to this state" in out, out
    assert _maxrss_mb(out) < 800, out                      # the import alone is 200-450 MB; it read 1.66 GB


@pytest.mark.parametrize("name", ["gmm", "gauss1d", "hmm", "lda"])
def test_param_size_is_the_size_of_the_models_lambda(name):
    from streamsvi.models import MODELS

    cls = MODELS[name]
    for _, factory in cls.check_cases().items():
        model = factory()[0]
        n = cls.param_size(cls.check_settings(model.get_params()))
        assert n == sum(np.asarray(a).size for a in model.prior().values()), name
