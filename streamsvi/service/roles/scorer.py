"""The scorer role (``streamsvi run --role scorer``): serve a stream while the model learns.

A scorer is a :class:`~streamsvi.service.daemon.Daemon` (the loop of named stages of
:mod:`streamsvi.service.loop`) configured with a scoring stage in place of learning and
its own commit strategy, :class:`ScoreCommit`:

* source → batch as in one process: the records topics of ``[source]`` (``topics`` or
  ``pattern``, the codec, ``[validation]``, ``[records]``, security), read by the
  scorers' own consumer group (``scorer.group_id``, default ``<source.group_id>-scorer``,
  never the daemon's), the source noting where each accepted record came from
  (``Batch.positions``);
* ``_set_aside``: each record the daemon would dead-letter gets one output record with
  the daemon's reason code (``{"topic", "partition", "offset", "reason", "error"}``),
  counted in ``streamsvi_scorer_errors_total{reason}``; it never stops the scorer;
* ``_learn`` scores the batch's records with the snapshot in use
  (:meth:`Scorer._score`: ``FittedModel.score`` on the decoded block, the one call)
  and makes one output record per record: its position, the snapshot's ``number``,
  ``step`` and offset ``watermark`` (the source offsets the snapshot includes), and the
  model's scores under ``"scores"``;
* the commit (:class:`ScoreCommit`): the output records of up to
  ``scorer.commit_every_batches`` batches (or ``scorer.commit_seconds``) and their input
  offsets (``send_offsets_to_transaction``) in one Kafka transaction, under the
  transactional id ``streamsvi-scorer-<group>-<scorer id>``: a record is consumed by the
  group exactly when its output is committed, so a read_committed reader of the output
  topic sees one output record per input record, whatever instant the scorer is killed
  at. A restarted scorer with the same id fences its predecessor and aborts the
  transaction it left open (``init_transactions``, at start, before it reads).

Snapshots (:class:`DirectorySnapshots`, :class:`TopicSnapshots`, :class:`LambdaSnapshots`):
the checkpoint directory (the daemon's or the applier's) through a
:class:`~streamsvi.scoring.SnapshotWatcher` (its background thread loads a new snapshot
whole), or, without shared storage, the daemon's snapshot topic (``scorer.snapshot_topic``
= the daemon's ``checkpoint.snapshot_topic``; :mod:`.snapshot_topic`), or the scale-out
applier's λ topic (``scorer.from_lambda``). A new snapshot is taken only between transactions: every
output record of one transaction is stamped with the same snapshot, and nothing is
dropped or scored twice at a swap (the offsets move only with committed output).
"""
from __future__ import annotations

import json
import logging
import os
import socket
import time

from ..commit import CommitStrategy, _bounded, abort_or_drop
from ..config import ConfigError, build_model, client_security
from ..console import plural
from ..daemon import Daemon
from ..metrics import ScorerMetrics

log = logging.getLogger("streamsvi.scorer")

#: The pointer of the checkpoint directory a scorer follows by default (``scorer.follow``): the
#: snapshot promoted on held-out evidence (:mod:`streamsvi.service.promotion`); ``latest``
#: where the directory has no such pointer.
FOLLOW = "promoted"
#: How often a scorer waiting for its first snapshot looks again.
FIRST_SNAPSHOT_POLL_S = 0.5


def scorer_id(cfg) -> str:
    """``scorer.scorer_id``, else ``$STREAMSVI_SCORER_ID``, else the host name."""
    return cfg["scorer"]["scorer_id"] or os.environ.get("STREAMSVI_SCORER_ID") or socket.gethostname()


def scorer_group(cfg) -> str:
    """``scorer.group_id``, default ``<source.group_id>-scorer``."""
    return cfg["scorer"]["group_id"] or f"{cfg['source']['group_id']}-scorer"


def check_scorer_config(cfg) -> None:
    """Refuse configs the scorer cannot run, naming the setting."""
    if cfg["source"]["kind"] != "kafka":
        raise ConfigError("source.kind: the scorer role reads a Kafka records topic (for a file, use "
                          "streamsvi score)")
    sc = cfg["scorer"]
    if not sc["output_topic"]:
        raise ConfigError("scorer.output_topic: required for --role scorer (the topic the scored records go to)")
    if sc["output_topic"] in (cfg["source"]["topics"] or []):
        raise ConfigError(f"scorer.output_topic: {sc['output_topic']!r} is also in source.topics; the scorer "
                          f"would read its own output")
    if scorer_group(cfg) == cfg["source"]["group_id"] and sc["group_id"] is not None:
        raise ConfigError("scorer.group_id: must differ from source.group_id (the daemon's group: its "
                          "committed offsets are the daemon's)")
    if sc["from_lambda"] and sc["snapshot_topic"]:
        raise ConfigError("scorer.from_lambda, scorer.snapshot_topic: set one (the applier's lambda, or the "
                          "daemon's snapshot topic)")
    if sc["from_lambda"] and not cfg["scaleout"]["deltas_topic"]:
        raise ConfigError("scorer.from_lambda: needs the scale-out settings of the applier it follows "
                          "(scaleout.deltas_topic, and scaleout.lambda_topic or lambda_file)")
    if sc["commit_seconds"] * 1000 * 2 > sc["transaction_timeout_ms"]:
        raise ConfigError(f"scorer.commit_seconds: {sc['commit_seconds']:g} s must be at most half of "
                          f"scorer.transaction_timeout_ms ({sc['transaction_timeout_ms']} ms)")


def scorer_source(cfg, metrics):
    """The worker's Kafka source (the daemon's, with a bounded poll interval: on tansu 0.6.0 a
    member that missed a rebalance can otherwise wait in its JoinGroup for the default 300 s;
    with the daemon's source, one run of the two-scorer kill test saw the surviving scorer get
    no batch for 60 s after its peer was killed) on the scorers' group, telling where each
    record came from. A record kind that scores differently from how it learns (ratings: a pair
    without a rating, a user alone for the top-k; labelled rows: no label) reads its JSON
    records with its scoring codec and validator, as ``streamsvi score`` does."""
    from .worker import worker_source

    source = worker_source({**cfg, "source": {**cfg["source"], "group_id": scorer_group(cfg)}}, metrics)
    source.track_positions = True
    own = getattr(source.kind, "scoring_codec_validator", None)
    if own is not None and cfg["source"]["codec"] == "json":      # (LineScorer's choice, the same)
        source.codec, source.validator = own(build_model(cfg["model"]), cfg["source"].get("fields"),
                                             dict(cfg["validation"]))
    return source


class _NoDeadLetters:
    """The scorer answers a bad record on its output topic; it keeps no dead-letter sink."""

    def send(self, dead) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


# ------------------------------------------------------------------ snapshots
class DirectorySnapshots:
    """Snapshots of a checkpoint directory: a :class:`~streamsvi.scoring.SnapshotWatcher`
    following ``follow`` (:data:`FOLLOW` by default), whose thread loads each new snapshot whole
    off the scoring path."""

    def __init__(self, directory, poll_seconds: float, follow: str = FOLLOW):
        self.directory, self.poll_seconds, self.follow = directory, float(poll_seconds), follow
        self.watcher = None
        self.where = f"checkpoint directory {str(directory)!r}"

    def first(self):
        """The current snapshot (a FittedModel), or None while there is none."""
        from ...scoring import SnapshotWatcher

        try:
            self.watcher = SnapshotWatcher(self.directory, poll_seconds=max(self.poll_seconds, 0.05),
                                           follow=self.follow)
        except (FileNotFoundError, ValueError) as exc:
            log.debug("no snapshot to score with yet (%s)", exc)
            return None
        self.watcher.start()
        return self.watcher.current()

    def newest(self):
        """The newest snapshot loaded so far (the watcher swaps it in when loaded)."""
        return self.watcher.current()

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()


class _PolledSnapshots:
    """A source of snapshots read on the scoring thread between transactions: ``first()`` the
    current one (None while there is none), ``newest()`` looks for a newer one at most every
    ``poll_seconds`` (``_read``, of the subclass) and returns the one in use."""

    poll_seconds = 1.0
    _current, _looked = None, 0.0

    def _read(self):
        raise NotImplementedError

    def first(self):
        return self._read()

    def newest(self):
        now = time.monotonic()
        if now - self._looked >= self.poll_seconds:
            self._looked = now
            self._read()
        return self._current


class TopicSnapshots(_PolledSnapshots):
    """Snapshots of the daemon's snapshot topic (:class:`.snapshot_topic.SnapshotTopicReader`),
    read on the scoring thread between transactions, at most every ``scorer.snapshot_poll_seconds``."""

    def __init__(self, cfg):
        from .snapshot_topic import SnapshotTopicReader

        topic = cfg["scorer"]["snapshot_topic"]
        self.reader = SnapshotTopicReader(cfg["source"]["bootstrap_servers"], topic, client_security(cfg),
                                          client_id=f"streamsvi-scorer-{scorer_id(cfg)}-snapshots")
        self.poll_seconds = float(cfg["scorer"]["snapshot_poll_seconds"])
        self.where = f"snapshot topic {topic!r}"
        self._current, self._looked = None, 0.0

    def _read(self, timeout_s: float = 0.0):
        from ...scoring import FittedModel
        from ..daemon import _transient_errors

        try:
            snap = self.reader.latest(timeout_s)
        except _transient_errors() as exc:
            log.info("%s: %s: %s; read again later", self.where, type(exc).__name__, exc)
            self.reader.close()
            return None
        if snap is not None:
            self._current = FittedModel.from_snapshot(snap)
        return self._current

    def first(self):
        return self._read(timeout_s=0.2)

    def close(self) -> None:
        self.reader.close()


class LambdaSnapshots(_PolledSnapshots):
    """The scale-out applier's λ as snapshots (``scorer.from_lambda``): its lambda topic
    (:class:`.lambda_log.LambdaLog`, which replays the applier's steps) or its λ file; each λ
    version is a snapshot numbered by its step, looked for at most every
    ``scorer.snapshot_poll_seconds``, on the scoring thread between transactions.

    The watermark is the input offsets the applier had applied at the latest full λ on the
    topic (``applied_end`` of its ``applier.json``): a lower bound for a λ that later steps
    moved; empty for a λ file. ``created`` is when this scorer first saw the version (the λ
    carries no time), so ``streamsvi_scorer_snapshot_age_seconds`` is the age of the λ here.
    """

    def __init__(self, cfg):
        from .lambda_log import LambdaLog
        from .transport import LambdaFile
        from .worker import lambda_channel

        how, where = lambda_channel(cfg)
        if how == "file":
            self.lam = LambdaFile(where)
        else:
            self.lam = LambdaLog(cfg["source"]["bootstrap_servers"], where, cfg["scaleout"]["deltas_topic"],
                                 security=client_security(cfg), client_id=f"streamsvi-scorer-{scorer_id(cfg)}-lambda")
        self.poll_seconds = float(cfg["scorer"]["snapshot_poll_seconds"])
        self.where = f"the applier's λ ({how} {where!r})"
        self._current, self._looked = None, 0.0

    def _read(self):
        from datetime import datetime, timezone

        from ...scoring import FittedModel
        from .snapshot_topic import _snapshot

        self.lam.refresh()
        state = self.lam.state
        if state is None or (self._current is not None and self._current.number == state.step):
            return self._current
        applied = ((getattr(self.lam, "full_info", None) or {}).get("applier") or {}).get("applied_end", {})
        marks = [{"source": k.rsplit("/", 1)[0], "partition": int(k.rsplit("/", 1)[1]), "offset": int(v)}
                 for k, v in sorted(applied.items())]
        meta = {"number": int(state.step), "created": datetime.now(timezone.utc).isoformat(), "offsets": marks}
        self._current = FittedModel.from_snapshot(_snapshot(self.lam.engine, state, meta, self.where))
        return self._current

    def close(self) -> None:
        close = getattr(self.lam, "close", None)
        if close is not None:
            close()


# ------------------------------------------------------------------ the commit
class _ScoreTransaction:
    """The open transaction: its output records' count, its batches' first and next offsets."""

    def __init__(self):
        self.started = time.monotonic()
        self.batches = self.records = 0
        self.firsts: dict = {}      # (topic, partition) -> first offset read in the transaction
        self.offsets: dict = {}     # (topic, partition) -> next offset


class ScoreCommit(CommitStrategy):
    """The scorer's: its output records and their input offsets in one Kafka transaction.

    Every batch's output records join the open transaction (begun if none is); it is
    committed once it holds ``scorer.commit_every_batches`` batches or is
    ``scorer.commit_seconds`` old, at every empty poll and at a stop, only as a stable
    member of the group owning every partition it read (otherwise aborted and those
    records read again, by this scorer or the partitions' new owner). A commit that
    fails is settled by a new producer under the same transactional id (its
    ``init_transactions`` completes or aborts it); the group's committed offsets then
    say which, and records not committed are read again.
    """

    def __init__(self, role=None):
        super().__init__(role)
        self.producer = None
        self.txn = None
        self.committed = 0          # transactions committed

    def open_producer(self):
        """The transactional producer, started (``init_transactions``) if there is none."""
        s = self.role
        if self.producer is None:
            from kafka import KafkaProducer

            sc = s.cfg["scorer"]
            self.producer = KafkaProducer(
                bootstrap_servers=s.cfg["source"]["bootstrap_servers"],
                transactional_id=f"streamsvi-scorer-{scorer_group(s.cfg)}-{s.scorer_id}",
                transaction_timeout_ms=sc["transaction_timeout_ms"], acks="all",
                linger_ms=min(int(sc["commit_seconds"] * 1000), 100), batch_size=1 << 20,
                max_request_size=4 << 20, client_id=f"streamsvi-scorer-{s.scorer_id}", **client_security(s.cfg))
            self.producer.init_transactions()     # fences an older instance, aborts its open transaction
        return self.producer

    def close_producer(self) -> None:
        p, self.producer = self.producer, None
        if p is not None:
            try:
                p.close(timeout=5)
            except Exception:  # noqa: BLE001 - it is being dropped
                pass

    def after_batch(self, batch, source) -> None:
        """The batch's output records join the open transaction; commit when one is due."""
        s = self.role
        out, s._out = s._out, []
        prod = self.open_producer()
        txn = self.txn
        if txn is None:
            prod.begin_transaction()
            txn = self.txn = _ScoreTransaction()
        topic = s.cfg["scorer"]["output_topic"]
        for key, value in out:
            prod.send(topic, value, key=key)
        txn.records += len(out)
        txn.batches += 1
        for k, end in batch.next_offsets.items():
            txn.firsts.setdefault(k, batch.first_offsets.get(k, end))
            txn.offsets[k] = end
        sc = s.cfg["scorer"]
        if txn.batches >= sc["commit_every_batches"] or time.monotonic() - txn.started >= sc["commit_seconds"]:
            self.commit_open(source)

    def on_idle(self, source, loop) -> None:
        if self.txn is not None and not loop.failed_poll:
            self.commit_open(source)

    def finish(self, source, dead_sink, loop) -> None:
        """Commit the open transaction (if this scorer still owns its partitions), close the producer."""
        if self.txn is not None:
            try:
                self.commit_open(source)
            except Exception as exc:  # noqa: BLE001 - not committed: read again by the group
                log.warning("scorer %s: the last transaction was not committed (%s: %s); its records will "
                            "be scored again", self.role.scorer_id, type(exc).__name__, exc)
        self.close_producer()

    def commit_open(self, source) -> None:
        """Commit the open transaction: the output records and the input offsets, all or nothing."""
        from kafka import TopicPartition

        from ...io._kafka import offset_and_metadata

        s, txn = self.role, self.txn
        if txn is None:
            return
        self.txn = None
        member, owned = source.membership(), source.assignment()
        if member is None or not all(k in owned for k in txn.offsets):
            log.info("scorer %s: not a stable member owning %s any more; %s read again, not committed",
                     s.scorer_id, sorted(txn.offsets), plural(txn.records, "record"))
            self._abort()
            self._give_back(source, txn)
            return
        offsets = {TopicPartition(t, p): offset_and_metadata(end) for (t, p), end in txn.offsets.items()}
        try:
            _bounded(self.producer, "send_offsets_to_transaction", offsets, member)
            _bounded(self.producer, "commit_transaction")
        except Exception as exc:  # noqa: BLE001 - settled below, whatever it was
            from kafka.errors import ProducerFencedError

            if isinstance(exc, ProducerFencedError):
                raise RuntimeError(f"scorer {s.scorer_id}: fenced by another scorer with the same id (group "
                                   f"{scorer_group(s.cfg)!r}); give each scorer its own id "
                                   f"(STREAMSVI_SCORER_ID or scorer.scorer_id)") from exc
            if not self._settle(source, txn, exc):
                self._give_back(source, txn)
                return
        self.committed += 1
        s.scorer_metrics.transactions.inc()
        s.offsets.update(txn.offsets)
        s.metrics.set_lag(source.lag())

    def _abort(self) -> None:
        abort_or_drop(self, log, f"scorer {self.role.scorer_id}")

    @staticmethod
    def _give_back(source, txn) -> None:
        """Read the transaction's records again: seek each partition still owned to its first offset."""
        owned = source.assignment()
        source.seek({k: off for k, off in txn.firsts.items() if not owned or k in owned})

    def _settle(self, source, txn, exc) -> bool:
        """After a commit that failed or did not finish: was it committed? A new producer with the
        same transactional id completes or aborts it; the group's committed offsets say which."""
        from ..daemon import _transient_errors

        s = self.role
        log.warning("scorer %s: transaction for %s did not complete (%s: %s); settling it with a new producer",
                    s.scorer_id, sorted(txn.offsets), type(exc).__name__, exc)
        old, self.producer = self.producer, None
        if old is not None:
            try:
                old.close(timeout=0)
            except Exception:  # noqa: BLE001
                pass
        while not s._stop.is_set():
            try:
                self.open_producer()
                s.health.answered()
                break
            except _transient_errors() as e:
                s.health.wait(s._stop, s.health.failed(e, "starting a producer"))
        else:
            return False
        try:
            committed = source.committed(set(txn.offsets))
        except _transient_errors():
            return False
        return all(committed.get(k, -1) >= end for k, end in txn.offsets.items())


# ------------------------------------------------------------------ the role
class Scorer(Daemon):
    """One scorer (module docs). ``snapshots``: where snapshots come from (default: the
    config's, :meth:`_snapshots`); the other parameters are :class:`Daemon`'s."""

    commit_strategy = ScoreCommit
    prefetches = False

    def __init__(self, cfg, registry=None, source_factory=None, out=None, snapshots=None):
        check_scorer_config(cfg)
        super().__init__(cfg, registry=registry, source_factory=source_factory or scorer_source,
                         dead_sink_factory=lambda cfg: _NoDeadLetters(), out=out)
        self.scorer_id = scorer_id(cfg)
        self.health.role = f"scorer {self.scorer_id}"
        self.scorer_metrics = ScorerMetrics(self.metrics.registry)
        self.snapshots = snapshots if snapshots is not None else self._snapshots()
        self.fitted = None          # the FittedModel scored with now
        self._stamp = ""            # its JSON stamp, spliced into every output record
        self._batch = None          # the batch in hand (its positions and dead letters)
        self._out: list = []        # (key, value) of the batch in hand's output records
        self.scored = self.errors = 0
        self._refused = None        # the number of the last snapshot refused by _fits (said once)

    def _snapshots(self):
        sc = self.cfg["scorer"]
        if sc["from_lambda"]:
            return LambdaSnapshots(self.cfg)
        if sc["snapshot_topic"]:
            return TopicSnapshots(self.cfg)
        return DirectorySnapshots(self.cfg["checkpoint"]["directory"], sc["snapshot_poll_seconds"],
                                  sc["follow"])

    # ------------------------------------------------------- start / stop
    def _resume(self):
        """Wait for the first snapshot to score with (a stop ends the wait)."""
        said = False
        while not self._stop.is_set():
            fitted = self.snapshots.first()
            if fitted is not None:
                why = self._fits(fitted)
                if why is not None:
                    raise ConfigError(f"snapshot {fitted.number} in {self.snapshots.where} cannot score these "
                                      f"records: {why}; point the scorer at the daemon's config and snapshots")
                self._use(fitted)
                print(f"scoring with snapshot {fitted.number} (step {fitted.step}) from {self.snapshots.where}",
                      file=self.out, flush=True)
                return
            if not said:
                said = True
                print(f"waiting for a first snapshot in {self.snapshots.where}", file=self.out, flush=True)
            self._stop.wait(FIRST_SNAPSHOT_POLL_S)

    def _start(self, stack, loop):
        stack.callback(self.snapshots.close)
        if self._stop.is_set():
            return None
        opened = super()._start(stack, loop)
        if opened is not None and self.fitted is None:      # stopped while waiting for a snapshot
            loop.res.stopped_by = self._stop_reason
            return None
        return opened

    def _refuse_fresh_start(self, source):
        """Nothing to refuse: the group's committed offsets are the scorer's whole state."""

    def _await_assignment(self, source, timeout_s: float | None = None) -> bool:
        """Start the transactional producer first (it aborts what a killed predecessor with this
        id left open), then wait for partitions as the daemon does."""
        self.commit.open_producer()
        return super()._await_assignment(source, timeout_s)

    def _finish(self, source, dead_sink, loop):
        """A last progress line, then the commit strategy's ``finish``."""
        now = time.monotonic()
        if self.cfg["metrics"]["progress_seconds"] and loop.progress_records:
            self._print_progress(source, None, loop.progress_records / max(now - loop.last_progress, 1e-9))
        self.commit.finish(source, dead_sink, loop)

    # ------------------------------------------------------------- batches
    def _fits(self, fitted) -> str | None:
        """Why ``fitted`` cannot score the records this scorer decodes (another model kind, other
        features), or None."""
        mine, theirs = self.model, fitted.model
        if theirs.name != mine.name:
            return f"it is a {theirs.name!r} model, the config's model.kind is {mine.name!r}"
        a, b = getattr(theirs, "n_features", None), getattr(mine, "n_features", None)
        if a != b:
            return f"it has {a} features, the config's model {b}"
        return None

    def _use(self, fitted) -> None:
        """Score with ``fitted`` from now on (called between transactions)."""
        if self.fitted is not None:
            self.scorer_metrics.swaps.inc()
            log.info("scorer %s: snapshot %d (step %d) swapped in for snapshot %d", self.scorer_id,
                     fitted.number, fitted.step, self.fitted.number)
        self.fitted = fitted
        self.scorer_metrics.use_snapshot(fitted)
        marks = {f"{o['source']}/{o['partition']}": int(o["offset"]) for o in (fitted.offsets or [])
                 if isinstance(o, dict)}
        self._stamp = json.dumps({"number": int(fitted.number), "step": int(fitted.step), "watermark": marks},
                                 separators=(",", ":"))

    def _set_aside(self, batch, dead_sink, loop) -> None:
        """Each rejected record gets an error record, counted by reason; the batch is kept for
        :meth:`_learn`. A new snapshot is taken here when no transaction is open."""
        self._batch = batch
        if self.commit.txn is None:
            fitted = self.snapshots.newest()
            if fitted is not None and fitted.number != self.fitted.number:
                why = self._fits(fitted)
                if why is None:
                    self._use(fitted)
                elif fitted.number != self._refused:
                    self._refused = fitted.number
                    log.error("scorer %s: snapshot %d cannot score these records (%s); scoring on with "
                              "snapshot %d", self.scorer_id, fitted.number, why, self.fitted.number)
        for d in batch.dead:
            p = d.position
            self._emit(p.source, p.partition, p.offset, d.row, {"reason": d.reason, "error": f"{d.reason}: {d.message}"})
            self.scorer_metrics.errors.labels(d.reason).inc()
        self.errors += len(batch.dead)
        loop.res.dead += len(batch.dead)

    def _emit(self, topic, partition, offset, row, scores: dict) -> None:
        """One output record: where the input was, the snapshot's stamp, and ``scores`` under
        ``"scores"`` (a score column may share a name with a position field: LDA's ``topic``),
        or an error record's ``reason`` and ``error`` beside the position."""
        where = {"topic": topic, "partition": int(partition), "offset": int(offset)}
        if row is not None:
            where["row"] = int(row)
        if "reason" in scores and "error" in scores:
            body = "," + json.dumps(scores, separators=(",", ":"))[1:]
        else:
            body = ',"scores":' + json.dumps(scores, separators=(",", ":"), allow_nan=True) + "}"
        value = json.dumps(where, separators=(",", ":"))[:-1] + ',"snapshot":' + self._stamp + body
        self._out.append((f"{topic}/{partition}".encode(), value.encode()))

    def _hold_out(self, x, loop):
        """Nothing is held out: every record is scored."""
        return x

    def _learn(self, x, source, loop) -> None:
        """Score the batch's records with the snapshot in use: one output record each."""
        n = self.kind.n_records(x)
        if not n:
            return
        t0 = time.perf_counter()
        scores, refused = self._score(x), 0
        for (t, p, o, row), sc in zip(self._batch.positions, scores):
            self._emit(t, p, o, row, sc)
            if "error" in sc and "reason" in sc:       # a record the model refused (_score)
                self.scorer_metrics.errors.labels(sc["reason"]).inc()
                refused += 1
        self.errors += refused
        self.scorer_metrics.seconds.observe(time.perf_counter() - t0)
        self.scorer_metrics.scored.inc(n - refused)
        self.metrics.records.inc(n)
        self.metrics.batches.inc()
        self.scored += n
        loop.res.records += n
        loop.res.batches += 1
        loop.progress_records += n
        loop.last_info = True

    def _score(self, x) -> list[dict]:
        """The snapshot's scores of the records ``x`` (a decoded block): ``FittedModel.score``, the
        one place the scorer calls the model. A block the model refuses is scored record by record;
        a record it still refuses gets ``{"reason": "invalid", "error": ...}``."""
        try:
            return self.fitted.score(x)
        except ValueError:
            pass
        out = []
        for i in range(self.kind.n_records(x)):
            try:
                out.extend(self.fitted.score(self.kind.take(x, slice(i, i + 1))))
            except ValueError as exc:
                out.append({"reason": "invalid", "error": f"invalid: {exc}"})
        return out

    def _print_progress(self, source, info, rate):
        print(f"scorer {self.scorer_id}  snapshot {self.fitted.number} (step {self.fitted.step})  "
              f"records {self.scored:10d}  {rate:10.0f} rec/s  errors {self.errors}  "
              f"lag {sum(source.lag().values())}", file=self.out, flush=True)

    def summary(self, res) -> str:
        """The run's last console line."""
        return (f"stopped ({res.stopped_by}): {plural(res.records, 'record')} scored, "
                f"{plural(self.errors, 'error')}, "
                f"{plural(self.commit.committed, 'transaction')} committed, last snapshot "
                f"{self.fitted.number if self.fitted is not None else '-'}")
