"""``borrowed``: a view of an array that holds no reference, for the kernel's per-row calls (numba).

numba counts the references of every array it passes around: each assignment of an array to a variable, each
argument a compiled function receives and each function inlined into its caller (``inline="always"``: its
arguments become variables) adds one to the array's count and takes it back when the variable dies, by an atomic
add on the array's ``meminfo`` (``NRT_incref`` / ``NRT_decref``). LLVM's reference-count pruning removes the pairs
that meet in one block, not those around a loop or a branch. The gap summaries of one row (``kernel._gap_row``, its
inlined steps and their ``special.phi_many`` calls) took 34 such pairs a row: 11 % of the kernel's time at 256
rows a call on an AVX-512 Xeon (``perf``, ``bench/results/round_borrow.md``), where each row's own arithmetic is a
few thousand instructions.

A borrowed view has the array's data, shape and strides and no ``meminfo``: numba's count functions return at once
on it (a null check, no atomic), and so do the views sliced from it. It is valid while the array it borrows from is
alive and unmoved; the kernel borrows its scratch and outputs once a chunk of rows, from arrays the chunk's caller
holds, and never returns a borrowed view to Python.
"""

from __future__ import annotations

from typing import Any

from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["borrowed"]


@intrinsic
def borrowed(typingctx: Any, array: Any) -> Any:
    """``array`` (any numba array type) as a view of the same memory without its ``meminfo`` and ``parent``."""
    if not isinstance(array, types.Array):
        return None
    signature = array(array)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        source = context.make_array(sig.args[0])(context, builder, args[0])
        view = context.make_array(sig.return_type)(context, builder)
        for field in ("data", "shape", "strides", "itemsize", "nitems"):
            setattr(view, field, getattr(source, field))
        view.meminfo = cgutils.get_null_value(view.meminfo.type)
        view.parent = cgutils.get_null_value(view.parent.type)
        return view._getvalue()

    return signature, codegen
