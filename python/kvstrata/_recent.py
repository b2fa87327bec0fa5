"""RecentKeys: the keys an adapter put, for the calls that must name them later (SGLang's clear,
LMCache's list), bounded so that a server that runs for months does not grow with every page it
ever stored: past `limit` the oldest are forgotten (those pages stay in the tiers until evicted,
as pages other processes stored do). Not thread-safe: the adapters hold their own lock."""

from collections import OrderedDict

DEFAULT_LIMIT = 1 << 20


class RecentKeys:
    def __init__(self, limit=DEFAULT_LIMIT):
        self.limit = int(limit)
        self._keys = OrderedDict()

    def add(self, key):
        self._keys[key] = None
        self._keys.move_to_end(key)
        while len(self._keys) > self.limit:
            self._keys.popitem(last=False)

    def discard(self, key):
        self._keys.pop(key, None)

    def __contains__(self, key):
        return key in self._keys

    def __iter__(self):
        return iter(list(self._keys))

    def __len__(self):
        return len(self._keys)
