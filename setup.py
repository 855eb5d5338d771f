"""The C core's extensions (libshift.core._core and _verbs); everything else is in pyproject.toml."""

from glob import glob

from Cython.Build import cythonize
from setuptools import Extension, setup

CORE = "libshift/core"
# the core's own C files; a leading _ is what Cython makes of a .pyx
sources = sorted(p for p in glob(f"{CORE}/*.c") if not p.rsplit("/", 1)[1].startswith("_"))
FLAGS = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-Wno-unused-function"]


def extension(name: str, files: list[str]) -> Extension:
    return Extension(
        f"libshift.core.{name}",
        sources=[f"{CORE}/{name}.pyx", *files],
        include_dirs=[CORE],
        define_macros=[("_GNU_SOURCE", None)],
        extra_compile_args=FLAGS,
    )


verbs = [p for p in sources if p.rsplit("/", 1)[1].startswith("verbs")]
fast = [p for p in sources if p.rsplit("/", 1)[1].startswith("fast")]  # the fast path: over either backend
# the tcp engine; the verbs backend is built against rdma-core's verbs.h but never linked to libibverbs
# (verbs_lib.c opens it at run time), so both import on a host without rdma-core
core = extension("_core", [p for p in sources if p not in verbs])
# the fast path's context lock is made by priority.c's sc_mutex_init, over either backend
extensions = [core, extension("_verbs", [*verbs, *fast, f"{CORE}/priority.c"])]
setup(ext_modules=cythonize(extensions, compiler_directives={"language_level": "3"}))
