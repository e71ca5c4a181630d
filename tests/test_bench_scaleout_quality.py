"""bench/scaleout_quality.py's simulation of N workers (synthetic corpus, no download, seconds)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import scaleout_quality as bench  # noqa: E402  (bench/scaleout_quality.py)


@pytest.fixture(scope="module")
def case():
    engine, train, held, _ = bench.setting(tiny=True, n=1200, batch=100)
    return engine, bench.stream(train, 1200, seed=5), held


@pytest.mark.parametrize("workers", [1, 3])
def test_workers_that_commit_every_batch_are_the_single_process_bit_for_bit(case, workers):
    """One batch per transaction: every contribution is computed at the latest λ and stepped at
    once, whichever worker holds it, so the simulation must give the single process's λ."""
    engine, X, _ = case
    single = bench.run(engine, X, 100, 0, 1, seed=2)
    many = bench.run(engine, X, 100, workers, 1, seed=2)
    assert many.step == single.step == 12
    assert many.lam.array_equal(single.lam)


def test_transactions_of_several_batches_are_stale_and_change_lambda(case):
    """Four batches per transaction: later deltas are computed at an older λ (the staleness the
    bench measures), so λ differs from the single process's while counting every record."""
    engine, X, H = case
    single = bench.run(engine, X, 100, 0, 1, seed=2)
    stale = bench.run(engine, X, 100, 2, 4, seed=2)
    assert stale.records_seen == single.records_seen == 1200
    assert not stale.lam.array_equal(single.lam)
    assert abs(bench.heldout(engine, stale, H) - bench.heldout(engine, single, H)) < 1.0


def test_workers_on_partitions_each_end_with_a_partial_batch(case):
    """On partitions, each worker cuts its own records into batches: 1200 records on 4
    partitions, 3 workers (partitions {0, 3}, {1}, {2}: 600, 300, 300 records), |S| = 70:
    9 + 5 + 5 batches, each worker's last one partial; every record counted once."""
    engine, X, _ = case
    st = bench.run(engine, X, 70, 3, 1, seed=2, partitions=4)
    assert st.step == 9 + 5 + 5 and st.records_seen == 1200
