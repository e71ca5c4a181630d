"""`streamsvi report` from real runs: the panels' titles, legends and markers, read from
matplotlib's objects (not pixels).

A GMM run and a logistic run of the daemon (file sources: the daemon's loop, snapshots and
``history.jsonl`` as in any run); the logistic run is short, so its held-out series has one point.
"""
import io
import json

import numpy as np
import pytest

pytest.importorskip("matplotlib")
import matplotlib.pyplot as plt  # noqa: E402

from streamsvi.cli import main  # noqa: E402
from streamsvi.io.dense import JsonCodec  # noqa: E402
from streamsvi.service.config import validate  # noqa: E402
from streamsvi.service.daemon import Daemon  # noqa: E402
from streamsvi.service.history import is_classifier, read_history, report_figure  # noqa: E402

from .conftest import blob_rows, gmm_config  # noqa: E402
from .test_logistic import labelled_rows, logistic_config  # noqa: E402


def _gmm_run(tmp_path):
    data = tmp_path / "gmm.jsonl"
    data.write_bytes(b"".join(JsonCodec(2).encode(r) + b"\n" for r in blob_rows(1500, seed=1)))
    cfg = validate(gmm_config(tmp_path, name="gmm", source={"kind": "file", "path": str(data)},
                              metrics={"history_every": 4, "heldout_size": 50, "heldout_every": 5}))
    Daemon(cfg, out=io.StringIO()).run(until_drained=True)
    return tmp_path / "gmm"


def _logistic_run(tmp_path):
    data = tmp_path / "logistic.jsonl"
    data.write_text("".join(json.dumps({"x": r[:-1].tolist(), "y": int(r[-1])}) + "\n"
                            for r in labelled_rows(450, seed=1)))
    cfg = logistic_config(tmp_path, name="logistic", source={"kind": "file", "path": str(data)},
                          metrics={"heldout_size": 50, "heldout_every": 10})
    Daemon(validate(cfg), out=io.StringIO()).run(until_drained=True)
    return tmp_path / "logistic"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    return {"gmm": _gmm_run(tmp), "logistic": _logistic_run(tmp)}


def _visible(fig):
    return [ax for ax in fig.axes if ax.get_visible()]


def _series(ax):
    return {ln.get_label(): ln for ln in ax.lines if not ln.get_label().startswith("_")}


def test_a_classifier_run_writes_its_held_out_log_loss_and_accuracy(runs):
    rows = read_history(runs["logistic"])
    held = [r for r in rows if r.get("heldout_loglik") is not None]
    assert len(held) == 1, held                     # step 1 only: 400 records, batches of 100
    assert 0 < held[0]["heldout_log_loss"] < 2 and 0 <= held[0]["heldout_accuracy"] <= 1
    assert is_classifier(rows)
    assert not is_classifier(read_history(runs["gmm"]))


def test_the_report_of_a_gmm_and_a_logistic_run(runs):
    fig = report_figure({name: read_history(d) for name, d in runs.items()})
    try:
        axes = _visible(fig)
        titles = [ax.get_title() for ax in axes]
        assert len(axes) == 6, titles
        by_title = dict(zip(titles, axes))
        density = by_title["held-out log p(x) per record (nats)"]
        log_loss = next(ax for t, ax in by_title.items() if t.startswith("held-out log-loss"))
        accuracy = next(ax for t, ax in by_title.items() if t.startswith("held-out accuracy"))
        assert set(_series(density)) == {"gmm"}                  # each model in its own panel
        assert set(_series(log_loss)) == set(_series(accuracy)) == {"logistic"}
        for ax in axes:
            legend = ax.get_legend()
            assert legend is not None, ax.get_title()            # a legend on every panel
            assert [t.get_text() for t in legend.get_texts()] == list(_series(ax)), ax.get_title()
            for ln in ax.lines:
                assert ln.get_marker() not in (None, "", "None", " "), (ax.get_title(), ln.get_label())
                assert ln.get_markersize() > 0
        one = _series(log_loss)["logistic"]
        assert len(one.get_xdata()) == 1                         # one point, drawn as a marker
        assert _series(accuracy)["logistic"].get_ydata()[0] == pytest.approx(
            [r for r in read_history(runs["logistic"]) if r.get("heldout_accuracy") is not None][0]
            ["heldout_accuracy"])
    finally:
        plt.close(fig)


def test_a_density_run_alone_keeps_the_four_panels(runs):
    fig = report_figure({"gmm": read_history(runs["gmm"])})
    try:
        titles = [ax.get_title() for ax in _visible(fig)]
        assert len(titles) == 4 and "held-out log p(x) per record (nats)" in titles, titles
        assert not any("log-loss" in t or "accuracy" in t for t in titles)
        assert all(ax.get_legend() is not None for ax in _visible(fig))
    finally:
        plt.close(fig)


def test_a_classifier_alone_has_no_log_p_x_panel(runs):
    fig = report_figure({"logistic": read_history(runs["logistic"])})
    try:
        titles = [ax.get_title() for ax in _visible(fig)]
        assert len(titles) == 5, titles
        assert not any("log p(x)" in t for t in titles)
        for ax in _visible(fig):              # a panel without values says so, with no legend
            if ax.get_legend() is None:
                assert not _series(ax) and any("no values" in t.get_text() for t in ax.texts), ax.get_title()
    finally:
        plt.close(fig)


def test_the_report_command(runs, tmp_path, capsys):
    import matplotlib.image

    out = tmp_path / "report.png"
    assert main(["report", str(runs["gmm"]), str(runs["logistic"]), "--output", str(out)]) == 0
    assert np.asarray(matplotlib.image.imread(out)).shape[1] > 1000
    text = capsys.readouterr().out
    assert "gmm: " in text and "last held-out log p(x) " in text
    assert "logistic: " in text and "last held-out log-loss " in text and ", accuracy " in text
    # two runs whose directories have the same name need labels
    assert main(["report", str(runs["gmm"]), str(runs["gmm"]), "--output", str(out)]) == 2
    assert "same label" in capsys.readouterr().err
