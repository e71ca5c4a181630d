from streamsvi.cli import main


def test_demo_prints_the_table(capsys):
    rc = main(["compare", "--inits", "1", "--epochs", "2", "--m", "50"])
    out = capsys.readouterr().out
    assert rc == 0
    for row in ("batch VI (CAVI)", "SVI |S|=200 ", "SVI+ |S|=200 M=50"):
        assert row in out
    line = next(ln for ln in out.splitlines() if ln.startswith("SVI+ |S|=200 M=50"))
    elbo = float(line.split()[3])
    assert -20 < elbo < -5          # ELBO per record on standardised Pima is about −9


def test_demo_rejects_bad_m(capsys):
    import pytest
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
    assert all(-20 < v < -5 for v in rows.values())
    # none is plain SVI: the same row as the default table's SVI row from the same inits
    main(["compare", "--inits", "2", "--epochs", "3", "--m", "50"])
    svi = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("SVI |S|=200 "))
    assert float(svi.split()[-5]) == rows["none"]


def test_compare_rejects_an_unknown_annealer(capsys):
    import pytest
    with pytest.raises(SystemExit):
        main(["compare", "--annealers", "none,simulated"])
    assert "simulated unknown" in capsys.readouterr().err
