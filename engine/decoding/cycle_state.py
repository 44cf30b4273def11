"""The compiled cycle's arrays as one compiled object (a numba ``StructRef``): the configuration (``Settings``), the
generation's counters and planned cycle (``Cycle``) and the sources' tables (``Tables``), handed to each cycle's call
as one pointer.

Issue 71: passed from Python as NamedTuples, the ~80 arrays are unboxed one by one at every call, 13 µs with the
host's caches warm and about 20 µs right after a forward (docs/results.md, "Goose's cost per cycle"); a ``StructRef``
holds them unboxed, so a call unboxes one object.  It holds the very arrays the Python side keeps (``numpy`` views of
the same memory): what a kernel writes, ``CompiledPlanner`` reads, and the reverse.  When the Python side replaces an
array (a table grows), it makes a new state (``state_of``).

Every function here is compiled once per checkout into numba's cache, the ``StructRef`` type with them: it is
registered here, at module level, so its functions' cache entries load in the next process.
"""
from __future__ import annotations

from numba import njit, types
from numba.experimental import structref

from . import cycle_kernel as k


@structref.register
class CycleStateType(types.StructRef):
    """The numba type of a ``CycleState``: one field per part, each a NamedTuple of arrays."""

    def preprocess_fields(self, fields):
        return tuple((name, types.unliteral(typ)) for name, typ in fields)


class CycleState(structref.StructRefProxy):
    """One generation's compiled-cycle arrays, as the compiled functions take them: ``settings``
    (``cycle_kernel.Settings``), ``cycle`` (``cycle_kernel.Cycle``), ``tables`` (``cycle_kernel.Tables``).  Made by
    ``state_of`` (compiled and cached), never by calling the class from Python, whose constructor would compile
    anew in every process.  It holds no Python object of its own: nothing of it is read from Python."""


structref.define_proxy(CycleState, CycleStateType, ["settings", "cycle", "tables"])


@njit(cache=True)
def state_of(settings, cycle, tables):
    """A ``CycleState`` over these arrays (not copies: the kernels write into the caller's arrays)."""
    return CycleState(settings, cycle, tables)


@njit(cache=True)
def advance(state, verified):
    """``cycle_kernel.advance`` on the state: learn from the cycle just verified (``verified``: see
    ``cycle_kernel.learn``), then ``prepare`` the next."""
    k.advance(state.settings, state.cycle, state.tables, verified)


@njit(cache=True)
def prepare(state):
    """``cycle_kernel.prepare`` on the state: the first cycle planned at the prefill, and whether the next learn has
    room."""
    k.prepare(state.settings, state.cycle, state.tables)
