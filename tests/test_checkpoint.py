"""The checkpoint store: atomic numbered snapshots, retention, fallback, crash safety.

Every test writes real files under ``tmp_path``. The daemon relies on one
promise (docs/design.md, "Delivery contract"): whatever happens
during ``save``, the directory opens to a complete snapshot, the old one or
the new one, and a snapshot ``save`` returned is durable.
"""
import errno
import json
import logging
import os
import re
import shutil
import threading
import time
from datetime import datetime, timezone

import numpy as np
import pytest

from streamsvi import checkpoint as ckpt
from streamsvi._version import __version__
from streamsvi.checkpoint import (CheckpointStore, CorruptSnapshotError, IncompatibleSnapshotError,
                                  check_compatible, load_snapshot)
from streamsvi.datasets import make_blobs
from streamsvi.inference import SVI, RobbinsMonro
from streamsvi.inference.state import state_to_arrays
from streamsvi.models import BayesianGMM, KnownVarianceGMM1D

LOGGER = "streamsvi.checkpoint"


@pytest.fixture(scope="module")
def run():
    """An SVI+ engine (so the random stream matters) and the states of its first 40 steps."""
    X, _ = make_blobs(400, seed=1)
    engine = SVI(BayesianGMM(3, 2), n_total=100, effective_batch_size=10)
    state = engine.init(X, seed=0)
    states = [state]
    for i in range(40):
        state, _ = engine.update(state, X[(20 * i) % 400:(20 * i) % 400 + 20])
        states.append(state)
    return engine, X, states


def offsets(step):
    return [{"source": "points", "partition": 0, "offset": 20 * step},
            {"source": "points", "partition": 1, "offset": 7 * step}]


def assert_same_state(a, b):
    assert a.step == b.step and a.records_seen == b.records_seen
    assert a.rng_state == b.rng_state
    assert sorted(a.lam) == sorted(b.lam)
    for k in a.lam:
        assert a.lam[k].dtype == b.lam[k].dtype and a.lam[k].shape == b.lam[k].shape
        assert a.lam[k].tobytes() == b.lam[k].tobytes(), f"λ[{k}] differs"


def filled_store(d, run, steps=(1, 2, 3), keep=3):
    engine, _, states = run
    store = CheckpointStore(d, keep=keep)
    for s in steps:
        store.save(engine, states[s], offsets(s), config={"step_saved": s})
    return store


def rewrite_meta(snapdir, **changes):
    """Change fields of snapshot.json and recompute its checksum (a 'valid' forgery)."""
    meta = json.loads((snapdir / "snapshot.json").read_text())
    meta.update(changes)
    meta["checksum"]["value"] = ckpt._json_checksum(meta)
    (snapdir / "snapshot.json").write_text(json.dumps(meta))


# ----------------------------------------------------------------- round trip
def test_round_trip_is_exact(tmp_path, run):
    engine, X, states = run
    state = states[7]
    config = {"kafka": {"topics": ["points"], "group": "g1"}, "batch_size": 20, "name": "μ-test"}
    extra = {"elbo": [np.float64(-1.5), np.float32(-1.25), -1.0], "count": np.int64(3),
             "hist": np.arange(3)}
    store = CheckpointStore(tmp_path / "ck")
    saved = store.save(engine, state, offsets(7), config=config, extra=extra)
    before = datetime.now(timezone.utc)

    for snap in (store.latest(), load_snapshot(tmp_path / "ck"), load_snapshot(saved.path)):
        assert snap.number == saved.number == 1 and snap.path == saved.path
        assert_same_state(snap.state, state)
        assert snap.offsets == offsets(7)
        assert snap.config == config
        assert snap.extra == {"elbo": [-1.5, -1.25, -1.0], "count": 3, "hist": [0, 1, 2]}
        assert snap.version == __version__
        assert snap.created == saved.created and snap.created.tzinfo is not None
        assert abs((before - snap.created).total_seconds()) < 60
        assert snap.engine.to_dict() == engine.to_dict()
        assert snap.step == 7 and snap.records_seen == state.records_seen
        assert check_compatible(snap, engine) == []
        # Resuming continues the very same random stream and λ trajectory.
        xb = X[:20]
        a, _ = engine.update(state, xb)
        b, _ = snap.engine.update(snap.state, xb)
        assert_same_state(a, b)

    meta = json.loads((saved.path / "snapshot.json").read_text())
    assert meta["format"] == ckpt.FORMAT and meta["number"] == 1
    assert meta["format_version"] == ckpt.FORMAT_VERSION == 2
    assert meta["library_version"] == __version__
    assert meta["model"] == {"name": "gmm", "params": BayesianGMM(3, 2).get_params()}
    assert meta["engine"] == engine.to_dict()
    assert meta["step"] == 7 and meta["records_seen"] == state.records_seen
    assert datetime.fromisoformat(meta["created"]).timestamp() == pytest.approx(meta["created_unix"])
    assert meta["state_file"]["size"] == (saved.path / "state.npz").stat().st_size
    assert meta["checksum"]["value"] == ckpt._json_checksum(meta)
    assert sorted(p.name for p in saved.path.iterdir()) == ["snapshot.json", "state.npz"]
    with np.load(saved.path / "state.npz", allow_pickle=False) as z:
        assert "meta.json" in z.files and "lam/alpha" in z.files


def test_latest_points_at_the_newest_and_is_followed(tmp_path, run):
    store = filled_store(tmp_path, run, steps=(1, 2, 3, 4))
    assert (tmp_path / "latest").read_text().strip() == "snap-00000004"
    assert store.latest().number == 4 and store.latest().step == 4
    assert store.list() == [2, 3, 4]
    # The pointer, not the highest number, decides (a newer dir may be unpublished).
    (tmp_path / "latest").write_text("snap-00000003\n")
    assert store.latest().number == 3


@pytest.mark.parametrize("keep", [1, 2, 3, 5])
def test_retention_keeps_exactly_k(tmp_path, run, keep):
    store = filled_store(tmp_path, run, steps=range(1, 9), keep=keep)
    assert store.list() == list(range(9 - keep, 9))
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("snap-")) == \
        [f"snap-{n:08d}" for n in range(9 - keep, 9)]
    assert store.latest().number == 8
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((".tmp-", ".del-"))]


@pytest.mark.parametrize("keep", [0, -1, 1.5, True, "3"])
def test_keep_must_be_a_positive_integer(tmp_path, keep):
    with pytest.raises(ValueError, match="keep must be an integer >= 1"):
        CheckpointStore(tmp_path, keep=keep)


def test_bad_save_arguments_write_nothing(tmp_path, run):
    engine, X, states = run
    store = CheckpointStore(tmp_path)
    with pytest.raises(TypeError, match="config must be JSON-serialisable"):
        store.save(engine, states[1], offsets(1), config={"x": object()})
    with pytest.raises(TypeError, match="config must be a dict"):
        store.save(engine, states[1], offsets(1), config=[1, 2])
    with pytest.raises(ValueError, match="offsets must be given"):
        store.save(engine, states[1], None)
    other = SVI(BayesianGMM(4, 2), n_total=100)
    with pytest.raises(ValueError, match="state does not belong to this engine's model"):
        store.save(other, states[1], offsets(1))
    assert store.list() == [] and store.latest() is None
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock"]


# ------------------------------------------------------------- corruption
def _truncate(p):
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])


def _flip(p):
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x40
    p.write_bytes(bytes(data))


def _edit_json(p):
    meta = json.loads(p.read_text())
    meta["offsets"][0]["offset"] += 1000    # valid JSON, wrong content
    p.write_text(json.dumps(meta))


CORRUPTIONS = {
    "truncated state.npz": (lambda d: _truncate(d / "state.npz"), "state.npz checksum mismatch"),
    "flipped byte in state.npz": (lambda d: _flip(d / "state.npz"), "state.npz checksum mismatch"),
    "state.npz of another snapshot": (
        lambda d: shutil.copyfile(d.parent / "snap-00000002" / "state.npz", d / "state.npz"),
        "state.npz checksum mismatch"),
    "missing state.npz": (lambda d: (d / "state.npz").unlink(), "state.npz is missing"),
    "truncated snapshot.json": (lambda d: _truncate(d / "snapshot.json"), "snapshot.json is not valid JSON"),
    "empty snapshot.json": (lambda d: (d / "snapshot.json").write_bytes(b""), "snapshot.json is empty"),
    "edited snapshot.json": (lambda d: _edit_json(d / "snapshot.json"), "snapshot.json checksum mismatch"),
    "missing snapshot.json": (lambda d: (d / "snapshot.json").unlink(), "snapshot.json is missing"),
    "forged step (checksum recomputed)": (lambda d: rewrite_meta(d, step=99),
                                          r"field 'step' \(99\) does not match state.npz"),
}


@pytest.mark.parametrize("corrupt,message", CORRUPTIONS.values(), ids=CORRUPTIONS.keys())
def test_corrupt_newest_snapshot_falls_back_to_the_previous(tmp_path, run, caplog, corrupt, message):
    _, _, states = run
    store = filled_store(tmp_path, run)
    newest = tmp_path / "snap-00000003"
    corrupt(newest)

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        snap = store.latest()
    assert snap.number == 2
    assert_same_state(snap.state, states[2])
    assert snap.offsets == offsets(2)
    warnings = [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "snap-00000003" in warnings[0] and "using snap-00000002" in warnings[0]
    assert re.search(message, warnings[0])

    with pytest.raises(CorruptSnapshotError, match=message) as err:
        load_snapshot(newest)
    assert str(newest) in str(err.value)
    assert load_snapshot(tmp_path).number == 2
    # The store keeps working: the next save is number 4 and becomes the latest.
    engine = run[0]
    assert store.save(engine, states[4], offsets(4)).number == 4
    assert store.latest().number == 4


def test_every_snapshot_corrupt(tmp_path, run, caplog):
    store = filled_store(tmp_path, run, steps=(1, 2))
    for n in (1, 2):
        _truncate(tmp_path / f"snap-{n:08d}" / "state.npz")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert store.latest() is None
    assert sum("no valid snapshot left" in r.getMessage() for r in caplog.records) == 2
    with pytest.raises(CorruptSnapshotError, match=r"has no valid snapshot: snap-00000002: .*snap-00000001"):
        load_snapshot(tmp_path)


def test_resume_quarantines_corrupt_snapshots_and_retention_never_deletes_them(tmp_path, run, caplog):
    """Issue 16.3: a corrupt snapshot is moved aside whole, not deleted by the next saves' retention."""
    engine, _, states = run
    store = filled_store(tmp_path, run, keep=2)           # snapshots 2 and 3 are kept
    _flip(tmp_path / "snap-00000003" / "state.npz")
    original = (tmp_path / "snap-00000003" / "state.npz").read_bytes()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        snap = store.resume()
    assert snap.number == 2
    [moved] = store.quarantined()
    assert moved.parent == tmp_path / "quarantine" and moved.name.startswith("snap-00000003-")
    assert (moved / "state.npz").read_bytes() == original   # whole, as it was
    assert any("moved unusable snap-00000003" in r.getMessage() for r in caplog.records)
    assert store.list() == [2]
    for step in (4, 5, 6, 7):                             # retention runs after every save
        store.save(engine, states[step], offsets(step))
    assert store.list() == [6, 7] and store.latest().number == 7
    assert store.quarantined() == [moved] and (moved / "state.npz").read_bytes() == original
    # latest() and load_snapshot() never move anything: only the writer's resume() does
    _flip(tmp_path / "snap-00000007" / "state.npz")
    assert store.latest().number == 6 and load_snapshot(tmp_path).number == 6
    assert store.list() == [6, 7]


def test_traces_of_an_earlier_run(tmp_path, run):
    store = CheckpointStore(tmp_path / "ck")
    assert store.traces() == []                            # never held a snapshot
    store = filled_store(tmp_path / "ck", run, steps=(1, 2))
    for n in (1, 2):
        _truncate(tmp_path / "ck" / f"snap-{n:08d}" / "state.npz")
    assert store.resume() is None
    traces = " | ".join(store.traces())
    assert "'latest' pointer naming 'snap-00000002'" in traces
    assert "2 quarantined snapshot(s)" in traces
    shutil.rmtree(tmp_path / "ck" / "quarantine")
    (tmp_path / "ck" / "latest").unlink()
    assert store.traces() == []
    (tmp_path / "ck" / "history.jsonl").write_text("{}\n")
    assert store.traces() == ["a metric history (history.jsonl) of an earlier run"]


def test_empty_or_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="no snapshot at"):
        load_snapshot(tmp_path / "nope")
    store = CheckpointStore(tmp_path / "new" / "ck")
    assert store.latest() is None and store.list() == []
    with pytest.raises(FileNotFoundError, match="holds no snapshot yet"):
        load_snapshot(tmp_path / "new" / "ck")


def test_pointer_to_a_missing_directory_falls_back(tmp_path, run, caplog):
    store = filled_store(tmp_path, run)
    shutil.rmtree(tmp_path / "snap-00000003")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert store.latest().number == 2
    assert any("snap-00000003" in r.getMessage() and "directory is missing" in r.getMessage()
               for r in caplog.records)


def test_damaged_pointer_falls_back_to_the_newest_numbered(tmp_path, run, caplog):
    store = filled_store(tmp_path, run)
    (tmp_path / "latest").write_text("garbage\x00")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert store.latest().number == 3
    assert any("'latest' pointer contains" in r.getMessage() for r in caplog.records)
    (tmp_path / "latest").unlink()
    assert store.latest().number == 3


def test_leftover_temporary_directories_are_ignored_and_cleaned(tmp_path, run):
    engine, _, states = run
    store = filled_store(tmp_path, run, steps=(1, 2))
    # A crash in the middle of writing snapshot 3, and one in the middle of deleting snapshot 1.
    tmp = tmp_path / ".tmp-snap-00000003-4242-deadbeef"
    tmp.mkdir()
    (tmp / "state.npz").write_bytes(b"PK\x03\x04 half a zip")
    dele = tmp_path / ".del-snap-00000000-cafe"
    dele.mkdir()
    (dele / "snapshot.json").write_text("{")
    (tmp_path / "latest.tmp").write_text("snap-0000")

    assert store.latest().number == 2 and store.list() == [1, 2]
    assert load_snapshot(tmp_path).number == 2
    CheckpointStore(tmp_path)          # opening cleans up
    assert not tmp.exists() and not dele.exists() and not (tmp_path / "latest.tmp").exists()
    assert store.save(engine, states[3], offsets(3)).number == 3
    assert store.latest().number == 3


def test_pickled_objects_are_refused_and_never_run(tmp_path, run):
    engine, _, states = run
    filled_store(tmp_path, run, steps=(1,))
    snapdir = tmp_path / "snap-00000001"
    arrays = state_to_arrays(engine, states[1])
    arrays["lam/evil"] = np.array([_Payload()], dtype=object)
    with open(snapdir / "state.npz", "wb") as f:
        np.savez(f, **arrays)                  # pickles the object array
    with open(snapdir / "state.npz", "rb") as f:
        digest, size = ckpt._sha256_of_file(f)
    rewrite_meta(snapdir, state_file={"name": "state.npz", "sha256": digest, "size": size})
    with pytest.raises(CorruptSnapshotError, match=r"state.npz cannot be read .*(allow_pickle|dtype object)"):
        load_snapshot(snapdir)
    assert _EXECUTED == []


_EXECUTED = []


def _mark():
    _EXECUTED.append(True)


class _Payload:
    def __reduce__(self):
        return (_mark, ())


def test_newer_format_is_refused_not_skipped(tmp_path, run):
    store = filled_store(tmp_path, run, steps=(1, 2))
    rewrite_meta(tmp_path / "snap-00000002", format="streamsvi.checkpoint/2", library_version="9.0")
    with pytest.raises(IncompatibleSnapshotError, match=r"format 'streamsvi.checkpoint/2'.*Upgrade streamsvi"):
        store.latest()


# ------------------------------------------------------------ format version
def _drop_format_version(snapdir):
    """What a snapshot written before the field existed (streamsvi 0.1.0) looks like."""
    meta = json.loads((snapdir / "snapshot.json").read_text())
    del meta["format_version"]
    meta["library_version"] = "0.1.0"
    meta["checksum"]["value"] = ckpt._json_checksum(meta)
    (snapdir / "snapshot.json").write_text(json.dumps(meta))


def test_a_snapshot_without_a_format_version_is_version_1_and_loads(tmp_path, run):
    engine, X, states = run
    store = filled_store(tmp_path, run, steps=(1, 2))
    _drop_format_version(tmp_path / "snap-00000002")
    snap = store.latest()
    assert snap.number == 2 and "format_version" not in snap.meta and snap.version == "0.1.0"
    assert_same_state(snap.state, states[2])


def test_a_newer_format_version_is_refused_naming_both(tmp_path, run):
    store = filled_store(tmp_path, run, steps=(1, 2))
    rewrite_meta(tmp_path / "snap-00000002", format_version=ckpt.FORMAT_VERSION + 1, library_version="9.0")
    want = (rf"snapshot {tmp_path / 'snap-00000002'} has format version {ckpt.FORMAT_VERSION + 1} "
            rf"\(written by streamsvi 9\.0\), newer than this streamsvi {__version__} reads format versions "
            rf"1 to {ckpt.FORMAT_VERSION}\. Upgrade streamsvi to at least the version that wrote it, or "
            rf"start from an empty checkpoint directory\.")
    with pytest.raises(IncompatibleSnapshotError, match=want):
        store.latest()                      # refused, not skipped for snap-00000001
    with pytest.raises(IncompatibleSnapshotError, match=want):
        load_snapshot(tmp_path / "snap-00000002")


def test_a_format_version_too_old_is_refused_naming_both(tmp_path, run, monkeypatch):
    store = filled_store(tmp_path, run, steps=(1,))
    rewrite_meta(tmp_path / "snap-00000001", format_version=0, library_version="0.0.1")
    with pytest.raises(IncompatibleSnapshotError,
                       match=rf"format version 0 \(written by streamsvi 0\.0\.1\), older than this "
                             rf"streamsvi {__version__} reads format versions 1 to {ckpt.FORMAT_VERSION}\. "
                             rf"Resume or score it with the streamsvi that wrote it"):
        store.latest()
    # the day version 1 is no longer read: a snapshot without the field is refused the same way
    store = filled_store(tmp_path / "b", run, steps=(1,))
    _drop_format_version(tmp_path / "b" / "snap-00000001")
    monkeypatch.setattr(ckpt, "OLDEST_FORMAT_VERSION", 2)
    with pytest.raises(IncompatibleSnapshotError, match=r"format version 1 \(written by streamsvi 0\.1\.0\), "
                                                        r"older than .* reads format versions 2 to"):
        store.latest()


def test_a_format_version_that_is_not_an_integer_is_corrupt(tmp_path, run):
    store = filled_store(tmp_path, run, steps=(1, 2))
    rewrite_meta(tmp_path / "snap-00000002", format_version="2")
    assert store.latest().number == 1       # skipped as damaged, the older one is used


def test_the_command_line_refuses_a_newer_format_in_one_line(tmp_path, run):
    import subprocess
    import sys

    filled_store(tmp_path, run, steps=(1,))
    rewrite_meta(tmp_path / "snap-00000001", format_version=ckpt.FORMAT_VERSION + 1, library_version="9.0")
    proc = subprocess.run([sys.executable, "-m", "streamsvi", "inspect", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    err = proc.stderr
    assert proc.returncode == 2
    assert err.startswith("streamsvi: error: snapshot ") and err.count("\n") == 1, err
    assert f"format version {ckpt.FORMAT_VERSION + 1} (written by streamsvi 9.0)" in err
    assert f"this streamsvi {__version__} reads format versions 1 to {ckpt.FORMAT_VERSION}" in err


# ---------------------------------------------------------- compatibility
def test_incompatible_model_settings_are_refused(tmp_path, run):
    store = filled_store(tmp_path, run, steps=(1,))
    snap = store.latest()
    with pytest.raises(IncompatibleSnapshotError,
                       match="model setting n_components: snapshot has 3, config has 2") as err:
        check_compatible(snap, SVI(BayesianGMM(2, 2), n_total=100))
    assert "new (empty) checkpoint directory" in str(err.value)
    with pytest.raises(IncompatibleSnapshotError) as err:
        check_compatible(snap, SVI(BayesianGMM(3, 2, weight_concentration=0.5, mean_precision=2.0),
                                   n_total=100))
    assert "model setting weight_concentration: snapshot has 1.0, config has 0.5" in str(err.value)
    assert "model setting mean_precision" in str(err.value)
    assert "n_components" not in str(err.value)
    with pytest.raises(IncompatibleSnapshotError, match="model: snapshot has 'gmm', config has 'gauss1d'"):
        check_compatible(snap, SVI(KnownVarianceGMM1D(3), n_total=100))


def test_a_start_only_setting_does_not_block_a_resume(tmp_path, run):
    """``init`` only shapes the initial λ: a snapshot of the old default resumes under the new one."""
    engine, _, states = run
    store = CheckpointStore(tmp_path, keep=2)
    old = SVI(BayesianGMM(3, 2, init="random_from_data"), n_total=100, effective_batch_size=10)
    store.save(old, states[3], offsets(3))
    notes = check_compatible(store.latest(), SVI(BayesianGMM(3, 2, init="kmeans"), n_total=100,
                                                 effective_batch_size=10))
    assert notes == ["model setting init: snapshot has 'random_from_data', config has 'kmeans' "
                     "(it only shapes the initial λ; the snapshot's λ is resumed)"]
    # ... while a setting that changes the model is still refused, and init is not blamed for it
    with pytest.raises(IncompatibleSnapshotError) as err:
        check_compatible(store.latest(), SVI(BayesianGMM(3, 2, init="kmeans", mean_precision=2.0),
                                             n_total=100))
    assert "mean_precision" in str(err.value) and "init" not in str(err.value)


def test_engine_settings_may_be_retuned(tmp_path, run):
    store = filled_store(tmp_path, run, steps=(1,))
    snap = store.latest()
    retuned = SVI(BayesianGMM(3, 2), n_total=500, schedule=RobbinsMonro(kappa=0.9))
    assert check_compatible(snap, retuned) == [
        "engine setting effective_batch_size: snapshot has 10, config has None",
        "engine setting n_total: snapshot has 100.0, config has 500.0",
        "engine setting schedule.kappa: snapshot has 0.7, config has 0.9",
    ]


# ------------------------------------------------------------ crash safety
class SimulatedCrash(OSError):
    pass


def _crash_at(monkeypatch, n):
    """Make the n-th call of os.rename / os.replace / os.fsync fail, and nothing get cleaned up."""
    calls = []
    real = {name: getattr(os, name) for name in ("rename", "replace", "fsync")}

    def wrap(name):
        def f(*args, **kwargs):
            calls.append(name)
            if len(calls) == n:
                raise SimulatedCrash(errno.EIO, f"simulated crash at call {n} (os.{name})")
            return real[name](*args, **kwargs)
        return f

    for name in real:
        monkeypatch.setattr(os, name, wrap(name))
    monkeypatch.setattr(shutil, "rmtree", lambda *a, **k: None)   # a dead process cleans nothing
    return calls


def test_a_crash_at_any_step_of_save_leaves_a_valid_snapshot(tmp_path, run, monkeypatch):
    engine, _, states = run
    seen_steps = []
    n = 0
    while True:
        n += 1
        d = tmp_path / f"crash-{n}"
        store = filled_store(d, run, steps=(1, 2, 3), keep=1)
        with monkeypatch.context() as m:
            calls = _crash_at(m, n)
            try:
                store.save(engine, states[4], offsets(4))
                crashed = False
            except SimulatedCrash:
                crashed = True
        seen_steps.append(calls[n - 1] if len(calls) >= n else "done")

        reopened = CheckpointStore(d, keep=1)
        assert not [p for p in d.iterdir() if p.name.startswith((".tmp-", ".del-"))]
        snap = reopened.latest()
        assert snap is not None, f"crash at call {n}: no valid snapshot"
        assert snap.step in (3, 4), f"crash at call {n}: step {snap.step}"
        if not crashed:
            assert snap.step == 4, "save returned, so the new snapshot must be the latest"
        assert_same_state(snap.state, states[snap.step])
        assert snap.offsets == offsets(snap.step)
        assert load_snapshot(d).number == snap.number
        # ... and the daemon can carry on from there.
        nxt = reopened.save(engine, states[5], offsets(5))
        assert nxt.number > snap.number and reopened.latest().number == nxt.number
        assert reopened.list() == [nxt.number]
        if len(calls) < n:
            break
    # fsync×3 + rename (write), fsync dir, fsync + replace + fsync dir (publish), rename (retention)
    assert seen_steps == ["fsync", "fsync", "fsync", "rename", "fsync", "fsync", "replace", "fsync",
                          "rename", "done"]


def test_a_failed_delete_of_an_old_snapshot_does_not_fail_the_save(tmp_path, run, monkeypatch, caplog):
    engine, _, states = run
    store = filled_store(tmp_path, run, steps=(1,), keep=1)

    def no_rename(src, dst):
        raise PermissionError(errno.EACCES, "read-only", str(src))

    monkeypatch.setattr(os, "rename", lambda s, d: (no_rename(s, d) if "snap-00000001" in str(s)
                                                     else os.replace(s, d)))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        snap = store.save(engine, states[2], offsets(2))
    assert snap.number == 2 and store.latest().number == 2
    assert any("could not delete old snapshot snap-00000001" in r.getMessage() for r in caplog.records)
    monkeypatch.undo()
    store.save(engine, states[3], offsets(3))        # retried at the next save
    assert store.list() == [3]


# -------------------------------------------------------------- concurrency
def test_concurrent_readers_never_see_a_partial_or_mismatched_snapshot(tmp_path, run, caplog):
    engine, _, states = run
    store = CheckpointStore(tmp_path, keep=1)        # keep=1: every save deletes what readers may be reading
    store.save(engine, states[0], offsets(0), extra={"step": 0})
    stop = threading.Event()
    seen = {"latest": [], "load_snapshot": []}
    errors = []

    def reader(kind):
        try:
            while True:
                last = stop.is_set()         # one more read after the writer has finished
                snap = store.latest() if kind == "latest" else load_snapshot(tmp_path)
                assert snap is not None
                s = snap.step
                assert snap.number == s + 1
                assert_same_state(snap.state, states[s])
                assert snap.offsets == offsets(s) and snap.extra == {"step": s}
                seen[kind].append(snap.number)
                if last:
                    break
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        threads = [threading.Thread(target=reader, args=(k,)) for k in seen]
        for t in threads:
            t.start()
        for s in range(1, 31):
            store.save(engine, states[s], offsets(s), extra={"step": s})
            time.sleep(0.001)
        stop.set()
        for t in threads:
            t.join(10)
    assert not errors, errors[0]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    for kind, numbers in seen.items():
        assert numbers == sorted(numbers), f"{kind} went backwards"
        assert len(set(numbers)) >= 2, f"{kind} never overlapped the writer: {numbers}"
        assert numbers[-1] == 31
    assert store.list() == [31]


# ------------------------------------------------------------------ promotion
def test_retention_never_deletes_the_promoted_snapshot(tmp_path, run):
    engine, _, states = run
    store = CheckpointStore(tmp_path, keep=1)
    store.save(engine, states[1], offsets(1))
    store.write_promotion({"promoted": 1, "promoted_figure": -2.5, "pending": None, "decisions": []},
                          promote=1)
    for step in (2, 3, 4):
        store.save(engine, states[step], offsets(step))
    assert store.list() == [1, 4]                       # the newest, and the promoted one
    assert ckpt.pointer_number(tmp_path, ckpt.PROMOTED) == 1
    assert load_snapshot(tmp_path, follow="promoted").number == 1
    assert load_snapshot(tmp_path).number == 4          # latest stays what it is
    store.write_promotion({**ckpt.read_promotion(tmp_path), "promoted": 4}, promote=4)
    store.save(engine, states[5], offsets(5))
    assert store.list() == [4, 5]                       # 1 is no longer promoted: deleted


def test_promotion_record_is_checksummed_and_a_damaged_one_is_ignored(tmp_path, run, caplog):
    engine, _, states = run
    store = CheckpointStore(tmp_path, keep=2)
    store.save(engine, states[1], offsets(1))
    decisions = [{"candidate": n, "outcome": "rejected", "reason": "r"} for n in range(60)]
    store.write_promotion({"promoted": 1, "promoted_figure": 1.5, "pending": None,
                           "decisions": decisions}, promote=1)
    rec = ckpt.read_promotion(tmp_path)
    assert rec["promoted"] == 1 and len(rec["decisions"]) == ckpt.PROMOTION_DECISIONS_KEPT
    assert rec["decisions"][-1]["candidate"] == 59
    with pytest.raises(ValueError, match="cannot promote snapshot 7"):
        store.write_promotion(rec, promote=7)
    assert ckpt.pointer_number(tmp_path, ckpt.PROMOTED) == 1
    path = tmp_path / ckpt.PROMOTION_FILE
    for damage in (lambda t: t.replace('"promoted": 1', '"promoted": 2'), lambda t: t[:20], lambda t: "[]",
                   lambda t: json.dumps({**json.loads(t), "promoted": "x"})):
        path.write_text(damage(rec_text := path.read_text()))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            assert ckpt.read_promotion(tmp_path) is None
        assert "decision record" in caplog.text
        path.write_text(rec_text)
    assert ckpt.read_promotion(tmp_path) == rec
    (tmp_path / "promoted.tmp").write_text("snap-")         # a crash mid-write: removed at open
    CheckpointStore(tmp_path)
    assert not (tmp_path / "promoted.tmp").exists()


def test_load_follow_falls_back_to_latest(tmp_path, run, caplog):
    engine, _, states = run
    store = CheckpointStore(tmp_path, keep=3)
    for step in (1, 2):
        store.save(engine, states[step], offsets(step))
    assert load_snapshot(tmp_path, follow="promoted").number == 2          # no pointer: latest
    (tmp_path / ckpt.PROMOTED).write_bytes(b"\xff\xfe")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert load_snapshot(tmp_path, follow="promoted").number == 2
    assert "'promoted' pointer is not UTF-8" in caplog.text
    store.write_promotion({"promoted": 1, "decisions": []}, promote=1)
    shutil.rmtree(tmp_path / "snap-00000001")
    assert load_snapshot(tmp_path, follow="promoted").number == 2
    with pytest.raises(ValueError, match="follow must be"):
        load_snapshot(tmp_path, follow="best")
