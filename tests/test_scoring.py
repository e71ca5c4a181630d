"""Scoring from snapshots: load, the watcher under concurrent writes, score/inspect CLI."""
import json
import threading

import numpy as np
import pytest

import streamsvi
from streamsvi.checkpoint import CheckpointStore, CorruptSnapshotError
from streamsvi.cli import main
from streamsvi.datasets import make_blobs
from streamsvi.inference import SVI, EngineState
from streamsvi.models import BayesianGMM, NatParams
from tests.conftest import mc_predictive_density


def _engine_state(seed=0, steps=20):
    X, _ = make_blobs(400, seed=seed)
    engine = SVI(BayesianGMM(3, 2, weight_concentration=1.0, mean_precision=0.5), n_total=60.0,
                 effective_batch_size=10)
    state, _ = engine.fit(engine.init(X, seed=seed), X, n_steps=steps, batch_size=40)
    return engine, state, X


def test_load_returns_model_settings_and_scoring(tmp_path):
    engine, state, X = _engine_state()
    offsets = [{"source": "t", "partition": 0, "offset": 800}]
    CheckpointStore(tmp_path).save(engine, state, offsets, extra={"elbo_history": [[1, -3.0], [20, -2.5]]})
    f = streamsvi.load(tmp_path)
    assert f.step == 20 and f.records_seen == 800 and f.offsets == offsets
    assert f.settings["name"] == "gmm" and f.settings["n_components"] == 3
    assert f.created.tzinfo is not None
    assert f.lam.array_equal(state.lam)
    np.testing.assert_array_equal(f.predict(X[:10]), engine.model.predict(state.lam, X[:10]))
    np.testing.assert_allclose(f.predictive_logpdf(X[:10]), engine.model.predictive_logpdf(state.lam, X[:10]))
    assert f.responsibilities(X[:4]).shape == (4, 3)


def test_fitted_model_offers_exactly_the_models_scoring_methods_with_lambda_bound(tmp_path):
    engine, state, X = _engine_state()
    CheckpointStore(tmp_path).save(engine, state, [])
    f = streamsvi.load(tmp_path)
    assert set(f.scoring_methods) == {"responsibilities", "predict", "predictive_logpdf"}

    class Scorer(BayesianGMM):
        scoring_methods = ("predict", "mean_of")

        def mean_of(self, lam, x, shift=0.0):
            return float(np.asarray(x).mean() + lam.sqnorm() + shift)

    g = streamsvi.scoring.FittedModel(**{**f.__dict__, "model": Scorer(3, 2)})
    assert g.mean_of(X[:5], shift=1.0) == float(X[:5].mean() + state.lam.sqnorm() + 1.0)
    with pytest.raises(AttributeError, match="scoring methods are"):
        g.fit_transform
    with pytest.raises(AttributeError):
        f.check_batch        # a model method, but not a scoring method


def test_predictive_density_of_a_snapshot_matches_monte_carlo(tmp_path):
    """log p(x*|data) from the snapshot vs E_q[Σ π_k N(x*|μ_k, Λ_k⁻¹)] by 20,000 draws; 5 SE or 3%."""
    engine, state, _ = _engine_state(seed=2, steps=10)
    CheckpointStore(tmp_path).save(engine, state, [])
    f = streamsvi.load(tmp_path)
    x = np.array([[0.0, 0.0], [-4.0, -3.0], [1.5, 1.0]])
    mc, se = mc_predictive_density(f.model, f.lam, x, 20000, np.random.default_rng(0))
    exact = np.exp(f.predictive_logpdf(x))
    assert np.all(np.abs(mc - exact) < np.maximum(5 * se, 0.03 * exact)), (mc, exact, se)


def test_corrupted_snapshot_is_refused(tmp_path):
    engine, state, _ = _engine_state()
    snap = CheckpointStore(tmp_path, keep=1).save(engine, state, [])
    data = bytearray((snap.path / "state.npz").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (snap.path / "state.npz").write_bytes(bytes(data))
    with pytest.raises(CorruptSnapshotError, match="checksum|sha256|state.npz"):
        streamsvi.load(snap.path)
    with pytest.raises(CorruptSnapshotError):
        streamsvi.load(tmp_path)                  # nothing valid to fall back to
    assert main(["inspect", str(snap.path)]) == 2


def _marked_state(engine, i):
    """A state whose λ encodes its own step, so a mismatched read is detectable."""
    lam = engine.model.prior()
    lam = NatParams({k: (v + i if k in ("alpha", "nu") else v) for k, v in lam.items()})
    return EngineState(step=i, lam=lam, rng_state=engine.state_from_params(lam).rng_state,
                       records_seen=10 * i)


def test_load_while_writing_never_sees_a_partial_or_mismatched_snapshot(tmp_path):
    engine, _, _ = _engine_state(steps=1)
    store = CheckpointStore(tmp_path, keep=2)
    store.save(engine, _marked_state(engine, 1), [{"source": "t", "partition": 0, "offset": 1}])
    watcher = streamsvi.SnapshotWatcher(tmp_path, poll_seconds=0.005).start()
    errors, seen, done = [], set(), threading.Event()

    def reader(use_watcher):
        while not done.is_set():
            try:
                f = watcher.current() if use_watcher else streamsvi.load(tmp_path)
                i = f.step
                ok = (f.records_seen == 10 * i and np.all(f.lam["alpha"] == engine.model.prior()["alpha"] + i)
                      and f.offsets[0]["offset"] == i)
                if not ok:
                    errors.append(f"mismatch at step {i}")
                seen.add(i)
            except Exception as exc:  # noqa: BLE001 - any failure is a test failure
                errors.append(repr(exc))

    threads = [threading.Thread(target=reader, args=(w,)) for w in (False, False, True)]
    for t in threads:
        t.start()
    for i in range(2, 60):
        store.save(engine, _marked_state(engine, i), [{"source": "t", "partition": 0, "offset": i}])
    done.set()
    for t in threads:
        t.join()
    watcher.refresh()
    watcher.stop()
    assert not errors, errors[:5]
    assert len(seen) > 5                      # readers really ran during the writes
    assert watcher.current().step == 59 and watcher.swaps >= 1


def test_watcher_swaps_and_keeps_the_old_model_on_a_bad_new_one(tmp_path):
    engine, state, _ = _engine_state()
    store = CheckpointStore(tmp_path, keep=3)
    store.save(engine, state, [])
    swapped = []
    w = streamsvi.SnapshotWatcher(tmp_path, on_swap=swapped.append)
    assert not w.refresh()
    state2, _ = engine.update(state, make_blobs(40, seed=9)[0])
    snap2 = store.save(engine, state2, [])
    assert w.refresh() and w.current().step == state2.step and swapped[0].number == snap2.number
    # a corrupt newest snapshot: the store falls back, the watcher keeps serving a valid model
    state3, _ = engine.update(state2, make_blobs(40, seed=10)[0])
    snap3 = store.save(engine, state3, [])
    (snap3.path / "snapshot.json").write_text("{")
    w.refresh()
    assert w.current().step == state2.step


def test_score_cli_scores_good_lines_and_names_bad_ones(tmp_path, capsys):
    engine, state, X = _engine_state()
    CheckpointStore(tmp_path / "ck").save(engine, state, [])
    lines = [json.dumps(X[0].tolist()), "[1, 2, 3]", "not json", json.dumps({"x": X[1].tolist()}),
             "[0.0, NaN]", json.dumps(X[2].tolist())]
    inp = tmp_path / "in.jsonl"
    inp.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    assert main(["score", "--snapshot", str(tmp_path / "ck"), "--input", str(inp), "--output", str(out)]) == 1
    recs = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert [r["line"] for r in recs] == [1, 2, 3, 4, 5, 6]
    assert "wrong_shape" in recs[1]["error"] and "json_invalid" in recs[2]["error"]
    assert recs[4]["reason"] == "non_finite" and recs[4]["error"].startswith("non_finite: value in column 1")
    good = [recs[i] for i in (0, 3, 5)]
    f = streamsvi.load(tmp_path / "ck")
    np.testing.assert_allclose([r["log_density"] for r in good], f.predictive_logpdf(X[:3]))
    assert [r["assignment"] for r in good] == f.predict(X[:3]).tolist()
    # CSV in, header skipped
    csv = tmp_path / "in.csv"
    csv.write_text("a,b\n" + "\n".join(f"{a},{b}" for a, b in X[:5]) + "\nx,y\n")
    assert main(["score", "--snapshot", str(tmp_path / "ck"), "--input", str(csv), "--header",
                 "--output", str(out)]) == 1
    recs = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert len(recs) == 6 and "error" in recs[-1] and recs[-1]["line"] == 7


def _score(tmp_path, lines, *extra, name="in.jsonl"):
    """``streamsvi score`` on ``lines``: (exit status, output records)."""
    inp, out = tmp_path / name, tmp_path / "out.jsonl"
    inp.write_text("".join(ln + "\n" for ln in lines))
    code = main(["score", "--snapshot", str(tmp_path / "ck"), "--input", str(inp), "--output", str(out),
                 *extra])
    return code, [json.loads(ln) for ln in out.read_text().splitlines()] if out.exists() else None


def test_score_exit_codes(tmp_path, capsys):
    """Issue 16: `score` exited 0 when every line failed. 0 all scored, 1 some failed, 3 all failed,
    2 usage / set-up errors (a message, no traceback)."""
    engine, state, X = _engine_state()
    CheckpointStore(tmp_path / "ck").save(engine, state, [])
    good = [json.dumps(r) for r in X[:4].tolist()]
    assert _score(tmp_path, good)[0] == 0
    assert _score(tmp_path, [])[0] == 0                               # nothing to score, nothing failed
    assert _score(tmp_path, good[:2] + ["[1, 2, 3]"])[0] == 1
    code, recs = _score(tmp_path, ["[NaN, 1]", "[1, 2, 3]", "", "nope"])
    assert code == 3 and [r["reason"] for r in recs] == ["non_finite", "wrong_shape", "json_invalid"]
    assert _score(tmp_path, good, "--fields", "a", "b")[0] == 0       # arrays are read with --fields too
    assert _score(tmp_path, [json.dumps({"a": 1.0})], "--fields", "a", "b")[0] == 3   # missing_field
    capsys.readouterr()
    assert main(["score", "--snapshot", str(tmp_path / "nothing"), "--input", "-"]) == 2
    assert main(["score", "--snapshot", str(tmp_path / "ck"), "--input", str(tmp_path / "no.jsonl")]) == 2
    assert main(["score", "--snapshot", str(tmp_path / "ck"), "--input", str(tmp_path)]) == 2   # a directory
    err = capsys.readouterr().err
    assert "cannot read --input" in err and "Traceback" not in err
    assert _score(tmp_path, ["1,2"], "--fields", "a", "b", name="in.csv")[0] == 2
    with pytest.raises(SystemExit) as info:                           # argparse: usage error
        main(["score", "--snapshot", str(tmp_path / "ck"), "--input", "-", "--chunk", "0"])
    assert info.value.code == 2
    with pytest.raises(SystemExit):
        main(["score", "--help"])
    help_text = capsys.readouterr().out
    for code in ("0", "1", "2", "3", "141"):
        assert f"\n  {code} " in help_text, code


def test_score_errors_carry_the_line_number_and_the_daemons_reason(tmp_path):
    """Issue 16: NaN was reported as 'invalid' with an index within the chunk. Every error names
    its line (with chunks of 2, blank lines and a header in the way) and the reason the daemon's
    own source gives the same line (FileSource: the codec, then the validator)."""
    from streamsvi.io import FileSource, JsonCodec, RecordValidator

    engine, state, X = _engine_state()
    CheckpointStore(tmp_path / "ck").save(engine, state, [], config={"validation": {"max_abs": 100.0}})
    lines = [json.dumps(X[0].tolist()), "[NaN, 1.0]", "", json.dumps(X[1].tolist()), "[1.0, Infinity]",
             "[500.0, 0.0]", "[1e400, 0]", "[1, 2, 3]", "{not json", "[true, 1]", '{"y": [1, 2]}',
             json.dumps(X[2].tolist()), "[1" + "0" * 330 + ", 0]"]
    code, recs = _score(tmp_path, lines, "--chunk", "2")
    assert code == 1
    nonblank = [i + 1 for i, ln in enumerate(lines) if ln]
    assert [r["line"] for r in recs] == nonblank
    src = FileSource(tmp_path / "in.jsonl", codec=JsonCodec(2), validator=RecordValidator(2, max_abs=100.0))
    batch = src.poll_batch(100)
    daemon = {d.position.offset + 1: d.reason for d in batch.dead}
    ours = {r["line"]: r["reason"] for r in recs if "error" in r}
    assert ours == daemon
    assert set(ours.values()) == {"non_finite", "out_of_range", "wrong_shape", "json_invalid", "not_numeric",
                                  "missing_field"}
    assert ours[2] == "non_finite" and ours[6] == "out_of_range" and "max_abs=100.0" in recs[4]["error"]
    assert all(r["error"].startswith(r["reason"] + ": ") for r in recs if "error" in r)
    assert not any("records [" in r.get("error", "") for r in recs)
    f = streamsvi.load(tmp_path / "ck")
    scored = [r for r in recs if "error" not in r]
    np.testing.assert_allclose([r["log_density"] for r in scored], f.predictive_logpdf(X[:3]))


def test_score_stops_quietly_when_the_reader_goes_away(tmp_path):
    """Issue 16: `streamsvi score ... | head -1` ended in a BrokenPipeError traceback. The reader
    here closes the pipe after one line; the output (~2.6 MB) is far larger than a pipe buffer,
    so the scorer's next writes fail with EPIPE for sure."""
    import subprocess
    import sys

    engine, state, _ = _engine_state()
    CheckpointStore(tmp_path / "ck").save(engine, state, [])
    X = np.random.default_rng(1).normal(size=(20000, 2))
    (tmp_path / "big.jsonl").write_text("".join(json.dumps(r) + "\n" for r in X.tolist()))
    proc = subprocess.Popen([sys.executable, "-m", "streamsvi", "score", "--snapshot", str(tmp_path / "ck"),
                             "--input", str(tmp_path / "big.jsonl")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()                                  # what `head -1` does after its line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert json.loads(first)["line"] == 1
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err, err


def test_inspect_cli(tmp_path, capsys):
    engine, state, _ = _engine_state()
    CheckpointStore(tmp_path).save(engine, state, [{"source": "gmm", "partition": 2, "offset": 77}],
                                   extra={"elbo_history": [[1, -3.0], [20, -2.5]]})
    assert main(["inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "step 20, 800 records" in out and "gmm[2]=77" in out and "last -2.5000" in out
    assert "n_components=3" in out
    w = engine.model.weights(state.lam)                 # the components, heaviest first, with their spread
    k = int(np.argmax(w))
    mean, sd = engine.model.means(state.lam)[k], np.sqrt(np.diag(engine.model.covariances(state.lam)[k]))
    rows = [ln for ln in out.splitlines() if ln.startswith("  k") and " w=" in ln]
    assert len(rows) == len(w) and rows[0].startswith(f"  k{k} ")
    assert f"w={w[k]:.3f}" in rows[0] and f"mean [{mean[0]:.3g}, {mean[1]:.3g}]" in rows[0]
    assert f"sd [{sd[0]:.3g}, {sd[1]:.3g}]" in rows[0] and "|corr|" in rows[0]
