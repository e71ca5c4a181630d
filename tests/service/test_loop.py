"""One loop of named stages (``streamsvi.service.loop``): the daemon, the worker and the applier.

The base loop is checked with a toy configuration (no broker): the count limit, the
timeout, a stop request, what ends a run, ``_finish`` on an error, and the order in
which it calls a commit strategy's hooks (``streamsvi.service.commit``); each role
holds the strategy of its guarantee. The applier is
checked on the real broker: it stops on its timeout and on SIGTERM with the signal's
name, checkpoints on turns with an empty poll, and applies deltas through the loop.
Waits are on conditions, never on sleeps.
"""
import signal
import threading
import time
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry

from streamsvi.checkpoint import load_snapshot
from streamsvi.service.commit import CommitStrategy, PublishCommit, SnapshotCommit, TransactionCommit
from streamsvi.service.config import validate
from streamsvi.service.daemon import Daemon
from streamsvi.service.loop import StagedLoop, _Loop
from streamsvi.service.roles.applier import Applier
from streamsvi.service.roles.transport import init_delta
from streamsvi.service.roles.worker import Worker

from .conftest import gmm_config
from .test_scaleout import _applier_setup, _delta, _produce_deltas


def test_the_daemon_worker_and_applier_are_configurations_of_one_loop():
    for cls in (Daemon, Worker, Applier):
        assert issubclass(cls, StagedLoop), cls
        for name in ("_run", "_turns", "_stop_condition"):
            assert getattr(cls, name) is getattr(StagedLoop, name), (cls.__name__, name)
    assert Daemon.count_limit == Worker.count_limit == ("max_batches", "batches")
    assert Applier.count_limit == ("max_deltas", "deltas")
    assert not Daemon.finish_on_error and Applier.finish_on_error
    import streamsvi.service.daemon as daemon
    assert daemon._Loop is _Loop
    # the commit is plugged in, not inherited: no role fills in the commit stages itself
    for cls in (Daemon, Worker, Applier):
        for name in ("_advance", "_maybe_checkpoint"):
            assert getattr(cls, name) is getattr(StagedLoop, name), (cls.__name__, name)


def test_each_role_holds_the_commit_strategy_of_its_guarantee(tmp_path):
    """Snapshot then commit for one process, one transaction of deltas and offsets for a
    worker, λ publication and checkpoints for the applier: each an object bound to its role."""
    def cfg(scaleout=None):
        raw = gmm_config(tmp_path, bootstrap="127.0.0.1:9", topic="data", group="g-roles")
        if scaleout:
            raw["scaleout"] = scaleout
        return validate(raw)

    out = open("/dev/null", "w")
    scaleout = {"deltas_topic": "deltas", "worker_id": "w-roles", "lambda_file": str(tmp_path / "lam.npz")}
    daemon = Daemon(cfg(), registry=CollectorRegistry(), out=out)
    worker = Worker(cfg(scaleout), registry=CollectorRegistry(), out=out)
    applier = Applier(cfg(scaleout), registry=CollectorRegistry(), out=out)
    try:
        for role, kind in ((daemon, SnapshotCommit), (worker, TransactionCommit), (applier, PublishCommit)):
            assert type(role.commit) is kind and type(role).commit_strategy is kind, type(role).__name__
            assert role.commit.role is role
        assert worker.commit.producer is None and worker.commit.txn is None and worker.deltas_sent == 0
        worker.commit.deltas_sent = 3                  # the worker's count is its strategy's
        assert worker.deltas_sent == 3
    finally:
        worker._id_lock.close()
        out.close()


@dataclass
class _Res:
    batches: int = 0
    stopped_by: str = ""


@dataclass
class _Batch:
    x: list


class _Toy(StagedLoop):
    """Polls ``feed`` (a list of batches, None for an empty poll); records the stages run."""

    def __init__(self, feed, fail_at=None, stop_at=None):
        self._init_stop()
        self.feed, self.fail_at, self.stop_at = list(feed), fail_at, stop_at
        self.seen, self.stages, self.polls = [], [], 0

    def _start(self, stack, loop):
        stack.callback(self.stages.append, "closed")
        return "source", "sink"

    def _poll(self, source, loop):
        self.polls += 1
        if self.polls == self.stop_at:
            self.request_stop("SIGTERM")
        if not self.feed:
            return None
        x = self.feed.pop(0)
        return None if x is None else _Batch(x)

    def _learn(self, x, source, loop):
        if self.polls == self.fail_at:
            raise RuntimeError("a stage failed")
        self.seen += x
        loop.res.batches += 1

    def _maybe_checkpoint(self, source, dead_sink, loop):
        self.stages.append("commit")

    def _finish(self, source, dead_sink, loop):
        self.stages.append("finish")


def test_the_loop_stops_on_its_count_limit_and_commits_every_turn_with_a_batch():
    toy = _Toy([[1], None, [2, 3], [4], [5]])
    res = toy._run(_Loop(_Res(), limit=3))
    assert (res.stopped_by, res.batches, toy.seen) == ("max_batches", 3, [1, 2, 3, 4])
    assert toy.stages == ["commit"] * 3 + ["finish", "closed"]


def test_the_loop_stops_on_its_timeout_and_on_a_stop_request():
    toy = _Toy([])
    res = toy._run(_Loop(_Res(), timeout=0.05))
    assert res.stopped_by == "timeout" and toy.stages == ["finish", "closed"]
    toy = _Toy([[1]] * 10, stop_at=4)
    res = toy._run(_Loop(_Res()))
    assert (res.stopped_by, res.batches) == ("SIGTERM", 4)
    toy = _Toy([[1]])
    toy.request_stop("SIGINT")                       # before run(): kept
    assert toy._run(_Loop(_Res())).stopped_by == "SIGINT" and toy.polls == 0


@pytest.mark.parametrize("finish_on_error", [False, True])
def test_finish_runs_on_an_error_only_where_the_configuration_asks(finish_on_error):
    toy = _Toy([[1], [2], [3]], fail_at=2)
    toy.finish_on_error = finish_on_error
    with pytest.raises(RuntimeError, match="a stage failed"):
        toy._run(_Loop(_Res()))
    assert toy.stages == ["commit"] + ["finish"] * finish_on_error + ["closed"]


class _Recording(CommitStrategy):
    """A commit strategy that records the hooks the loop calls, in order."""

    def __init__(self, role=None):
        super().__init__(role)
        self.calls = []

    def after_batch(self, batch, source):
        self.calls.append(("after_batch", batch.x))

    def maybe_commit(self, source, dead_sink, loop):
        self.calls.append(("maybe_commit", dead_sink))

    def on_idle(self, source, loop):
        self.calls.append("on_idle")

    def finish(self, source, dead_sink, loop):
        self.calls.append(("finish", dead_sink))


class _Committing(_Toy):
    """The toy loop with the base commit stages, committing through :class:`_Recording`;
    the polls in ``failed_polls`` fail (``loop.failed_poll``) and return nothing."""

    commit_strategy = _Recording
    _maybe_checkpoint = StagedLoop._maybe_checkpoint
    _finish = StagedLoop._finish

    def __init__(self, feed, failed_polls=(), **kw):
        super().__init__(feed, **kw)
        self.failed_polls = set(failed_polls)
        self.commit = self.commit_strategy(self)

    def _poll(self, source, loop):
        batch = super()._poll(source, loop)
        loop.failed_poll = self.polls in self.failed_polls
        return batch


def test_the_loop_calls_its_commit_strategy_in_the_documented_order():
    """after_batch then maybe_commit on a turn with a batch (after _learn), on_idle on a turn
    without one whose poll did not fail, finish once at the end, with the run's dead sink."""
    toy = _Committing([[1], None, None, [2, 3], [4]], failed_polls={3})
    res = toy._run(_Loop(_Res(), limit=2))
    assert (res.stopped_by, res.batches, toy.seen) == ("max_batches", 2, [1, 2, 3])
    assert toy.commit.calls == [("after_batch", [1]), ("maybe_commit", "sink"), "on_idle",
                                ("after_batch", [2, 3]), ("maybe_commit", "sink"), ("finish", "sink")]
    # a stage that raises: no commit of that batch, and no finish where the role does not ask
    toy = _Committing([[1], [2]], fail_at=2)
    with pytest.raises(RuntimeError, match="a stage failed"):
        toy._run(_Loop(_Res()))
    assert toy.commit.calls == [("after_batch", [1]), ("maybe_commit", "sink")]
    # a role without a strategy of its own commits nothing, and the loop runs all the same
    assert type(StagedLoop.commit) is CommitStrategy
    plain = _Committing([[1], None])
    del plain.commit
    assert plain._run(_Loop(_Res(), limit=1)).batches == 1


def _wait(cond, what, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _metric(registry, name, **labels):
    return registry.get_sample_value(name, labels)


def _snapshot_records(cfg):
    try:
        return load_snapshot(cfg["checkpoint"]["directory"]).state.records_seen
    except Exception:  # noqa: BLE001 - none yet
        return None


def test_the_applier_stops_on_its_timeout_and_on_a_signal(kafka_broker, new_topic, new_group, tmp_path):
    bootstrap, deltas = kafka_broker.bootstrap, new_topic(1, prefix="deltas")
    cfg, engine, state0, X = _applier_setup(tmp_path, bootstrap, deltas, new_group())
    cfg["checkpoint"]["every_seconds"] = 0.5      # checkpoints come from turns with an empty poll
    _produce_deltas(bootstrap, deltas, [init_delta("w", engine, state0).encode(),
                                        _delta(engine, state0, X, 0, 50).encode()])

    # SIGTERM, delivered to this process, through the handlers the CLI installs
    registry = CollectorRegistry()
    applier = Applier(cfg, registry=registry, out=open("/dev/null", "w"))
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    out = {}
    try:
        applier.install_signal_handlers()
        t = threading.Thread(target=lambda: out.setdefault("res", applier.run(timeout=240)), daemon=True)
        t.start()
        _wait(lambda: (_metric(registry, "streamsvi_records_consumed_total") or 0) >= 50, "the delta")
        _wait(lambda: _snapshot_records(cfg) == 50, "a checkpoint while running")
        assert t.is_alive()
        signal.raise_signal(signal.SIGTERM)
        t.join(60)
    finally:
        for s, h in before.items():
            signal.signal(s, h)
    res = out["res"]
    assert (res.stopped_by, res.deltas, res.records, res.takeovers) == ("SIGTERM", 1, 50, 1), res
    assert res.checkpoints >= 1 and len(res.took_over_at) == 1

    # a timeout: nothing new to apply, the applier resumes and stops when the time is up
    applier = Applier(cfg, registry=CollectorRegistry(), out=open("/dev/null", "w"))
    res = applier.run(timeout=3)
    assert (res.stopped_by, res.deltas) == ("timeout", 0), res
    assert not applier.active and _snapshot_records(cfg) == 50
