"""A BLAS ``sgemm`` callable from compiled (numba) code: the kernel's layer matrices.

Two libraries are at hand in the engine core's process, both found by address, neither a new dependency:

- **MKL, inside torch** (``MKL``): PyTorch's x86 wheels link Intel's MKL into ``libtorch_cpu`` and export its
  Fortran ``SGEMM`` (no ``cblas_sgemm``) and ``MKL_Set_Num_Threads_Local``. It does a batch's ``[B, n] x [n, p]``
  products in 0.79-0.82 of OpenBLAS's time at 64-256 rows (the bundled model's four products a layer on an AVX-512
  Xeon, one thread: 1.16 against 1.41 us a row at 256 rows, 1.36 against 1.73 at 64; 0.91-0.98 at 4-28 rows),
  the whole kernel in 0.95-0.98 of it (``bench.kernel``'s BLAS table, ``bench/results/round_borrow.md``).
- **OpenBLAS, inside numpy** (``ILP64``, ``LP64``: its ``cblas_sgemm``'s integers): numpy's wheels carry it
  (``numpy.libs``, or ``numpy/.dylibs`` on macOS); two to three times faster than numba's loops at these sizes.

``find_sgemm`` picks the first it finds in that order on Intel's CPUs (or where the vendor cannot be read), and
OpenBLAS first on others: on 2 AMD EPYC (Zen 4) vCPUs MKL's ``sgemm`` runs its ``zen`` kernels, and the whole
kernel took 0.83-0.84 of MKL's time with OpenBLAS at 16 rows, 0.97-0.99 at 64-256
(``bench/results/round_row_parts.md``). ``AAREN_KERNEL_BLAS`` chooses otherwise: ``auto``, the default, ``mkl``,
``openblas``, or ``0`` for the kernel's own loops. It returns ``(address, kind, threads)``; the kernel passes
them to ``sgemm`` as arguments (not globals), so numba still caches the compiled kernel: an address is per
process, the machine code is not. Where neither is found (a torch without MKL, a numpy built against another BLAS)
the kernel keeps its own loops (kind ``NO_BLAS``).

**A row's bits whatever rows share its call.** The kernel computes a row from that row's inputs alone, and a
batch's rows in parts (``row_parts``) must give what one call gives. A BLAS may sum a row's products in another
order where its tiles fall otherwise: numpy's OpenBLAS does on an AMD EPYC Zen 3 (its ``Haswell`` kernels, which
valgrind also gets: 92 of 256 rows of a 64-wide model's features differed between one call and two of 128 rows);
on Zen 4 (``SkylakeX``) it passed ``tests/core/test_row_parts.py``, as MKL does on each. ``find_sgemm(shapes)``
with ``auto`` therefore takes the first library in its order whose products pass ``rows_exact`` on the model's own
matrix shapes (rows computed in windows of one call of 256, 4 to 255 rows at six offsets, against that call, bit
for bit); where none passes, the kernel's own loops, exact by construction. A library named in
``AAREN_KERNEL_BLAS`` is taken as named, unprobed.

Each product runs on its calling thread: a threaded product of this size would take the core gRPC needs, and where
the process has CPUs to spare a large batch's rows are cut into parts, each on its own thread (``row_parts``).
OpenBLAS is set to one thread once, in the process
(no one else calls numpy's OpenBLAS here); MKL, which torch's own operations share, is held to one thread around
each product only, on the calling thread (``threads``: the address of ``MKL_Set_Num_Threads_Local``, its previous
value given back after), so that torch's operations keep the threads the process gave them.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import logging
import os
from typing import Any

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from aaren.jit import compiled

__all__ = [
    "ILP64",
    "LP64",
    "MKL",
    "NO_BLAS",
    "PROBE_ROWS",
    "PROBE_WINDOWS",
    "auto_order",
    "available",
    "cpu_vendor",
    "find_sgemm",
    "product",
    "rows_exact",
    "sgemm",
]

_log = logging.getLogger(__name__)

#: what ``find_sgemm`` found: no BLAS, OpenBLAS's ``cblas_sgemm`` with 64-bit integers (numpy's) or 32-bit ones,
#: or MKL's Fortran ``SGEMM`` (32-bit integers, every argument by address)
NO_BLAS, ILP64, LP64, MKL = 0, 1, 2, 3
#: the choices of ``AAREN_KERNEL_BLAS``
CHOICES = ("auto", "mkl", "openblas", "0")
#: (symbol of cblas_sgemm, its integers, symbol that sets the threads), most likely first
_OPENBLAS_SYMBOLS = (
    ("scipy_cblas_sgemm64_", ILP64, "scipy_openblas_set_num_threads64_"),
    ("cblas_sgemm64_", ILP64, "openblas_set_num_threads64_"),
    ("cblas_sgemm", LP64, "openblas_set_num_threads"),
)
#: MKL's Fortran sgemm and its thread-local thread count (C interface: the count by value, the previous returned)
_MKL_SYMBOLS = ("SGEMM", "MKL_Set_Num_Threads_Local")
_ROW_MAJOR, _NO_TRANS = 101, 111

#: ``(auto, ((name, (address, kind, threads)), ...))``: whether ``AAREN_KERNEL_BLAS`` is ``auto``, and the libraries
#: it allows that were found, in its order (``find_sgemm``; None until first asked)
_found: tuple[bool, tuple[tuple[str, tuple[int, int, int]], ...]] | None = None
#: ``rows_exact``'s answers by library and shapes, as the process found them
_exact: dict[tuple[tuple[int, int, int], tuple[tuple[int, int], ...]], bool] = {}

#: rows of ``rows_exact``'s whole call (a kernel call's most: ``kernel.CHUNK``), and the windows of it computed
#: alone: lengths that fill a library's register tiles or leave each remainder, at offsets on and off a tile, from 4
#: rows (``kernel.BLOCK``: the kernel computes fewer by its own loops; MKL's products of 1-3 rows sum otherwise)
PROBE_ROWS = 256
PROBE_WINDOWS = tuple(
    (start, start + length)
    for start in (0, 1, 3, 64, 77, 128)
    for length in (4, 5, 8, 13, 16, 31, 64, 100, 128, 129, 200, 255)
    if start + length <= PROBE_ROWS
)


def _openblas_libraries() -> list[str]:
    """numpy's bundled BLAS libraries (OpenBLAS), if it has any."""
    root = os.path.dirname(np.__file__)
    places = (os.path.join(os.path.dirname(root), "numpy.libs"), os.path.join(root, ".dylibs"), root)
    return sorted({path for place in places for path in glob.glob(os.path.join(place, "*openblas*"))})


def _torch_libraries() -> list[str]:
    """torch's CPU library (``libtorch_cpu``), where torch is installed."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return []
    lib = os.path.join(next(iter(spec.submodule_search_locations)), "lib")
    return sorted(glob.glob(os.path.join(lib, "libtorch_cpu.*")) + glob.glob(os.path.join(lib, "torch_cpu.dll")))


def _open(path: str) -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(path)
    except OSError:
        return None


def _address(function: Any) -> int:
    return ctypes.cast(function, ctypes.c_void_p).value or 0


def cpu_vendor(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's vendor as Linux reads it (``vendor_id``: ``GenuineIntel``, ``AuthenticAMD``, ...); ``""`` where
    there is none to read (another OS, another architecture)."""
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as lines:
            for line in lines:
                if line.startswith("vendor_id"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return ""


def auto_order(vendor: str) -> tuple[str, ...]:
    """``AAREN_KERNEL_BLAS=auto``'s libraries, first found first: MKL first on Intel's CPUs and where the vendor is
    unknown, OpenBLAS first on others (the module docstring)."""
    return ("mkl", "openblas") if vendor in ("GenuineIntel", "") else ("openblas", "mkl")


def _find_mkl() -> tuple[int, int, int] | None:
    for path in _torch_libraries():
        library = _open(path)
        functions = [getattr(library, name, None) for name in _MKL_SYMBOLS] if library is not None else [None]
        if all(f is not None for f in functions):
            return _address(functions[0]), MKL, _address(functions[1])
    return None


def _find_openblas() -> tuple[int, int, int] | None:
    for path in _openblas_libraries():
        library = _open(path)
        if library is None:
            continue
        for name, kind, threads in _OPENBLAS_SYMBOLS:
            function = getattr(library, name, None)
            if function is None:
                continue
            set_threads = getattr(library, threads, None)
            if set_threads is not None:
                set_threads.argtypes = [ctypes.c_int64 if kind == ILP64 else ctypes.c_int]
                set_threads(1)
            return _address(function), kind, 0
    return None


def _candidates() -> tuple[bool, tuple[tuple[str, tuple[int, int, int]], ...]]:
    """``_found``, read from ``AAREN_KERNEL_BLAS`` and the libraries once a process."""
    global _found
    if _found is None:
        choice = os.environ.get("AAREN_KERNEL_BLAS", "auto").strip().lower() or "auto"
        if choice in ("1", "on"):  # what turned the BLAS on before there was a choice
            choice = "auto"
        if choice not in CHOICES:
            raise ValueError(f"AAREN_KERNEL_BLAS={choice!r}: expected one of {', '.join(CHOICES)}")
        openblas = _find_openblas()  # found whatever the choice: it sets numpy's OpenBLAS to one thread, process-wide
        found = {"mkl": _find_mkl, "openblas": lambda: openblas}
        order = {"auto": auto_order(cpu_vendor()), "mkl": ("mkl",), "openblas": ("openblas",)}.get(choice, ())
        _found = choice == "auto", tuple((name, got) for name in order if (got := found[name]()) is not None)
    return _found


def find_sgemm(shapes: tuple[tuple[int, int], ...] = ()) -> tuple[int, int, int]:
    """``(address, kind, threads)`` of the ``sgemm`` the kernel's layers use (the module docstring): MKL's (kind
    ``MKL``, ``threads`` the address of its thread-local thread count) or numpy's OpenBLAS's (``ILP64`` or ``LP64``,
    the library set to one thread; ``threads`` 0), as ``AAREN_KERNEL_BLAS`` (``auto``, ``mkl``, ``openblas``, ``0``)
    allows; ``(0, NO_BLAS, 0)`` where none is found or it is ``0``. With ``auto`` and the layers' ``shapes``
    (``(n, p)`` a product ``[B, n] x [n, p]``), the first whose rows are exact on them (``rows_exact``), else the
    kernel's loops. An unknown choice raises ``ValueError``."""
    auto, candidates = _candidates()
    for name, got in candidates:
        if not (auto and shapes) or rows_exact(got, shapes):
            return got
        _log.info(
            "kernel BLAS: %s sums a row's products otherwise where other rows share its call (shapes %s); "
            "not taken (AAREN_KERNEL_BLAS=%s takes it)",
            name,
            list(shapes),
            name,
        )
    return 0, NO_BLAS, 0


@compiled
def product(blas: tuple, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> None:
    """``c[:m] += a @ b`` by ``sgemm`` (its shapes and layout rules) from Python: a probe's or a test's call."""
    sgemm(blas, a, b, c)


def rows_exact(blas: tuple[int, int, int], shapes: tuple[tuple[int, int], ...], seed: int = 0) -> bool:
    """Whether ``blas`` gives a row of ``[B, n] x [n, p]`` (for each ``(n, p)`` of ``shapes``) the same bits
    whatever rows share its call: the rows of ``PROBE_WINDOWS``, each window its own call, against one call over
    ``PROBE_ROWS`` rows, bias rows added alike (random float32). The kernel's loops (``NO_BLAS``) are, by
    construction. Once a process for a library and shapes (a few milliseconds)."""
    key = (blas, tuple(shapes))
    if blas[1] == NO_BLAS:
        return True
    if key not in _exact:
        _exact[key] = _windows_match(blas, shapes, np.random.default_rng(seed))
    return _exact[key]


def _windows_match(blas: tuple[int, int, int], shapes: tuple[tuple[int, int], ...], rng: np.random.Generator) -> bool:
    """``rows_exact``'s check, to the first window that differs."""
    for n, p in shapes:
        a = rng.standard_normal((PROBE_ROWS, n), dtype=np.float32)
        b = rng.standard_normal((n, p), dtype=np.float32)
        bias = rng.standard_normal(p, dtype=np.float32)
        whole = np.tile(bias, (PROBE_ROWS, 1))
        product(blas, a, b, whole)
        for start, stop in PROBE_WINDOWS:
            window = np.tile(bias, (stop - start, 1))
            product(blas, a[start:stop], b, window)
            if not np.array_equal(window, whole[start:stop]):
                return False
    return True


def available() -> dict[str, tuple[int, int, int]]:
    """Every ``(address, kind, threads)`` found here by name (``mkl``, ``openblas``; ``loops``: the kernel's own,
    always), whatever ``AAREN_KERNEL_BLAS`` says: for a benchmark that times them side by side."""
    found = {"mkl": _find_mkl(), "openblas": _find_openblas(), "loops": (0, NO_BLAS, 0)}
    return {name: got for name, got in found.items() if got is not None}


@intrinsic
def sgemm(typingctx: Any, blas: Any, a: Any, b: Any, c: Any) -> Any:
    """``c[:m] = a @ b + c[:m]`` (float32, row-major, every array C-contiguous: ``a [m, n]``, ``b [n, p]``,
    ``c [m', p]`` with ``m' >= m``) through the ``sgemm`` of ``blas = (address, kind, threads)`` (``find_sgemm``):
    ``c`` holds the bias rows, added to each finished sum (``beta = 1``: nothing is scaled or zeroed first). MKL's
    Fortran (column-major) ``SGEMM`` computes the same product transposed, ``c^T = b^T a^T``, on one thread. The
    caller checks the shapes; kind ``NO_BLAS`` must not reach here."""
    if not all(
        isinstance(t, types.Array) and t.dtype == types.float32 and t.ndim == 2 and t.layout == "C" for t in (a, b, c)
    ):
        return None
    if not (isinstance(blas, types.UniTuple) and blas.count == 3 and isinstance(blas.dtype, types.Integer)):
        return None
    signature = types.void(blas, a, b, c)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        blas_v, a_v, b_v, c_v = args
        address_v, kind_v, threads_v = (
            builder.sext(builder.extract_value(blas_v, i), ir.IntType(64))
            if blas.dtype.bitwidth < 64
            else builder.extract_value(blas_v, i)
            for i in range(3)
        )
        f32, i32, i64, i8 = ir.FloatType(), ir.IntType(32), ir.IntType(64), ir.IntType(8)
        f32p = ir.PointerType(f32)
        given = zip(sig.args[1:], (a_v, b_v, c_v), strict=True)
        arrays = [context.make_array(t)(context, builder, v) for t, v in given]
        a_p, b_p, c_p = (builder.bitcast(arr.data, f32p) for arr in arrays)
        m, n = (builder.extract_value(arrays[0].shape, i) for i in (0, 1))
        p = builder.extract_value(arrays[1].shape, 1)
        one = ir.Constant(f32, 1.0)
        is_mkl = builder.icmp_signed("==", kind_v, ir.Constant(i64, MKL))
        with builder.if_else(is_mkl) as (mkl, openblas):
            with mkl:
                # SGEMM(transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc), column-major, all by address:
                # the row-major c [m, p] is the column-major c^T [p, m] = b^T [p, n] a^T [n, m]
                no_trans = cgutils.alloca_once_value(builder, ir.Constant(i8, ord("N")))
                p_r, m_r, n_r = (cgutils.alloca_once_value(builder, builder.trunc(v, i32)) for v in (p, m, n))
                one_r = cgutils.alloca_once_value(builder, one)
                i8p, i32p = ir.PointerType(i8), ir.PointerType(i32)
                arg_types = [i8p, i8p, i32p, i32p, i32p, f32p, f32p, i32p, f32p, i32p, f32p, f32p, i32p]
                function = builder.inttoptr(address_v, ir.FunctionType(ir.VoidType(), arg_types).as_pointer())
                set_threads = builder.inttoptr(threads_v, ir.FunctionType(i32, [i32]).as_pointer())
                before = builder.call(set_threads, [ir.Constant(i32, 1)])
                builder.call(function, [no_trans, no_trans, p_r, m_r, n_r, one_r, b_p, p_r, a_p, n_r, one_r, c_p, p_r])
                builder.call(set_threads, [before])
            with openblas:
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
                            function = builder.inttoptr(
                                address_v, ir.FunctionType(ir.VoidType(), arg_types).as_pointer()
                            )
                            builder.call(function, [*enums, *ints, one, a_p, lda, b_p, ldb, one, c_p, ldc])
        return context.get_dummy_value()

    return signature, codegen
