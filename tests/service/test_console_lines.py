"""What `streamsvi run` prints: one line per event, the true held-out count, a recent rate, grammar.

The runs are real: ``streamsvi run`` as a subprocess against the local tansu broker, twice on
the same checkpoint directory (the second resumes); the rate's window is checked on a daemon
whose source is quiet before its records come.
"""
import io
import logging
import re
import subprocess
import time

import pytest

from streamsvi.io.dense import JsonCodec
from streamsvi.io.produce import produce_rows
from streamsvi.io.sources.memory import MemorySource
from streamsvi.service.config import validate
from streamsvi.service.console import plural, said_on_console
from streamsvi.service.daemon import Daemon, RunResult

from .conftest import STREAMSVI, blob_rows, gmm_config, write_config

H = 50                  # held-out records


def _run(config):
    proc = subprocess.run([STREAMSVI, "run", "--config", str(config), "--until-drained"],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc.stderr


def _last_line(err):
    return err.strip().splitlines()[-1]


def test_each_event_is_one_line_and_a_resumed_run_counts_its_reservoir(kafka_broker, new_topic,
                                                                        new_group, tmp_path):
    bootstrap, topic = kafka_broker.bootstrap, new_topic(1)
    cfg = gmm_config(tmp_path, bootstrap=bootstrap, topic=topic, group=new_group(),
                     checkpoint={"every_batches": 4},
                     metrics={"heldout_size": H, "progress_seconds": 0.5})
    config = write_config(tmp_path / "gmm.toml", cfg)
    ck_dir = tmp_path / "ck"

    assert produce_rows(bootstrap, topic, blob_rows(600, seed=1), JsonCodec(2), partitions=1) == 600
    first = _run(config)
    snaps = sorted(p.name for p in ck_dir.glob("snap-*"))
    assert snaps, first
    # every snapshot written is said once: a log line mid-run, the console line for the last
    for name in snaps:
        assert len(re.findall(rf"\b{name}\b", first)) == 1, (name, first)
    assert len(re.findall(r"^checkpoint: ", first, re.M)) == 1, first
    last = _last_line(first)
    m = re.fullmatch(r"stopped \(drained\): (\d+) batches, 550 records applied in \d+\.\d s \(\d+ rec/s\), "
                     r"0 dead-lettered, 50 held out, (\d+) checkpoints?", last)
    assert m, last
    assert int(m.group(2)) >= len(snaps)

    # a resumed run: the resume said once, the reservoir restored from the snapshot counted
    assert produce_rows(bootstrap, topic, blob_rows(40, seed=2), JsonCodec(2), partitions=1) == 40
    second = _run(config)
    assert len(re.findall(r"resumed from", second)) == 1, second
    assert re.search(rf"^resumed from snapshot {snaps[-1][5:].lstrip('0')} \(step \d+, 550 records\)$",
                     second, re.M), second
    assert len(re.findall(r"^checkpoint: ", second, re.M)) == 1, second
    assert "saved snap-" not in second, second          # the one checkpoint: its console line only
    assert _last_line(second) == ("stopped (drained): 1 batch, 40 records applied in "
                                  + re.search(r"in (\d+\.\d s \(\d+ rec/s\))", second).group(1)
                                  + ", 0 dead-lettered, 50 held out, 1 checkpoint"), second


class _QuietFirst(MemorySource):
    """A memory source whose first ``quiet`` polls return nothing, each after ``wait_s``."""

    def __init__(self, x, quiet, wait_s):
        super().__init__(x)
        self.quiet, self.wait_s = quiet, wait_s
        self.last_empty_returned = None

    def poll_batch(self, max_records, max_wait_s=0.0):
        if self.quiet:
            self.quiet -= 1
            time.sleep(self.wait_s)
            self.last_empty_returned = time.monotonic()
            return None
        return super().poll_batch(max_records, max_wait_s)


def test_the_rate_leaves_out_the_wait_for_the_first_records(tmp_path):
    rows = blob_rows(400, seed=3)
    cfg = validate(gmm_config(tmp_path, source={"kind": "file", "path": str(tmp_path / "unused")},
                              metrics={"heldout_size": 0, "progress_seconds": 1000.0}))
    sources = []

    def factory(cfg, metrics):
        sources.append(_QuietFirst(rows, quiet=4, wait_s=0.5))
        return sources[0]

    out = io.StringIO()
    t0 = time.monotonic()
    res = Daemon(cfg, source_factory=factory, out=out).run(max_batches=8)
    t_end = time.monotonic()
    assert res.records == 400
    line = [ln for ln in out.getvalue().splitlines() if ln.startswith("step ")]
    assert len(line) == 1, out.getvalue()            # the line at the end of the run
    rate = float(re.search(r"(\d+) rec/s", line[0]).group(1))
    # the window opened after the last empty poll, so the rate is at least the records over
    # the time since then; a lifetime average (2 s of empty polls in it) is below that
    since_quiet = t_end - sources[0].last_empty_returned
    assert rate >= 400 / since_quiet - 1, (rate, since_quiet)
    assert rate > 400 / (t_end - t0) + 1, (rate, t_end - t0)
    # the run's average: the same span
    assert 0 < res.seconds <= since_quiet
    assert re.search(r"400 records applied in \d+\.\d s", res.summary())


# ------------------------------------------------------------------ formatting
@pytest.mark.parametrize("n, word, many, text", [
    (0, "checkpoint", None, "0 checkpoints"), (1, "checkpoint", None, "1 checkpoint"),
    (2, "checkpoint", None, "2 checkpoints"), (1, "batch", "batches", "1 batch"),
    (3, "batch", "batches", "3 batches"), (1, "line had an error", "lines had errors", "1 line had an error"),
    (4, "line had an error", "lines had errors", "4 lines had errors")])
def test_plural(n, word, many, text):
    assert plural(n, word, many) == text


def test_the_summary_line():
    res = RunResult(batches=1, records=1, dead=1, heldout=0, checkpoints=1, stopped_by="drained",
                    heldout_total=500, seconds=0.5)
    assert res.summary() == ("stopped (drained): 1 batch, 1 record applied in 0.5 s (2 rec/s), "
                             "1 dead-lettered, 500 held out, 1 checkpoint")
    assert RunResult(stopped_by="timeout").summary() == \
        "stopped (timeout): 0 batches, 0 records applied, 0 dead-lettered, 0 held out, 0 checkpoints"


def test_said_on_console_lowers_info_only_inside_the_block():
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append((record.levelname, record.getMessage()))

    lg = logging.getLogger("streamsvi.test_console_lines")
    h = Keep()
    lg.addHandler(h)
    lg.setLevel(logging.INFO)
    try:
        with said_on_console(lg.name):
            lg.info("saved")                 # INFO: the console says it; DEBUG is off: dropped
            lg.warning("disk slow")          # warnings are untouched
        lg.setLevel(logging.DEBUG)
        with said_on_console(lg.name):
            lg.info("saved again")           # DEBUG on: kept, as DEBUG
        lg.info("after")
    finally:
        lg.removeHandler(h)
        lg.setLevel(logging.NOTSET)
    assert seen == [("WARNING", "disk slow"), ("DEBUG", "saved again"), ("INFO", "after")]


def test_score_and_inspect_count_in_the_right_number(tmp_path, capsys):
    from streamsvi.cli import main

    data = tmp_path / "rows.jsonl"
    data.write_bytes(b"".join(JsonCodec(2).encode(r) + b"\n" for r in blob_rows(300, seed=4)))
    cfg = validate(gmm_config(tmp_path, source={"kind": "file", "path": str(data)},
                              metrics={"heldout_size": 0}))
    Daemon(cfg, out=io.StringIO()).run(until_drained=True)
    lines = tmp_path / "score.jsonl"
    lines.write_text("[0.5, 1.0]\n[1.0]\n")             # one record, one line with an error
    assert main(["score", "--snapshot", str(tmp_path / "ck"), "--input", str(lines),
                 "--output", str(tmp_path / "out.jsonl")]) == 1
    err = capsys.readouterr().err
    assert re.search(r"^scored 1 record with snapshot \d+ \(step \d+\); 1 line had an error$", err, re.M), err
    lines.write_text("[0.5, 1.0]\n[1.0, 2.0]\n")
    assert main(["score", "--snapshot", str(tmp_path / "ck"), "--input", str(lines),
                 "--output", str(tmp_path / "out.jsonl")]) == 0
    assert "scored 2 records with snapshot" in capsys.readouterr().err
    assert main(["inspect", str(tmp_path / "ck")]) == 0
    assert re.search(r"^progress   step 6, 300 records folded in$", capsys.readouterr().out, re.M)
