"""Fast kernels, each beside the plain computation it replaces, and the switch between them.

Every module here holds fast functions (a hand-written gradient, a fused or reordered
computation, a buffer trick) and, beside each, its `*_reference`: the plain `keras.ops`
computation it must equal. `tests/kernels/` compares each pair, values and gradients.

The layers use the fast kernels while `fast_kernels_enabled()` (the default), and the plain
math of the paper otherwise: `disable_fast_kernels()`, or `with reference_kernels():` for a
block of code. The switch is read when a layer runs, so a compiled function keeps the
choice it was traced with.

Example:
>>> with reference_kernels():
...     fast_kernels_enabled()
False
>>> fast_kernels_enabled()
True
"""

import contextlib

from txl_keras.kernels.attention import (position_scores, position_scores_reference, query_key_scores,
                                         query_key_scores_reference, relative_attention, ring_relative_attention,
                                         softmax_values,
                                         softmax_values_forward, softmax_values_reference)
from txl_keras.kernels.layer_norm import layer_norm, layer_norm_reference
from txl_keras.kernels.nll import sparse_nll, sparse_nll_reference
from txl_keras.kernels.relative_shift import relative_shift, relative_shift_reference
from txl_keras.kernels.selection import last_axis_argmax, last_axis_argmax_reference

_FAST = [True]


def fast_kernels_enabled():
    """Whether the layers use the fast kernels (True unless switched off)."""
    return _FAST[0]


def enable_fast_kernels():
    """Use the fast kernels (the default)."""
    _FAST[0] = True


def disable_fast_kernels():
    """Use the plain computations of the paper everywhere (slower; for checking)."""
    _FAST[0] = False


@contextlib.contextmanager
def reference_kernels():
    """The plain computations inside the `with` block, the previous choice after it."""
    before = _FAST[0]
    _FAST[0] = False
    try:
        yield
    finally:
        _FAST[0] = before


__all__ = [
    "disable_fast_kernels", "enable_fast_kernels", "fast_kernels_enabled", "last_axis_argmax",
    "last_axis_argmax_reference", "layer_norm", "layer_norm_reference",
    "position_scores", "position_scores_reference", "query_key_scores", "query_key_scores_reference",
    "reference_kernels", "relative_attention", "ring_relative_attention", "relative_shift", "relative_shift_reference", "softmax_values",
    "softmax_values_forward", "softmax_values_reference", "sparse_nll", "sparse_nll_reference",
]
