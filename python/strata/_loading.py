"""Priority loads: ``load_into(state, first=[...])`` fills the tensors under
the ``first`` paths, returns a ``Loading`` handle, and reads the rest on a
thread of its own behind them."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from ._errors import InvalidError
from ._tree import path_text


def first_paths(first: Any) -> List[str]:
    """``first`` as a list of path prefixes (``"model"``, ``"model.layers.0"``)."""
    if isinstance(first, str):
        first = [first]
    try:
        out = [str(p) for p in first]
    except TypeError:
        raise InvalidError(f"first must be a path or a list of paths, not {type(first).__name__}") from None
    if not out or any(not p for p in out):
        raise InvalidError("first names no path (give the paths of the state to load first, e.g. ['model'])")
    return out


def under(path: Tuple[Any, ...], prefixes: Iterable[str]) -> bool:
    """Whether the state path ``path`` is one of ``prefixes`` or lies below
    one (``"model"`` covers ``model.layer.weight``, not ``model_ema``)."""
    text = path_text(path)
    return any(text == p or text.startswith(p + ".") for p in prefixes)


def copy_into(pairs: List[Tuple[Any, Any]]) -> None:
    """Copies each verified staging array into its target (in place)."""
    for source, target in pairs:
        if hasattr(target, "copy_"):
            import torch

            with torch.no_grad():
                target.copy_(source)
        else:
            target[...] = source


class Loading:
    """The rest of a priority load (``load_into(state, first=[...])``).

    When ``load_into`` returns it, the tensors under the ``first`` paths
    are filled and verified; the other entries are being read, on a thread
    of their own, into staging memory. ``wait`` blocks until they are
    read and verified, then fills the rest of the state (tensors, plain
    values, new entries, and each stateful object's ``load_state_dict``)
    and returns the step. Until then, leave the rest of the state alone: a
    ``save`` or another load of the same checkpointer waits for it first.
    A failure of the rest (``CorruptError``, ``UnavailableError``) is
    raised by ``wait`` and leaves the rest of the state as it was; the
    ``first`` part stays loaded.
    """

    def __init__(
        self,
        step: int,
        started: float,
        first_stats: Dict[str, Any],
        on_done: Optional[Callable[[Dict[str, Any]], None]] = None,
    ) -> None:
        #: The step being loaded.
        self.step = step
        self._started = started
        #: Seconds from the ``load_into`` call until the ``first`` tensors
        #: were in place (it returned).
        self.first_seconds = time.perf_counter() - started
        #: Seconds from the ``load_into`` call until everything was in
        #: place (set by ``wait``).
        self.seconds: Optional[float] = None
        #: The read's counters (``bytes_read``, ...): the ``first`` part's
        #: until ``wait``, then the whole load's.
        self.stats: Dict[str, Any] = dict(first_stats)
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self._read_result: Optional[Dict[str, Any]] = None
        self._read_error: Optional[BaseException] = None
        self._apply: Optional[Callable[[], None]] = None
        self._outcome: Optional[BaseException] = None
        self._finished = False
        self._on_done = on_done

    def _start(self, read: Callable[[], Dict[str, Any]], apply: Callable[[], None]) -> None:
        def run() -> None:
            try:
                self._read_result = read()
            except BaseException as e:  # noqa: BLE001 - raised again by wait()
                self._read_error = e

        self._apply = apply
        self._thread = threading.Thread(target=run, name="strata-load-rest", daemon=True)
        self._thread.start()

    def done(self) -> bool:
        """True once the rest was read (or failed): ``wait`` returns at once."""
        return self._thread is None or not self._thread.is_alive()

    def wait(self, timeout: Optional[float] = None) -> int:
        """Waits for the rest, fills it into the state and returns the
        step; raises the rest's failure (again on every call). With
        ``timeout`` (seconds), raises ``TimeoutError`` if the rest is not
        read by then (nothing changes; call again)."""
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"the rest of step {self.step} is still loading")
        with self._lock:
            if not self._finished:
                self._finished = True
                try:
                    if self._read_error is not None:
                        raise self._read_error
                    if self._apply is not None:
                        self._apply()
                    self.seconds = time.perf_counter() - self._started
                    self.stats = merge_stats(self.stats, self._read_result or {}, self.first_seconds, self.seconds)
                    if self._on_done is not None:
                        self._on_done(self.stats)
                except BaseException as e:  # noqa: BLE001 - kept for every later wait()
                    self._outcome = e
                finally:
                    self._apply = None
            if self._outcome is not None:
                raise self._outcome
        return self.step

    def finished(self) -> bool:
        """True once ``wait`` settled the load (filled in, or failed)."""
        return self._finished

    def __repr__(self) -> str:
        state = "done" if self.done() else "loading"
        return f"Loading(step={self.step}, {state}, first_seconds={self.first_seconds:.3f})"


def merge_stats(first: Dict[str, Any], rest: Dict[str, Any], first_s: float, total_s: float) -> Dict[str, Any]:
    """One load's counters from its two reads (a chunk shared by entries of
    both parts is read once, by the first, and counted there)."""
    out = dict(first)
    for k in ("chunks", "bytes_read", "bytes_from_l2", "bytes_from_l3", "chunks_repaired", "duration_s"):
        out[k] = first.get(k, 0) + rest.get(k, 0)
    # Timed from the load_into call (the agreement included).
    out["first_seconds"] = first_s
    out["seconds"] = total_s
    return out
