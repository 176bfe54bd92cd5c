"""A method's results cached on its instance (``functools.lru_cache`` on a method keys
the class-wide cache by ``self``, so every instance it ever saw stays alive: an engine
put to sleep by ``--sleep-idle-seconds`` kept its tokenizer, vocabulary scans and
compiled grammars, and through them its weights). Here each instance holds its own
cache, which goes with it."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


class instance_cache:  # noqa: N801 - a decorator, spelled as functools' are
    """``@instance_cache(maxsize)`` on a method: its results, by arguments (hashable),
    cached in the instance (which must have a ``__dict__``), at most ``maxsize`` of them
    (None: no bound). The first access binds one ``lru_cache`` to the instance."""

    def __init__(self, maxsize: int | None = 128):
        self.maxsize = maxsize
        self.func: Callable[..., Any] | None = None
        self.name = ""

    def __call__(self, func: Callable[..., Any]) -> instance_cache:
        self.func = func
        functools.update_wrapper(self, func)
        return self

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        bound = functools.lru_cache(self.maxsize)(self.func.__get__(obj, owner))
        obj.__dict__[self.name] = bound  # later accesses find it there (this is no data descriptor)
        return bound
