"""In-memory caches on store methods, invalidated locally and over replication.

``@cached()`` caches an async store method by its arguments. Every cache has a
name (the method's name) so that other processes can invalidate it through the
caches stream: ``store.invalidate_cache_by_name(name, keys)``.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Generic, TypeVar

R = TypeVar("R")


class LruCache(Generic[R]):
    """A bounded mapping that forgets the least recently used entries."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._data: OrderedDict[Hashable, R] = OrderedDict()

    def get(self, key: Hashable) -> tuple[bool, R | None]:
        try:
            value = self._data[key]
        except KeyError:
            return False, None
        self._data.move_to_end(key)
        return True, value

    def set(self, key: Hashable, value: R) -> None:
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.max_entries:
            self._data.popitem(last=False)

    def pop(self, key: Hashable) -> None:
        self._data.pop(key, None)

    def clear(self) -> None:
        self._data.clear()

    def __len__(self) -> int:
        return len(self._data)


class BoundCache(Generic[R]):
    """The cache of one store method on one store instance."""

    def __init__(self, name: str, func: Callable[..., Awaitable[R]], obj: Any, max_entries: int):
        self.name = name
        self._func = func
        self._obj = obj
        self.cache: LruCache[R] = LruCache(max_entries)
        # Bumped by every invalidation: a lookup that started before one must
        # not store what it read.
        self._generation = 0

    async def __call__(self, *args: Any) -> R:
        key = args if len(args) != 1 else args[0]
        found, value = self.cache.get(key)
        if found:
            return value  # type: ignore[return-value]
        generation = self._generation
        result = await self._func(self._obj, *args)
        if generation == self._generation:
            self.cache.set(key, result)
        return result

    def invalidate(self, key: Any) -> None:
        """Forget one entry (key: the argument, or a tuple of arguments)."""
        self._generation += 1
        self.cache.pop(key)

    def invalidate_all(self) -> None:
        self._generation += 1
        self.cache.clear()


class CachedMethod(Generic[R]):
    """Descriptor made by :func:`cached`."""

    def __init__(self, func: Callable[..., Awaitable[R]], max_entries: int) -> None:
        self._func = func
        self.name = func.__name__
        self._max_entries = max_entries
        functools.update_wrapper(self, func)  # type: ignore[arg-type]

    def __get__(self, obj: Any, owner: type | None = None) -> BoundCache[R]:
        if obj is None:
            return self  # type: ignore[return-value]
        caches: dict[str, BoundCache[Any]] = obj.__dict__.setdefault("_bound_caches", {})
        bound = caches.get(self.name)
        if bound is None:
            bound = BoundCache(self.name, self._func, obj, self._max_entries)
            caches[self.name] = bound
        return bound


def cached(max_entries: int = 10_000) -> Callable[[Callable[..., Awaitable[R]]], CachedMethod[R]]:
    """Cache an async store method by its (hashable) arguments."""

    def wrap(func: Callable[..., Awaitable[R]]) -> CachedMethod[R]:
        return CachedMethod(func, max_entries)

    return wrap
