"""gpudoc's shim at start-up (run by sitecustomize.py, beside it, in every Python process of the job; valid
Python 2 and 3). It leaves nothing behind: it takes gpudoc's folders off sys.path, runs the sitecustomize
it shadows (once, however tools chain theirs), and puts a finder on sys.meta_path that loads
_gpudoc_torch.py, beside it, when the program really imports torch (_gpudoc_frameworks.py for JAX,
CuPy, TensorFlow, Keras and RMM)."""



# The frameworks the finder watches for, and the part of the shim each loads when the program imports it;
# before it, the module every part shares (the pipe's writer, the loader of the shim's modules).
PIPE = ("_gpudoc_pipe.py", "gpudoc._shim.pipe")
PARTS = {
    "torch": ("_gpudoc_torch.py", "gpudoc._shim.torch"),
    "jax": ("_gpudoc_frameworks.py", "gpudoc._shim.frameworks"),
    "cupy": ("_gpudoc_frameworks.py", "gpudoc._shim.frameworks"),
    "tensorflow": ("_gpudoc_frameworks.py", "gpudoc._shim.frameworks"),
    "keras": ("_gpudoc_frameworks.py", "gpudoc._shim.frameworks"),
    "rmm": ("_gpudoc_frameworks.py", "gpudoc._shim.frameworks"),
}


def start(loader, code, site):
    """`loader` read `code`, this file's, for sitecustomize.py, whose globals are `site`."""
    import os
    import sys

    here = os.path.dirname(os.path.abspath(code.co_filename))
    if loader is not None and sys.dont_write_bytecode:
        cache(loader, code)
        # sitecustomize.py's own bytecode too (its module code is two frames up): Python reads a cached
        # .pyc under PYTHONDONTWRITEBYTECODE, and compiled it at every start (0.4 ms) without one.
        own, f = site.get("__loader__"), sys._getframe(2)
        if f.f_code.co_name == "<module>" and f.f_code.co_filename == getattr(own, "path", None):
            cache(own, f.f_code)
        del f

    def mine(p):
        return os.path.isfile(os.path.join(p or ".", ".gpudoc-shim"))

    skip, f = [], sys._getframe(1)
    # A sitecustomize that runs "the next one" (New Relic's) finds this file again: what runs above
    # this one is skipped, and a second run of this file only chains.
    while f is not None:
        if f.f_code.co_name == "<module>" and f.f_code.co_filename.endswith("sitecustomize.py"):
            skip.append(os.path.dirname(os.path.abspath(f.f_code.co_filename)))
        f = f.f_back
    again = any(mine(p) for p in skip[1:])
    for p in [p for p in sys.path if mine(p)]:
        sys.path.remove(p)
        sys.path_importer_cache.pop(p, None)
    setting = os.environ.get("GPUDOC_TORCH")
    if setting and not again and sys.version_info >= (3, 6):
        class GpudocFinder(object):
            """gpudoc's (`gpudoc run`): loads its PyTorch hooks when the program imports torch, its part for
            the other frameworks when it imports one of them (in any order)."""

            _gpudoc = True
            busy = False
            # The frameworks whose part is in place (torch): the finder stays for the others.
            done = ()

            def find_spec(self, name, path=None, target=None):
                __tracebackhide__ = True
                if name not in PARTS or self.busy or name in self.done:
                    return None
                # Only the import itself, not a probe (importlib.util.find_spec) or a reload.
                f = sys._getframe(1)
                while f is not None and f.f_code.co_name != "_find_spec":
                    f = f.f_back
                if f is None or f.f_back is None or f.f_back.f_code.co_name != "_find_and_load_unlocked":
                    return None
                try:
                    pipe = sys.modules.get(PIPE[1])
                    if pipe is None:
                        # The shim's loader itself (every other module of the shim's is its `load`'s).
                        filename, module = PIPE
                        ext = sys.modules["_frozen_importlib_external"]
                        path_ = os.path.join(here, filename)
                        loader_ = ext.SourceFileLoader(module, path_)
                        code = loader_.get_code(module)
                        if sys.dont_write_bytecode:
                            cache(loader_, code)
                        pipe = type(sys)(module)
                        pipe.__file__ = "<gpudoc> " + path_
                        # The same writer for the modules it loads (its `code`).
                        pipe._cache = cache
                        sys.modules[module] = pipe
                        exec(code, pipe.__dict__)
                    hooks = pipe.load(here, *PARTS[name])
                    return hooks.find_spec(self, name, path, target, here, setting)
                except Exception:
                    return None

        if not any(getattr(f, "_gpudoc", False) for f in sys.meta_path):
            sys.meta_path.insert(0, GpudocFinder())
        # coverage measures no file without a real name: its code is never the program's.
        site["__file__"] = "<gpudoc> " + site["__file__"]
    path = [p for p in sys.path if os.path.abspath(p or ".") not in skip]
    if sys.version_info < (3, 4):
        import imp

        try:
            found = imp.find_module("sitecustomize", path)
        except ImportError:
            return
        try:
            return imp.load_module("sitecustomize", *found)
        finally:
            if found[0] is not None:
                found[0].close()
    spec = sys.modules["_frozen_importlib_external"].PathFinder.find_spec("sitecustomize", path)
    if (spec is None or spec.loader is None) and not again:
        # As without gpudoc: no sitecustomize module at all (site.py passes over exactly this error).
        raise ImportError("No module named 'sitecustomize'", name="sitecustomize")
    if spec is None or spec.loader is None:
        return
    module = sys.modules["_frozen_importlib"].module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)



def cache(loader, code):
    """Writes this file's bytecode beside it, where Python would but for PYTHONDONTWRITEBYTECODE (which is
    about the program's files; this folder is gpudoc's): the next process does not compile it."""
    import sys

    try:
        ext = sys.modules["_frozen_importlib_external"]
        path = ext.cache_from_source(loader.path)
        try:
            sys.modules["os"].stat(path)
        except OSError:
            st = loader.path_stats(loader.path)
            pyc = ext._code_to_timestamp_pyc(code, st["mtime"], st["size"])
            loader._cache_bytecode(loader.path, path, pyc)
    except Exception:
        pass
