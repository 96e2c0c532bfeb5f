"""The leak hunt walks every kind of container in bounded slices (issue 42, item 5): a dict subclass
(defaultdict, OrderedDict, Counter) was listed whole by gc.get_referents, a pause in proportion to its
size, and was never left for the end as a large dict is. Real torch (the search needs its Tensor types)."""
import collections

import pytest

from shim_env import shim  # noqa: F401  (the fixture)

torch = pytest.importorskip("torch")


class Referents(object):
    """gc as the hunt sees it, with the longest list gc.get_referents gave."""

    def __init__(self, gc):
        self.gc, self.longest = gc, 0

    def __getattr__(self, name):
        return getattr(self.gc, name)

    def get_referents(self, *objs):
        out = self.gc.get_referents(*objs)
        self.longest = max(self.longest, len(out))
        return out


class Loud(list):
    """A list subclass whose own methods must never run in the search (they are the program's code)."""

    def __getitem__(self, i):
        raise AssertionError("the program's __getitem__ ran")

    def __len__(self):
        raise AssertionError("the program's __len__ ran")


@pytest.mark.parametrize("kind", ["defaultdict", "OrderedDict", "Counter", "list subclass", "namedtuple"])
def test_a_large_container_of_any_kind_is_walked_in_slices(shim, monkeypatch, kind):
    hunt = shim.hunt
    n = hunt.BIG * 3
    items = [[i] for i in range(n)]  # each a container of its own: every one is visited
    if kind == "defaultdict":
        big = collections.defaultdict(list, enumerate(items))
    elif kind == "OrderedDict":
        big = collections.OrderedDict(enumerate(items))
    elif kind == "Counter":
        big = collections.Counter(dict(enumerate(items)))
    elif kind == "list subclass":
        big = Loud(items)
    else:
        big = collections.namedtuple("Many", ["f%d" % i for i in range(255)])(*items[:255])
        n = 255
    names = {"big": big}
    root = hunt._Root("m", ("m", id(names)), "test", obj=names)
    gc_ = Referents(hunt.gc)
    monkeypatch.setattr(hunt, "gc", gc_)
    search = hunt.Search(torch, 0, None, (), roots=lambda skip: [root])
    slices = 0
    while not search.run(0.0005) and slices < 100000:
        slices += 1
    assert search.done
    assert search.visited >= n
    # No single read listed the container whole: its items came one by one.
    assert gc_.longest < 1000
    if n > hunt.BIG:
        assert slices > 1  # left for the end and walked over several slices
