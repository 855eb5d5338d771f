"""The C core's extension (libshift.core._core); everything else is in pyproject.toml."""

from glob import glob

from Cython.Build import cythonize
from setuptools import Extension, setup

CORE = "libshift/core"
core = Extension(
    "libshift.core._core",
    # the core's own C files; _core.c is what Cython makes of _core.pyx
    sources=[f"{CORE}/_core.pyx", *sorted(p for p in glob(f"{CORE}/*.c") if not p.endswith("/_core.c"))],
    include_dirs=[CORE],
    define_macros=[("_GNU_SOURCE", None)],
    extra_compile_args=["-std=c11", "-Wall", "-Wextra", "-Werror", "-Wno-unused-function"],
)

setup(ext_modules=cythonize([core], compiler_directives={"language_level": "3"}))
