"""The C handles' one owner, ``Owned``, and ``HandleObject``, the base of the public classes that hold one.

Every C object the binding creates is owned by an ``Owned``, which frees it (with the library's free
function) when the last Python reference to the ``Owned`` is gone, or at once with ``release()``.
Whatever borrows from the C object (a checkpoint's views, a call running in another thread, the arrays
a host model points into) keeps a reference to the ``Owned``, or is kept by it (``keep``), so the C
object never goes while something still uses it.
"""

from __future__ import annotations

import weakref
from typing import Any, List, Optional

from ._lib import lib


class Owned:
    """Owns one C handle and frees it with ``free_name`` when the last reference is gone (or at
    ``release()``). ``keep`` holds objects the C object points into: they live as long as it."""

    __slots__ = ("ptr", "keep", "_finalizer", "__weakref__")

    def __init__(self, ptr: int, free_name: str):
        self.ptr = ptr
        self.keep: List[Any] = []
        self._finalizer = weakref.finalize(self, getattr(lib(), free_name), ptr)
        # At interpreter exit the process is going away; freeing then could only race module teardown.
        self._finalizer.atexit = False

    def release(self) -> None:
        """Frees the C object now (idempotent); only for objects nothing else borrows from."""
        self._finalizer()


class HandleObject:
    """Base of the public classes that hold one C handle through an ``Owned``.

    ``close()`` (or leaving a ``with`` block) drops the object's hold: the C object goes at once unless
    a call running in another thread, or an object borrowing from it, still holds the ``Owned``.
    Handle objects cannot be pickled.
    """

    #: how messages call an object after close(): "operation on a closed Adapter"
    _closed_word = "closed"
    #: appended to the pickling error
    _pickle_hint = ""

    def __init__(self, owned: Owned):
        self._owned: Optional[Owned] = owned

    def _live(self) -> Owned:
        # Callers keep the returned owner in a local for the whole C call, so a close() from
        # another thread cannot free the C object under it.
        owned = self._owned
        if owned is None:
            raise ValueError(f"operation on a {self._closed_word} {type(self).__name__}")
        return owned

    def close(self) -> None:
        """Drops this object's hold on its C object. Idempotent."""
        self._owned = None

    @property
    def closed(self) -> bool:
        return self._owned is None

    def __enter__(self):
        self._live()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __reduce__(self):
        name = type(self).__name__
        article = "an" if name[0] in "AEIOU" else "a"
        raise TypeError(f"{article} {name} cannot be pickled{self._pickle_hint}")


def handle_of(obj: HandleObject) -> Owned:
    """The owner of ``obj``'s live handle (``ValueError`` once closed), for a C call that takes it as
    an argument; the caller holds the returned owner until the call returns."""
    return obj._live()


__all__ = ["HandleObject", "Owned", "handle_of"]
