"""Checkpoint storage failing mid-run (issue 30, item 7).

Before: a full disk ended ``streamsvi run`` with exit 1 and three chained
tracebacks; a removed checkpoint directory with a bare ``[Errno 2] ... .lock``.
Nothing was lost either way, and now the user is told so: one line naming the
directory, the failure and the last durable snapshot, exit code 5
(``exitcodes.STORAGE``), and a restart on fixed storage continues from that
snapshot with every record applied once.
"""
import os
import subprocess
import time
import uuid

import pytest

from streamsvi.checkpoint import load_snapshot
from streamsvi.io import JsonCodec
from streamsvi.service import exitcodes

from .conftest import STREAMSVI, blob_rows, gmm_config, write_config


def _data(tmp_path, n):
    data = tmp_path / "records.jsonl"
    data.write_bytes(b"\n".join(JsonCodec(2).encode(r) for r in blob_rows(n, seed=5)) + b"\n")
    return data


def _config(tmp_path, data, ck, every=1):
    raw = gmm_config(tmp_path, inference={"batch_size": 20, "n_total": 5000},
                     source={"kind": "file", "path": str(data), "format": "jsonl",
                             "dead_letter_path": str(tmp_path / "dead.jsonl")},
                     checkpoint={"directory": str(ck), "every_batches": every, "keep": 2},
                     metrics={"heldout_size": 0})
    return write_config(tmp_path / f"file-{uuid.uuid4().hex[:6]}.toml", raw)


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs (needs root; skipped where mounting is not allowed)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (not root?)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _check_one_line(proc):
    err = proc.stderr
    assert proc.returncode == exitcodes.STORAGE, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    lines = [ln for ln in err.splitlines() if ln.startswith("streamsvi: error: ")]
    assert len(lines) == 1, err[-3000:]
    return lines[0]


def test_a_full_disk_is_one_line_exit_5_and_a_restart_loses_nothing(tmp_path, small_disk):
    n = 4000
    data = _data(tmp_path, n)
    ck = small_disk / "ck"
    filler = small_disk / "filler"
    filler.write_bytes(bytes(200 << 10))                   # leaves ~56 KiB: a few snapshots fit
    config = _config(tmp_path, data, ck)
    proc = subprocess.run([STREAMSVI, "run", "--config", str(config), "--until-drained"],
                          capture_output=True, text=True, timeout=120)
    line = _check_one_line(proc)
    assert f"checkpoint in {ck} failed" in line and "No space left on device" in line
    assert "nothing is lost" in line
    last = load_snapshot(ck)                               # the last durable snapshot is intact
    assert f"snapshot {last.number} is the last durable one" in line
    assert 0 < last.state.records_seen < n
    filler.unlink()                                        # storage fixed: restart
    proc = subprocess.run([STREAMSVI, "run", "--config", str(config), "--until-drained"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert load_snapshot(ck).state.records_seen == n        # every record once


def test_a_removed_checkpoint_directory_is_one_line_exit_5(tmp_path):
    n = 200_000
    data = _data(tmp_path, n)
    ck = tmp_path / "ck"
    config = _config(tmp_path, data, ck, every=5)
    proc = subprocess.Popen([STREAMSVI, "run", "--config", str(config), "--until-drained"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (ck / "latest").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
            time.sleep(0.05)
        os.rename(ck, tmp_path / "ck-moved")              # atomic: gone from under the daemon
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    line = _check_one_line(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    assert f"checkpoint in {ck} failed" in line and "the checkpoint directory was removed" in line
    assert not os.path.exists(ck / "latest")
