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
