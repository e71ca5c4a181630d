"""Pima Indians diabetes for the tests, from Debian's ``weka`` package.

streamsvi neither ships nor downloads Pima (a user passes their own file to
``streamsvi demo --data``); the tests that need the real file get Weka's
``examples/diabetes.arff`` here: the cached copy, an installed weka, else
``apt-get download weka`` once into the cache
(:func:`streamsvi.datasets.cache_dir`). ``bench/_common.py`` does the same for
the benchmarks.
"""
from pathlib import Path

from streamsvi import datasets

WEKA_MEMBER = "usr/share/doc/weka/examples/diabetes.arff"


def pima_path() -> Path:
    """Where Weka's ``diabetes.arff`` is, fetching it into the cache if needed."""
    cached = datasets.cache_dir() / "diabetes.arff"
    if cached.exists():
        return cached
    for installed in (Path("/") / WEKA_MEMBER, Path("/") / (WEKA_MEMBER + ".gz")):
        if installed.exists():
            return installed
    return datasets._apt_fetch_member("weka", WEKA_MEMBER, cached, "Pima Indians diabetes")


def load_pima():
    """``streamsvi.datasets.load_pima`` of :func:`pima_path`: X (768, 8), y (768,)."""
    return datasets.load_pima(pima_path())
