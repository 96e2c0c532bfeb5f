"""gpudoc: a doctor for NVIDIA GPU memory. The command is the `gpudoc` binary; this package holds gpudoc's
Python code: the shim that `gpudoc run` loads into every Python process of a job (`_shim/`), and the
notebook extension (`%load_ext gpudoc`: notebook.py, imported only then)."""
from __future__ import annotations

import sys
from typing import Any, Dict, List, Union

# The shim's registry of its changes, as _gpudoc_torch.py loads it (its PATCH).
_REGISTRY = "gpudoc._shim.patch"


def patches() -> List[Dict[str, Union[str, bool]]]:
    """What gpudoc's shim has changed in this process, in place now, in the order it made the changes:
    each attribute of torch's (or of the model's class) it replaced or added, each hook and callback it
    registered. Each: `target` (what was changed), `kind` (replaced, added, hook, callback), `why`, and
    `removable` (False: Python or torch keeps it for the process's life). Empty without the shim (torch
    not imported, or neither `gpudoc run` nor `%load_ext gpudoc`). docs/framework.md lists them all."""
    module = sys.modules.get(_REGISTRY)
    listing: List[Dict[str, Union[str, bool]]] = module.PATCHES.listing() if module is not None else []
    return listing


def load_ipython_extension(shell: Any) -> None:
    """`%load_ext gpudoc`: the per-cell line, holders, OOMs explained, `%gpudoc` and `%%gpudoc`."""
    from . import notebook

    notebook.load(shell)


def unload_ipython_extension(shell: Any) -> None:
    """`%unload_ext gpudoc`: the callbacks go (the magics stay, as IPython keeps every extension's)."""
    from . import notebook

    notebook.unload(shell)
