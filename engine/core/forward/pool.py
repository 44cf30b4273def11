"""The buffers a finished generation hands to the next: one pool for every path that keeps them.

A static cache (``static``), a set of captured CUDA graphs on one (``graphs``) or a llama context (``llamacpp``) costs
an allocation, a capture or a context's set-up to make, so a path keeps a finished generation's set and gives it to
the next ``open`` it fits.  Two pieces, the same on every path:

* ``Spares``: the kept sets, at most ``limit``, the path's ``rank`` saying which to drop first; ``take`` gives the
  caller the best fitting one.  A forward's end may come on any thread (a garbage collection inside ``take``), so
  every change holds the pool's re-entrant ``lock``.
* ``Lease``: one generation's hold on its set.  When the generation's forward is collected (or ``release`` is
  called) the set goes back to the pool; the lease never refers to the forward, so it never keeps one alive.

Never two generations on one set: a forward still in use holds its lease.  Source: SGLang's and vLLM's memory pools
(buffers allocated once, reused by the next request); ours: a generation's whole set (cache, frames, graphs, a llama
context) reused as one.
"""
from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Spares(Generic[T]):
    """Finished generations' buffer sets kept for the next generation they fit.

    Args:
        limit: the most sets kept (two on every path: the page runs AR beside a generation, each keeping its own).
        rank: a set's rank when the pool is full: the lowest-ranked sets are dropped first (sorted high to low,
            ties kept in the order they came).

    Attributes:
        lock: held by every change; a path that keeps figures beside its sets (the graphed path's open sets) takes it
            too.
    """

    def __init__(self, limit: int, rank: Callable[[T], object]) -> None:
        self.limit, self.rank = limit, rank
        self.lock = threading.RLock()
        self._sets: list[T] = []
        self._closed = False

    def __len__(self) -> int:
        return len(self._sets)

    def __iter__(self) -> Iterator[T]:
        return iter(list(self._sets))

    def __contains__(self, item: object) -> bool:
        return any(s is item for s in self._sets)

    @property
    def closed(self) -> bool:
        """Whether ``close`` was called: nothing is kept any more (its owner opens nothing new either)."""
        return self._closed

    def take(self, fits: Callable[[T], bool], best: Callable[[T], object]) -> T | None:
        """The fitting set with the lowest ``best`` key (the first of equals), now the caller's; None when none
        fits."""
        with self.lock:
            fitting = [s for s in self._sets if fits(s)]
            if not fitting:
                return None
            chosen = min(fitting, key=best)
            self._sets.remove(chosen)
            return chosen

    def keep(self, item: T) -> None:
        """A finished generation's set, kept; past ``limit`` the lowest-ranked are dropped.  Nothing is kept once the
        pool is closed."""
        with self.lock:
            if self._closed:
                return
            self._sets.append(item)
            self._sets.sort(key=self.rank, reverse=True)
            del self._sets[self.limit:]

    def retain(self, keep: Callable[[T], bool]) -> None:
        """Drop every kept set for which ``keep`` is false (e.g. sets smaller than every run will need)."""
        with self.lock:
            self._sets = [s for s in self._sets if keep(s)]

    def clear(self) -> None:
        """Drop every kept set (the pool stays open)."""
        with self.lock:
            self._sets.clear()

    def close(self) -> None:
        """Drop every kept set and keep none after (a closed path's finished generations free theirs)."""
        with self.lock:
            self._closed = True
            self._sets.clear()


def _hand_back(give_back: Callable[[T], None], box: list) -> None:
    give_back(box[0])


class Lease(Generic[T]):
    """One generation's hold on a buffer set: ``value`` is the set; when ``holder`` (the generation's forward) is
    collected, or on ``release``, ``give_back(value)`` runs once (a path's ``keep``, which hands it to its pool).

    The set may be replaced while held (a static cache regrown: ``value = new``); the one held at the end goes back.
    """

    def __init__(self, holder: object, value: T, give_back: Callable[[T], None]) -> None:
        self._box = [value]  # the finalizer's reference: the set, never the holder
        self._end = weakref.finalize(holder, _hand_back, give_back, self._box)

    @property
    def value(self) -> T:
        return self._box[0]

    @value.setter
    def value(self, new: T) -> None:
        self._box[0] = new

    def release(self) -> None:
        """Hand the set back now, as the holder's end would; the holder uses it no more."""
        self._end()
