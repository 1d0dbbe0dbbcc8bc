"""Finds bitroll_kernels_ext, the compiled kernels module (python/ext/kernels_ext.cc).

From the build tree it sits beside the bitroll package (PYTHONPATH=<build>/python); a pip
install with BITROLL_KERNELS_EXT set (python/setup.py) puts it inside bitroll/torch. When it is
missing, importing bitroll.torch raises ImportError saying how to build it.
"""

try:
    from . import bitroll_kernels_ext as ext  # noqa: F401  (pip install)
except ImportError:
    try:
        import bitroll_kernels_ext as ext  # noqa: F401  (build tree)
    except ImportError as e:  # pragma: no cover - depends on the build
        raise ImportError(
            "bitroll.torch needs the compiled module bitroll_kernels_ext: build the CMake "
            "target bitroll_kernels_ext (needs Debian's pybind11-dev) and put <build>/python "
            "on PYTHONPATH, or pip install ./python with BITROLL_KERNELS_EXT=<the built "
            f"module> ({e})") from e
