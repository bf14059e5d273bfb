"""numpy's own BLAS ``sgemm``, callable from compiled (numba) code: the kernel's layer matrices.

numpy's wheels carry OpenBLAS (``numpy.libs``, or ``numpy/.dylibs`` on macOS); its ``cblas_sgemm`` does a
batch's ``[B, n] x [n, p]`` product two to three times faster than numba's loops at these sizes (a
register-blocked kernel for the machine, chosen at load). ``find_sgemm`` finds it and returns its address;
the kernel passes that address to ``sgemm`` as an argument (not a global), so numba still caches the
compiled kernel: an address is per process, the machine code is not. Where numpy carries no OpenBLAS (a
build against another BLAS), ``find_sgemm`` says so (kind ``NO_BLAS``) and the kernel keeps its own loops.

OpenBLAS is set to one thread in a process that uses it here: the engine core runs batches on one core
(as torch's ``torch_threads`` does), and a threaded product of this size would take the core gRPC needs.
"""

from __future__ import annotations

import ctypes
import glob
import os
from typing import Any

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

__all__ = ["ILP64", "LP64", "NO_BLAS", "find_sgemm", "sgemm"]

#: what ``find_sgemm`` found: no BLAS, a ``cblas_sgemm`` with 64-bit integers (numpy's OpenBLAS), or 32-bit ones
NO_BLAS, ILP64, LP64 = 0, 1, 2
#: (symbol of cblas_sgemm, its integers, symbol that sets the threads), most likely first
_SYMBOLS = (
    ("scipy_cblas_sgemm64_", ILP64, "scipy_openblas_set_num_threads64_"),
    ("cblas_sgemm64_", ILP64, "openblas_set_num_threads64_"),
    ("cblas_sgemm", LP64, "openblas_set_num_threads"),
)
_ROW_MAJOR, _NO_TRANS = 101, 111

_found: tuple[int, int] | None = None


def _libraries() -> list[str]:
    """numpy's bundled BLAS libraries (OpenBLAS), if it has any."""
    root = os.path.dirname(np.__file__)
    places = (os.path.join(os.path.dirname(root), "numpy.libs"), os.path.join(root, ".dylibs"), root)
    return sorted({path for place in places for path in glob.glob(os.path.join(place, "*openblas*"))})


def find_sgemm() -> tuple[int, int]:
    """``(address, kind)`` of numpy's ``cblas_sgemm`` (kind ``ILP64`` or ``LP64``; ``(0, NO_BLAS)`` where
    there is none), its library set to one thread. ``AAREN_KERNEL_BLAS=0`` turns it off."""
    global _found
    if _found is None:
        _found = (0, NO_BLAS)
        if os.environ.get("AAREN_KERNEL_BLAS", "1") != "0":
            for path in _libraries():
                try:
                    library = ctypes.CDLL(path)
                except OSError:
                    continue
                for name, kind, threads in _SYMBOLS:
                    function = getattr(library, name, None)
                    if function is None:
                        continue
                    set_threads = getattr(library, threads, None)
                    if set_threads is not None:
                        set_threads.argtypes = [ctypes.c_int64 if kind == ILP64 else ctypes.c_int]
                        set_threads(1)
                    _found = (ctypes.cast(function, ctypes.c_void_p).value or 0, kind)
                    break
                if _found[1] != NO_BLAS:
                    break
    return _found


@intrinsic
def sgemm(typingctx: Any, address: Any, kind: Any, a: Any, b: Any, c: Any) -> Any:
    """``c[:m] = a @ b + c[:m]`` (float32, row-major, every array C-contiguous: ``a [m, n]``, ``b [n, p]``,
    ``c [m', p]`` with ``m' >= m``) through the ``cblas_sgemm`` at ``address`` (``find_sgemm``; ``kind`` its
    integers): ``c`` holds the bias rows, added to each finished sum (``beta = 1``: nothing is scaled or
    zeroed first). The caller checks the shapes; ``kind`` ``NO_BLAS`` must not reach here."""
    if not all(
        isinstance(t, types.Array) and t.dtype == types.float32 and t.ndim == 2 and t.layout == "C" for t in (a, b, c)
    ):
        return None
    signature = types.void(types.int64, types.int64, a, b, c)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        address_v, kind_v, a_v, b_v, c_v = args
        f32, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
        f32p = ir.PointerType(f32)
        given = zip(sig.args[2:], (a_v, b_v, c_v), strict=True)
        arrays = [context.make_array(t)(context, builder, v) for t, v in given]
        pointers = [builder.bitcast(arr.data, f32p) for arr in arrays]
        m, n = (builder.extract_value(arrays[0].shape, i) for i in (0, 1))
        p = builder.extract_value(arrays[1].shape, 1)
        one = ir.Constant(f32, 1.0)
        enums = [ir.Constant(i32, v) for v in (_ROW_MAJOR, _NO_TRANS, _NO_TRANS)]
        is_ilp64 = builder.icmp_signed("==", kind_v, ir.Constant(i64, ILP64))
        with builder.if_else(is_ilp64) as (wide, narrow):
            for block, int_type in ((wide, i64), (narrow, i32)):
                with block:
                    ints = [m, p, n] if int_type is i64 else [builder.trunc(v, i32) for v in (m, p, n)]
                    lda, ldb, ldc = ints[2], ints[1], ints[1]
                    # cblas_sgemm(order, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)
                    matrix = [f32p, int_type]  # a pointer and its leading dimension
                    arg_types = [i32, i32, i32, *[int_type] * 3, f32, *matrix, *matrix, f32, *matrix]
                    function = builder.inttoptr(address_v, ir.FunctionType(ir.VoidType(), arg_types).as_pointer())
                    a_p, b_p, c_p = pointers
                    builder.call(function, [*enums, *ints, one, a_p, lda, b_p, ldb, one, c_p, ldc])
        return context.get_dummy_value()

    return signature, codegen
