"""One OpenBLAS thread around the gemm kernel's BLAS calls.

Note [One BLAS thread]
The Numba gemm kernel's np.dot (a call into SciPy's OpenBLAS) splits even a 64x192x64 chunk
product, or the 1-row product that sums a bias gradient, over OpenBLAS's threads. When
another thread holds a core (another process, pytest -n 2, torch's OpenMP threads spinning
after a CPU op) OpenBLAS's threads wait milliseconds for one: on 2 cores with two busy
processes a 64x64x192 mm took 16 ms instead of 47 us, and a small transformer's training
step 90-170 ms instead of 9-19 ms, nearly all of it in such products. That kernel takes
products below 128^3 multiply-adds (larger ones go to torch's MKL, which keeps its threads)
and single-row ones, which one thread computes in microseconds: so SciPy's OpenBLAS runs
them with one thread, and gets its own count back after each. (OpenBLAS's thread-local
setter, `openblas_set_num_threads_local`, did not help: measured, the threads still
split the work.) A SciPy call on another thread during the product would also get one
thread. Where the setter is missing (another BLAS, not Linux) this does nothing.
"""
from __future__ import annotations

import ctypes

_UNSET = object()
_calls = _UNSET  # (get, set) of the thread count, or None where there are none
_NAMES = (("scipy_openblas_get_num_threads", "scipy_openblas_set_num_threads"),  # scipy-openblas32
          ("openblas_get_num_threads", "openblas_set_num_threads"))  # older SciPy wheels


def _find():
    """The thread-count getter and setter of SciPy's OpenBLAS, or None."""
    try:
        import scipy.linalg.cython_blas  # noqa: F401  (maps the library np.dot calls)
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps
                     if "openblas" in line and "scipy" in line and ".so" in line}
    except (ImportError, OSError):
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for get, set_ in _NAMES:
            if hasattr(lib, get) and hasattr(lib, set_):
                getter, setter = getattr(lib, get), getattr(lib, set_)
                getter.restype, getter.argtypes = ctypes.c_int, ()
                setter.restype, setter.argtypes = None, (ctypes.c_int,)
                return getter, setter
    return None


def limit(threads: int) -> int | None:
    """Let OpenBLAS calls use `threads` threads; the count to `restore` after, or None where
    nothing changed (it was `threads` already, or the count cannot be set)."""
    global _calls
    if _calls is _UNSET:
        _calls = _find()
    if _calls is None:
        return None
    previous = _calls[0]()
    if previous == threads:
        return None
    _calls[1](threads)
    return previous


def restore(previous: int | None) -> None:
    if previous is not None:
        _calls[1](previous)
