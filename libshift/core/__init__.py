"""The native data path: a C11 core (shift_core.h) and its Cython face, _core.

Built by the package build (setup.py, from pyproject.toml's build requirements); docs/wire.md describes
its frames, docs/core.md its shape. libshift.providers.tcp.native is the provider that drives it.
"""
