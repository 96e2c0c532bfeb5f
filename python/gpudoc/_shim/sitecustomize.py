# gpudoc's shim, first on PYTHONPATH under `gpudoc run`: every Python process of the job compiles this file
# at start-up, so it is tiny and leaves no name behind. It runs _gpudoc_site.py, beside it, from the
# bytecode cached in this folder (valid Python 2 and 3).
def _gpudoc():
    import sys
    from os import path

    src = path.join(path.dirname(path.abspath(__file__)), "_gpudoc_site.py")
    ext = sys.modules.get("_frozen_importlib_external")
    loader = ext and ext.SourceFileLoader("gpudoc._shim.site", src)
    code = loader.get_code(loader.name) if loader else compile(open(src).read(), src, "exec")
    # __package__ "": no parent package (Python 2 would look for gpudoc._shim.os at `import os`).
    site = {"__name__": "gpudoc._shim.site", "__package__": "", "__file__": "<gpudoc> " + src,
            "__builtins__": __builtins__}
    exec(code, site)
    site["start"](loader, code, globals())


try:
    _gpudoc()
finally:
    del _gpudoc
