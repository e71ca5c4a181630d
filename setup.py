"""Build the optional compiled LDA local step; everything else is in pyproject.toml.

Without a C compiler the extension is skipped (``optional=True``) and
streamsvi.models.lda runs its numpy kernel instead.
"""
import sys

from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "streamsvi.models._ldakernel", ["streamsvi/models/_ldakernel.c"],
    extra_compile_args=[] if sys.platform == "win32" else ["-O3", "-fopenmp-simd"],
    optional=True)])
