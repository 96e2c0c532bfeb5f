"""Everything the shim changes in the program's process, in one place: each attribute it replaces (or adds)
on an object of torch's or of the program's, and each hook and callback it registers, goes through
PATCHES, which records what was there before (the owner, the name, the original object), takes each change
back exactly, and lists the changes in place (`gpudoc.patches()`; docs/framework.md's table is this list).

A replacement keeps what a program reads of the original: the shim makes it with `_same_parameters` (a
Python function of torch's: its parameters, defaults, annotations, name and doc) or `_like` (a builtin of
torch._C: its name and doc), both in _gpudoc_torch.py; this module only puts it in place and takes it back.

Loaded by _gpudoc_torch.py as `gpudoc._shim.patch` (in sys.modules: `gpudoc.patches()` finds it there).
Imports nothing: it runs at `import torch`, inside the program.
"""

# Typed with comments, which Python 3.6 and 3.7 (the shim still loads there) read as comments; `typing` is
# never imported at run time (mypy takes any TYPE_CHECKING for its own).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Union  # noqa: F401 (the type comments')


class _Absent(object):
    """What an owner had of its own before the shim added a name to it (a class's inherited `__call__`)."""

    def __repr__(self):
        # type: () -> str
        return "<absent>"


ABSENT = _Absent()


class Patch(object):
    """One change: `kind` "replaced" (owner.name was `original`), "added" (owner had no name of its own:
    taking it back deletes it), "hook" (a hook registered; `undo` removes it) or "callback" (registered
    with something that keeps it for the process's life: `undo` None)."""

    def __init__(self, kind, target, why, owner=None, name="", original=ABSENT, new=None, undo=None,
                 shown=None, disarm=None):
        # type: (str, str, str, Any, str, Any, Any, Optional[Callable[[], Any]], Optional[str], Any) -> None
        self.kind, self.target, self.why = kind, target, why
        self.owner, self.name, self.original, self.new = owner, name, original, new
        self.undo = undo
        # A replacement that calls the original it replaced (sys.excepthook's chain): made a pass-through
        # when someone replaced it after the shim, so it cannot be put back.
        self.disarm = disarm
        # The target as docs/framework.md names it (the program's class: the outermost module's class).
        self.shown = shown or target

    @property
    def removable(self):
        # type: () -> bool
        return self.kind in ("replaced", "added") or self.undo is not None

    def describe(self):
        # type: () -> Dict[str, Union[str, bool]]
        """What `gpudoc.patches()` says of it."""
        return {"target": self.target, "kind": self.kind, "why": self.why, "removable": self.removable}


def _qualified(owner):
    # type: (Any) -> str
    name = getattr(owner, "__qualname__", None) or getattr(owner, "__name__", "?")
    module = getattr(owner, "__module__", None) if isinstance(owner, type) else None
    return "%s.%s" % (module, name) if module else str(name)


class Patches(object):
    """The changes in place, in the order they were made."""

    def __init__(self):
        # type: () -> None
        self.live = []  # type: List[Patch]

    def replace(self, owner, name, new, why, target=None, shown=None, disarm=None):
        # type: (Any, str, Any, str, Optional[str], Optional[str], Optional[Callable[[], Any]]) -> Patch
        """`owner.name` becomes `new`; what the owner had under that name of its own (a class's inherited
        attribute is none of its own) is kept to be put back. `disarm`, for a `new` that calls the
        original (a chained hook): makes `new` a pass-through, where it cannot be taken back (`remove`)."""
        original = vars(owner).get(name, ABSENT)
        patch = Patch("added" if original is ABSENT else "replaced", target or "%s.%s" % (
            _qualified(owner), name), why, owner, name, original, new, shown=shown, disarm=disarm)
        setattr(owner, name, new)
        self.live.append(patch)
        return patch

    def hook(self, handle, target, why):
        # type: (Any, str, str) -> Patch
        """A hook registered through torch, whose `handle` removes it (torch's RemovableHandle)."""
        return self._add(Patch("hook", target, why, new=handle, undo=handle.remove))

    def callback(self, target, why, undo=None):
        # type: (str, str, Optional[Callable[[], Any]]) -> Patch
        """A callback registered with Python or torch; `undo` unregisters it (None: it lasts)."""
        return self._add(Patch("callback", target, why, undo=undo))

    def _add(self, patch):
        # type: (Patch) -> Patch
        self.live.append(patch)
        return patch

    def remove(self, patch):
        # type: (Patch) -> bool
        """Takes one change back: the owner gets exactly its original object (or loses the name it had
        none of), a hook is removed. An attribute someone replaced after the shim is theirs now (theirs
        may call the shim's): left as it is, and listed still, unless the shim's can be made a
        pass-through (`disarm`: it then does nothing of gpudoc's, and the change is gone). Whether the
        change is gone."""
        if patch not in self.live:
            return True
        if patch.kind in ("replaced", "added"):
            if vars(patch.owner).get(patch.name, ABSENT) is not patch.new:
                if patch.disarm is None:
                    return False
                patch.disarm()
                self.live.remove(patch)
                return True
            if patch.original is ABSENT:
                delattr(patch.owner, patch.name)
            else:
                setattr(patch.owner, patch.name, patch.original)
            if patch.disarm is not None:
                patch.disarm()  # a copy the program kept of the shim's passes through too
        elif patch.undo is not None:
            patch.undo()
        else:
            return False
        self.live.remove(patch)
        return True

    def remove_all(self):
        # type: () -> List[Patch]
        """Takes back every change that can be, latest first; those that last (callbacks)."""
        for patch in list(reversed(self.live)):
            if patch.removable:
                try:
                    self.remove(patch)
                except Exception:
                    pass
        return list(self.live)

    def find(self, owner, name):
        # type: (Any, str) -> Optional[Patch]
        """The change in place on `owner.name`, if the shim made one."""
        for patch in self.live:
            if patch.owner is owner and patch.name == name:
                return patch
        return None

    def listing(self):
        # type: () -> List[Dict[str, Union[str, bool]]]
        """Every change in place, as `gpudoc.patches()` says it."""
        return [p.describe() for p in self.live]


PATCHES = Patches()
