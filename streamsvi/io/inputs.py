"""What ``streamsvi produce`` writes: a user's file of records, or a built-in sample.

Both give a *part* of a record kind (:mod:`streamsvi.io.records`) for a model,
and a phrase saying what it is (for the command's output line). The model is
only asked for what its record kind's codecs ask too: ``n_features``,
``n_classes`` (labelled), ``n_symbols`` (sequences).

Files, in the usual format of each kind (:func:`read_records`):

==============  =============================================================
``dense``       CSV of numbers, one record per line (a header line is skipped)
``labelled``    CSV, the label in the last column or the one named by
                ``label_column`` (then the first line is a header); integer
                labels are the classes, names are numbered in sorted order
``bow``         LDA-C: ``N id:count id:count ...`` per document
``ratings``     ``user item rating`` per line: tab-separated (GroupLens
                ``u.data``, RecBole ``.inter``), or a ``.csv`` with the header
                ``userId,movieId,rating`` (GroupLens ``ratings.csv``)
``sequences``   one sequence per line, integer symbols separated by spaces or
                commas
==============  =============================================================

Built-in samples (:func:`sample_records`), offline: river's bundled
``Phishing`` (2 classes, 9 features) and ``ImageSegments`` (7 classes, 18
features) for labelled records; synthetic data for the other kinds (Gaussian
blobs, Poisson counts, an LDA corpus, low-rank ratings, HMM sequences), each
shaped to the model.

Examples
--------
>>> class Model:
...     n_features = 2
>>> recs = sample_records("dense", Model(), n=100)
>>> recs.part.shape, recs.what
((100, 2), 'synthetic blobs: 100 records of 2 numbers from 4 Gaussian clusters')
"""
from __future__ import annotations

import csv
import os
import re
from pathlib import Path
from typing import NamedTuple

import numpy as np

__all__ = ["Records", "read_records", "sample_records", "FILE_FORMATS"]

#: record kind -> the file format :func:`read_records` reads (for help texts and messages)
FILE_FORMATS = {
    "dense": "CSV of numbers, one record per line",
    "labelled": "CSV of numbers with the label in the last column (or --label-column NAME)",
    "bow": "LDA-C lines 'N id:count id:count ...'",
    "ratings": "'user item rating' lines, tab-separated, or a .csv with the header userId,movieId,rating",
    "sequences": "one sequence of integer symbols per line",
}


class Records(NamedTuple):
    """Records of one kind and what they are."""

    #: a part of the record kind (its codecs' ``encode_rows`` takes it)
    part: object
    #: what they are, e.g. ``"river's Phishing: 1250 records, 9 features, 2 classes"``
    what: str


# ---------------------------------------------------------------------------- files

def _text_lines(path) -> list[tuple[int, str]]:
    """``(line number, stripped line)`` of the non-empty lines that are not ``#`` comments."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not a UTF-8 text file ({exc.reason} at byte {exc.start})") from None
    return [(i, ln.strip()) for i, ln in enumerate(text.splitlines(), 1)
            if ln.strip() and not ln.lstrip().startswith("#")]


def _numbers(cells, path, line) -> list[float]:
    try:
        return [float(c) for c in cells]
    except ValueError:
        bad = next(c for c in cells if not _is_number(c))
        raise ValueError(f"{path}, line {line}: {bad.strip()!r} is not a number") from None


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _csv_rows(path) -> list[tuple[int, list[str]]]:
    rows = [(i, next(csv.reader([ln]))) for i, ln in _text_lines(path)]
    if not rows:
        raise ValueError(f"{path}: no records (empty, or only comment lines)")
    return rows


def _read_dense(path, model) -> Records:
    D = model.n_features
    rows = _csv_rows(path)
    if not any(_is_number(c) for c in rows[0][1]):           # a header line: no number in it
        rows = rows[1:]
    X = []
    for line, cells in rows:
        if len(cells) != D:
            raise ValueError(f"{path}, line {line}: {len(cells)} values, expected {D} (the model's "
                             f"n_features), comma-separated")
        X.append(_numbers(cells, path, line))
    if not X:
        raise ValueError(f"{path}: a header line and no records")
    return Records(np.array(X, dtype=np.float64), f"{len(X)} records of {D} numbers from {path}")


def _read_labelled(path, model, label_column: str | None) -> Records:
    D, C = model.n_features, model.n_classes
    rows = _csv_rows(path)
    header = None
    if label_column is not None or not any(_is_number(c) for c in rows[0][1]):
        header, rows = [c.strip() for c in rows[0][1]], rows[1:]
    col = -1
    if label_column is not None:
        if label_column not in header:
            raise ValueError(f"{path}: no column {label_column!r} in the header line; it has "
                             f"{', '.join(header)}")
        col = header.index(label_column)
    feats, labels = [], []
    for line, cells in rows:
        if len(cells) != D + 1:
            raise ValueError(f"{path}, line {line}: {len(cells)} values, expected {D + 1} (the model's "
                             f"n_features = {D} and a label), comma-separated")
        y = cells.pop(col).strip()
        feats.append(_numbers(cells, path, line))
        labels.append(y)
    if not feats:
        raise ValueError(f"{path}: a header line and no records")
    if all(re.fullmatch(r"[+-]?\d+(\.0*)?", y) for y in labels):
        y = np.array([float(v) for v in labels])
        bad = np.flatnonzero((y < 0) | (y >= C))
        if bad.size:
            raise ValueError(f"{path}, record {bad[0] + 1}: label {labels[bad[0]]} is not one of the "
                             f"model's classes 0..{C - 1}")
        names = ""
    else:
        classes = sorted(set(labels))
        if len(classes) > C:
            raise ValueError(f"{path}: {len(classes)} distinct labels ({', '.join(classes[:10])}"
                             f"{', ...' if len(classes) > 10 else ''}), the model has n_classes = {C}")
        y = np.array([classes.index(v) for v in labels], dtype=np.float64)
        names = ", classes " + ", ".join(f"{c}={i}" for i, c in enumerate(classes))
    X = np.column_stack([np.array(feats, dtype=np.float64), y])
    return Records(X, f"{len(X)} records of {D} features and a label from {path}{names}")


def _read_bow(path, model) -> Records:
    from ..datasets import load_ldac

    V = model.n_features
    X, _ = load_ldac(path)
    if X.shape[1] > V:
        raise ValueError(f"{path}: word id {X.shape[1] - 1} is not below the model's n_features "
                         f"V = {V}")
    import scipy.sparse as sp

    X = sp.csr_matrix((X.data, X.indices, X.indptr), shape=(X.shape[0], V))
    return Records(X, f"{X.shape[0]} documents from {path}")


def _read_ratings(path) -> Records:
    from ..datasets import load_ratings_csv, load_ratings_tsv

    if str(path).lower().endswith(".csv"):
        x = load_ratings_csv(path)[0]
    else:
        x = load_ratings_tsv(path)
    if len(x) == 0:
        raise ValueError(f"{path}: no ratings")
    return Records(x, f"{len(x)} ratings from {path}")


def _read_sequences(path) -> Records:
    from ..sequence_batch import Sequences

    seqs = []
    for line, text in _text_lines(path):
        cells = [c for c in re.split(r"[\s,]+", text) if c]
        try:
            seqs.append([int(c) for c in cells])
        except ValueError:
            bad = next(c for c in cells if not re.fullmatch(r"[+-]?\d+", c))
            raise ValueError(f"{path}, line {line}: {bad!r} is not an integer symbol") from None
    if not seqs:
        raise ValueError(f"{path}: no sequences (empty, or only comment lines)")
    return Records(Sequences.from_list(seqs), f"{len(seqs)} sequences from {path}")


def read_records(kind: str, path, model, label_column: str | None = None) -> Records:
    """The records of the file ``path``, in the usual format of record kind ``kind``.

    Parameters
    ----------
    kind : str
        A record kind's name (:data:`FILE_FORMATS` lists the formats).
    path : str or path-like
        The file.
    model
        What the records are for: its ``n_features`` (dense, labelled, bow)
        and ``n_classes`` (labelled) are checked.
    label_column : str, optional
        Labelled records: the header name of the label's column (default:
        the last column).

    Returns
    -------
    Records

    Raises
    ------
    ValueError
        A file that is not in the format, naming the line; a kind without a
        file format; ``label_column`` for another kind.
    """
    if not os.path.isfile(path):
        raise ValueError(f"{path}: no such file")
    if label_column is not None and kind != "labelled":
        raise ValueError(f"a label column is for labelled records; these are {kind!r} records")
    if kind == "dense":
        return _read_dense(path, model)
    if kind == "labelled":
        return _read_labelled(path, model, label_column)
    if kind == "bow":
        return _read_bow(path, model)
    if kind == "ratings":
        return _read_ratings(path)
    if kind == "sequences":
        return _read_sequences(path)
    raise ValueError(f"no file format for {kind!r} records; formats exist for {', '.join(FILE_FORMATS)}")


# ---------------------------------------------------------------------------- samples

def _blobs(model, n, rng) -> Records:
    from ..datasets import make_blobs

    D = model.n_features
    if D == 2:
        X = make_blobs(n, seed=int(rng.integers(2**31)))[0]       # the benchmarks' layout
    else:
        centers = rng.normal(0.0, 4.0, size=(4, D))
        X = make_blobs(n, centers=centers, seed=int(rng.integers(2**31)))[0]
    return Records(X, f"synthetic blobs: {n} records of {D} number{'s' if D != 1 else ''} from 4 Gaussian "
                      f"clusters")


def _counts(model, n, rng) -> Records:
    D, K = model.n_features, 3
    rates = rng.gamma(2.0, 5.0, size=(K, D))
    z = rng.integers(K, size=n)
    X = rng.poisson(rates[z]).astype(np.float64)
    return Records(X, f"synthetic Poisson counts: {n} records of {D} count{'s' if D != 1 else ''} from {K} "
                      f"components")


def _river_labelled(name: str, standardise: bool) -> tuple[np.ndarray, list]:
    from river import datasets

    X, y = [], []
    for x, label in getattr(datasets, name)():
        X.append([float(v) for v in x.values()])
        y.append(label)
    X = np.array(X)
    if standardise:
        from ..datasets import standardize

        X = standardize(X)
    return X, y


#: (n_features, n_classes) -> river's bundled data set of that shape, standardised or not
_LABELLED = {(9, 2): ("Phishing", False), (18, 7): ("ImageSegments", True)}


def _labelled(model, n, rng) -> Records:
    D, C = model.n_features, model.n_classes
    if (D, C) not in _LABELLED:
        have = "; ".join(f"river's {name}: {d} features, {c} classes"
                         for (d, c), (name, _) in _LABELLED.items())
        raise ValueError(f"no built-in labelled sample has {D} features and {C} classes ({have}); "
                         f"give your own records with --file")
    name, standardise = _LABELLED[(D, C)]
    X, labels = _river_labelled(name, standardise)
    if C == 2:
        y = np.array([float(bool(v)) for v in labels])
        classes = ", label 1 = phishing" if name == "Phishing" else ""
    else:
        names = sorted(set(labels))
        y = np.array([names.index(v) for v in labels], dtype=np.float64)
        classes = ", classes " + ", ".join(f"{c}={i}" for i, c in enumerate(names))
    return Records(np.column_stack([X, y]),
                   f"river's {name}: {len(y)} records of {D} features"
                   f"{' (standardised)' if standardise else ''}{classes}")


def _bow(model, n, rng) -> Records:
    from ..datasets import make_lda_corpus

    V, K = model.n_features, 10
    X = make_lda_corpus(n_docs=n, n_topics=K, n_words=V, doc_length=60, alpha=0.1, eta=0.05,
                        seed=int(rng.integers(2**31)))[0]
    return Records(X, f"synthetic LDA corpus: {n} documents over {V} words from {K} topics")


def _ratings(model, n, rng, rating_range) -> Records:
    from ..ratings_batch import Ratings

    lo, hi = rating_range
    n_users, n_items, d = 400, 250, 3
    U = rng.normal(0.0, 0.8, size=(n_users, d))
    W = rng.normal(0.0, 0.8, size=(n_items, d))
    pairs = rng.choice(n_users * n_items, size=min(n, n_users * n_items), replace=False)
    u, i = np.divmod(pairs, n_items)
    mid = (lo + hi) / 2
    r = np.clip(np.round(mid + (U[u] * W[i]).sum(axis=1) + rng.normal(0.0, 0.5, len(u))), lo, hi)
    x = Ratings(np.array([f"u{k}" for k in u], dtype=object), np.array([f"i{k}" for k in i], dtype=object),
                r, _canonical=True)
    return Records(x, f"synthetic ratings: {len(x)} whole-number ratings {lo:g}-{hi:g} by {n_users} users "
                      f"of {n_items} items")


def _sequences(model, n, rng) -> Records:
    from ..sequence_batch import Sequences

    V, K = model.n_symbols, 3
    A = np.full((K, K), 0.1 / (K - 1)) + np.eye(K) * (0.9 - 0.1 / (K - 1))   # sticky states
    B = rng.dirichlet(np.full(V, 0.5), size=K)
    cum_a = np.cumsum(A, axis=1)
    lengths = rng.integers(20, 81, size=n)
    seqs = []
    for T in lengths:
        z = np.empty(T, dtype=np.int64)
        z[0] = rng.integers(K)
        u = rng.random(T)
        for t in range(1, T):
            z[t] = min(int(np.searchsorted(cum_a[z[t - 1]], u[t])), K - 1)
        cum = np.cumsum(B[z], axis=1)
        seqs.append(np.minimum((cum < rng.random((T, 1))).sum(axis=1), V - 1))
    return Records(Sequences.from_list(seqs),
                   f"synthetic HMM sequences: {n} sequences of 20-80 symbols 0..{V - 1} from {K} hidden states")


#: record kind (and "counts") -> (sample, default size)
_SAMPLES = {"dense": (_blobs, 5000), "counts": (_counts, 3000), "labelled": (_labelled, None),
            "bow": (_bow, 2000), "ratings": (_ratings, 10000), "sequences": (_sequences, 1000)}


def sample_records(kind: str, model, *, counts: bool = False, rating_range=(1.0, 5.0), n: int | None = None,
                   seed: int = 0) -> Records:
    """A built-in sample of record kind ``kind`` shaped to ``model`` (no download).

    Parameters
    ----------
    kind : str
        ``dense``, ``labelled``, ``bow``, ``ratings`` or ``sequences``.
    model
        Gives the shape: ``n_features``; ``n_classes`` (labelled);
        ``n_symbols`` (sequences).
    counts : bool
        Dense records that are counts (integers >= 0, e.g. for a Poisson
        mixture) instead of real numbers.
    rating_range : (float, float)
        Ratings: the lowest and highest whole-number rating.
    n : int, optional
        How many records of a synthetic sample (defaults: 5000 dense rows,
        3000 count rows, 2000 documents, 10000 ratings, 1000 sequences).
        river's data sets are used whole.
    seed : int
        Seeds the synthetic samples.

    Returns
    -------
    Records

    Raises
    ------
    ValueError
        An unknown kind, or labelled records of a shape no bundled data set has.
    """
    key = "counts" if counts and kind == "dense" else kind
    if key not in _SAMPLES:
        raise ValueError(f"no built-in sample of {kind!r} records; samples exist for "
                         f"{', '.join(k for k in _SAMPLES if k != 'counts')}")
    make, default_n = _SAMPLES[key]
    rng = np.random.default_rng(seed)
    n = default_n if n is None else int(n)
    if key == "ratings":
        return make(model, n, rng, rating_range)
    return make(model, n, rng)
