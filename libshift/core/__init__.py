"""The native data path: a C11 core (shift_core.h) and its Cython face, _core.

Built by the package build (setup.py, from pyproject.toml's build requirements); docs/wire.md describes
its frames, docs/core.md its shape. libshift.providers.tcp is the provider that drives it;
wire.py hands its frame format to what speaks it from outside (a fuzzer, a tc filter).
"""
