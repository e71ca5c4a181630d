import re

import pytest

from streamsvi.cli import main

from tests._pima import pima_path


@pytest.mark.parametrize("data, low, high", [
    ([], -5, 10),        # the image segments from river's wheel: ELBO per record about 1 to 2
    (["--data"], -20, -5),  # the user's Pima file: ELBO per record on standardised Pima is about −9
], ids=["image-segments", "pima"])
def test_demo_prints_the_table(capsys, data, low, high):
    if data:
        data = data + [str(pima_path())]
    rc = main(["compare", "--inits", "1", "--epochs", "2", "--m", "50", *data])
    out = capsys.readouterr().out
    assert rc == 0
    assert re.search(r"on Pima Indians diabetes \(diabetes\.arff(\.gz)?; 768 x 8, standardised\)" if data
                     else r"on image segments \(UCI Statlog, bundled in river; 2310 x 14, standardised\)", out)
    for row in ("batch VI (CAVI)", "SVI |S|=200 ", "SVI+ |S|=200 M=50"):
        assert row in out
    line = next(ln for ln in out.splitlines() if ln.startswith("SVI+ |S|=200 M=50"))
    elbo = float(line.split()[3])
    assert low < elbo < high


def test_demo_rejects_bad_m(capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--m", "500"])
    assert "--m values must be in (0, --batch-size=200]" in capsys.readouterr().err


def test_demo_missing_data_file(capsys, tmp_path):
    assert main(["compare", "--data", str(tmp_path / "x.arff")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_compare_annealers_one_row_each_from_the_same_inits(capsys):
    rc = main(["compare", "--inits", "2", "--epochs", "3", "--annealers", "none,svi+,deterministic,stochastic"])
    out = capsys.readouterr().out
    assert rc == 0
    rows = {ln.split()[0]: float(ln.split()[-5]) for ln in out.splitlines()
            if ln.split() and ln.split()[0] in ("none", "svi+", "deterministic", "stochastic")}
    assert set(rows) == {"none", "svi+", "deterministic", "stochastic"}
    assert all(-10 < v < 10 for v in rows.values())
    # none is plain SVI: the same row as the default table's SVI row from the same inits
    main(["compare", "--inits", "2", "--epochs", "3", "--m", "50"])
    svi = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("SVI |S|=200 "))
    assert float(svi.split()[-5]) == rows["none"]


def test_compare_rejects_an_unknown_annealer(capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--annealers", "none,simulated"])
    assert "simulated unknown" in capsys.readouterr().err


def test_produce_pima_needs_a_file(capsys):
    """Pima is not shipped or downloaded: --dataset pima without --data is one line, exit 2."""
    assert main(["produce", "--topic", "t", "--bootstrap-servers", "127.0.0.1:9", "--dataset", "pima"]) == 2
    assert capsys.readouterr().err == ("streamsvi: error: --dataset pima needs --data PATH: your "
                                       "diabetes.arff (Weka) or pima-indians-diabetes.csv (UCI); "
                                       "streamsvi neither ships nor downloads it\n")
