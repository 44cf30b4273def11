"""The engine thread: one long-lived thread that runs all of a process's torch work, apart from the threads that
serve the page, as serving engines keep their engine core apart from their API server.

Why: with torch's CPU wheel (OpenMP), a forward on a thread other than the long-lived one that ran torch first can
run at half speed, and a web server runs each handler on whichever pool thread is free; one long-lived thread that
does all the torch work runs at the main thread's speed (``scripts/thread_speed.py``; docs/results.md, "The page's
engine thread").  So the page loads its start model, measures, decodes, races, sweeps and re-measures on one
``EngineThread``; the threads of the web server only hand work to it and relay what it streams.  A model the picker
loads is fetched on a thread of its own (a slow download holds no run), its timed steps (the auto precision's
measurement, the warm-up) handed to the engine thread.

The thread is ``concurrent.futures.ThreadPoolExecutor(max_workers=1)``'s worker, created at once and kept for the
process's life; work runs one item at a time, in the order submitted.
"""
from __future__ import annotations

import functools
import inspect
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

_ITEM, _ERROR, _DONE = range(3)  # what the engine thread puts on a stream's queue


class EngineThread:
    """One long-lived thread for torch work (see the module docstring): ``call`` runs a function on it and waits,
    ``submit`` returns a ``Future``, ``stream`` relays a generator's items, ``wrap`` turns a page handler into one
    that runs there.  Called from the engine thread itself, each runs inline (no deadlock)."""

    def __init__(self, name: str = "goose-lens-engine") -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self.ident: int = self._pool.submit(threading.get_ident).result()  # the thread, started now

    def on_thread(self) -> bool:
        """Whether the caller is the engine thread."""
        return threading.get_ident() == self.ident

    def submit(self, fn: Callable, /, *args, **kwargs) -> Future:
        """``fn(*args, **kwargs)`` queued on the engine thread (run inline, already done, when called from it)."""
        if not self.on_thread():
            return self._pool.submit(fn, *args, **kwargs)
        done: Future = Future()
        try:
            done.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, as the pool's futures do
            done.set_exception(exc)
        return done

    def call(self, fn: Callable, /, *args, **kwargs) -> Any:
        """``fn(*args, **kwargs)`` on the engine thread, waited for; its exception re-raised here."""
        return self.submit(fn, *args, **kwargs).result()

    def stream(self, gen_fn: Callable[..., Iterator], /, *args, merge: Callable[[Any, Any], Any] | None = None,
               **kwargs) -> Iterator:
        """The items of ``gen_fn(*args, **kwargs)``, run on the engine thread, yielded here as they come.

        The engine thread never waits for this side: items it yields while this side is busy wait in a queue, and
        with ``merge`` the waiting ones are merged into one (``merge(older, newer)``; e.g. two page frames into the
        newer one).  Closing this iterator (a visitor left) closes the generator at its next item.  An exception in
        the generator is raised here.
        """
        if self.on_thread():
            yield from gen_fn(*args, **kwargs)
            return
        items: queue.SimpleQueue = queue.SimpleQueue()
        closed = threading.Event()
        self._pool.submit(_produce, functools.partial(gen_fn, *args, **kwargs), items, closed)
        try:
            while True:
                kind, value = items.get()
                while merge is not None and kind == _ITEM:
                    try:
                        later = items.get_nowait()
                    except queue.Empty:
                        break
                    if later[0] != _ITEM:
                        yield value
                        kind, value = later
                        break
                    value = merge(value, later[1])
                if kind == _ERROR:
                    raise value
                if kind == _DONE:
                    return
                yield value
        finally:
            closed.set()

    def wrap(self, handler: Callable, merge: Callable[[Any, Any], Any] | None = None) -> Callable:
        """``handler`` run on the engine thread: a generator function streamed (``stream``, with ``merge``), any
        other function called (``call``).  The result keeps ``handler``'s name and signature."""
        if inspect.isgeneratorfunction(handler):
            @functools.wraps(handler)
            def streamed(*args, **kwargs):
                yield from self.stream(handler, *args, merge=merge, **kwargs)
            return streamed

        @functools.wraps(handler)
        def called(*args, **kwargs):
            return self.call(handler, *args, **kwargs)
        return called


def _produce(make: Callable[[], Iterator], items: queue.SimpleQueue, closed: threading.Event) -> None:
    """``EngineThread.stream``'s side on the engine thread: run ``make()``'s generator, putting each item on
    ``items``, then ``_DONE`` or ``_ERROR``; stop at the next item once ``closed`` is set."""
    if closed.is_set():  # the visitor left while this waited its turn
        items.put((_DONE, None))
        return
    gen = make()
    try:
        for item in gen:
            items.put((_ITEM, item))
            if closed.is_set():
                break
    except BaseException as exc:  # noqa: BLE001 - raised on the other side
        items.put((_ERROR, exc))
        return
    finally:
        gen.close()
    items.put((_DONE, None))
