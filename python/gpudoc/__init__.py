"""gpudoc: a doctor for NVIDIA GPU memory. The command is the `gpudoc` binary; this package holds gpudoc's
Python code: the shim that `gpudoc run` loads into every Python process of a job (`_shim/`), and the
notebook extension (`%load_ext gpudoc`: notebook.py, imported only then)."""


def load_ipython_extension(shell):
    """`%load_ext gpudoc`: the per-cell line, holders, OOMs explained, `%gpudoc` and `%%gpudoc`."""
    from . import notebook

    notebook.load(shell)


def unload_ipython_extension(shell):
    from . import notebook

    notebook.unload(shell)
