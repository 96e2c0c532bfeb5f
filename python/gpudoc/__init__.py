"""gpudoc: a doctor for NVIDIA GPU memory. The command is the `gpudoc` binary; this package holds gpudoc's
Python code: the shim that `gpudoc run` loads into every Python process of a job (`_shim/`), and the
notebook extension (`%load_ext gpudoc`: notebook.py, imported only then)."""
from __future__ import annotations

from typing import Any


def load_ipython_extension(shell: Any) -> None:
    """`%load_ext gpudoc`: the per-cell line, holders, OOMs explained, `%gpudoc` and `%%gpudoc`."""
    from . import notebook

    notebook.load(shell)


def unload_ipython_extension(shell: Any) -> None:
    """`%unload_ext gpudoc`: the callbacks go (the magics stay, as IPython keeps every extension's)."""
    from . import notebook

    notebook.unload(shell)
