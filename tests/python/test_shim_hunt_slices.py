"""The leak hunt walks every kind of container in bounded slices (issue 42, item 5): a dict subclass
(defaultdict, OrderedDict, Counter) was listed whole by gc.get_referents, a pause in proportion to its
size, and was never left for the end as a large dict is. Real torch (the search needs its Tensor types).
The hunt's BIG (a container this large is left for the end) is made smaller here: each test's containers
are a few times BIG, and a walk of 30,000 items in 0.5 ms slices took 1.5 s a test for nothing more."""
import collections

import pytest


torch = pytest.importorskip("torch")


# Over 255 (a namedtuple's most fields) and over the longest list a slice may read at once (1000, below).
BIG = 2000


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
    monkeypatch.setattr(hunt, "BIG", BIG)
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


def test_slices_read_the_modules_once_while_none_is_imported(shim, monkeypatch):
    """Each slice used to scan sys.modules twice (~1,300 modules with torch: milliseconds a slice, the
    hunt's pause); the scan is kept while no module is imported, and redone once one is."""
    hunt = shim.hunt
    monkeypatch.setattr(hunt, "BIG", BIG)
    scans = [0]
    real = hunt.is_user

    def counting(f):
        scans[0] += 1
        return real(f)

    monkeypatch.setattr(hunt, "is_user", counting)
    hunt._SCAN[0] = -1
    names = {"big": collections.OrderedDict((i, [i]) for i in range(hunt.BIG * 2))}
    root = hunt._Root("m", ("m", id(names)), "test", obj=names)
    search = hunt.Search(torch, 0, None, (), roots=lambda skip: [root])
    search.run(0.0005)
    first = scans[0]
    slices = 1
    while not search.run(0.0005) and slices < 10000:
        slices += 1
    assert slices > 5
    assert scans[0] == first, "a slice scanned sys.modules again"
    import json.tool  # noqa: F401  (a module imported between slices)

    hunt._Stops(set())
    assert scans[0] > first, "a newly imported module was not seen"
