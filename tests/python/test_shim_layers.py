"""The shim's files are layers: no two of them use each other, read from their source (ast; nothing is
run). A file uses another where it imports it (the torch module's parts import each other's names under
`if MYPY:`, read by the linters only, since they run in one namespace) or names the module it is loaded
as (`sys.modules["gpudoc._shim.pipe"]`, `("_gpudoc_hunt.py", "gpudoc._shim.hunt")`). The torch module's
parts are run in its PARTS order, which is their layers': each uses the names of _gpudoc_torch.py and of
the parts before it only (docs/architecture.md, "The torch module"). No file of the shim's uses the package
above it (`gpudoc`, its notebook extension), which loads the shim."""
import ast
import os
import re

from shim_env import HERE

SHIM = "gpudoc._shim."
TORCH = "_gpudoc_torch.py"


def _tree(filename):
    with open(os.path.join(HERE, filename)) as f:
        return ast.parse(f.read(), filename)


def _docstrings(tree):
    """The docstrings' nodes: a docstring that names a module is no use of it."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _file_of(module):
    """The shim's file loaded as `module` (gpudoc._shim.pipe is _gpudoc_pipe.py), or that file's own
    name (gpudoc._shim._gpudoc_torch_pipe, as the parts import each other); None for no file of the
    shim's."""
    if not module.startswith(SHIM):
        return None
    name = module[len(SHIM):]
    return (name if name.startswith("_gpudoc_") else "_gpudoc_" + name) + ".py"


def _modules(filename):
    """The modules `filename` imports, and the dotted names it holds as strings (a module's, where one is
    loaded or found in sys.modules; no docstring's)."""
    tree = _tree(filename)
    docs = _docstrings(tree)
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs \
                and re.match(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$", node.value):
            out.add(node.value)
    return out


def uses(filename):
    """The shim's files `filename` uses: those it imports, and those whose module name it holds."""
    out = set(_file_of(module) for module in _modules(filename))
    out.discard(None)
    out.discard(filename)
    return out


def circle(graph):
    """A circle of `graph` (node -> the nodes it uses), as the list of its nodes, first one repeated at
    the end; None where there is none."""
    done, path = set(), []

    def visit(node):
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return None
        path.append(node)
        for used in sorted(graph.get(node, ())):
            found = visit(used)
            if found:
                return found
        path.pop()
        done.add(node)
        return None

    for node in sorted(graph):
        found = visit(node)
        if found:
            return found
    return None


def _shim_files():
    return sorted(f for f in os.listdir(HERE) if f.endswith(".py"))


def _defined(node):
    """The names a statement at a file's top level defines (a function, a class, an assignment's)."""
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    return []


def _parts():
    for node in _tree(TORCH).body:
        if _defined(node) == ["PARTS"]:
            return [elt.value for elt in node.value.elts]
    raise AssertionError("no PARTS in " + TORCH)


def test_a_circle_is_found_and_layers_have_none():
    assert circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert circle({"a": {"a"}}) == ["a", "a"]
    assert circle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_uses_read_are_the_shims_own():
    """What the reading finds: the torch module's parts' imports, the loader's names, no docstring's."""
    assert uses("_gpudoc_torch_steps.py") >= {TORCH, "_gpudoc_torch_pipe.py", "_gpudoc_torch_clock.py"}
    assert uses(TORCH) == {"_gpudoc_pipe.py", "_gpudoc_hunt.py", "_gpudoc_where.py", "_gpudoc_patch.py"}
    assert uses("_gpudoc_where.py") == {"_gpudoc_hunt.py"}
    assert uses("sitecustomize.py") == {"_gpudoc_site.py"}
    files = set(_shim_files())
    for filename in files:
        assert uses(filename) <= files, filename


def test_the_shims_files_use_each_other_in_no_circle():
    graph = dict((filename, uses(filename)) for filename in _shim_files())
    found = circle(graph)
    assert found is None, "a circle of the shim's files: " + " -> ".join(found)


def test_the_shim_uses_nothing_of_the_package_above_it():
    """gpudoc's package (the notebook extension, `gpudoc.patches()`) loads the shim; never the reverse."""
    for filename in _shim_files():
        above = [m for m in _modules(filename)
                 if (m == "gpudoc" or m.startswith("gpudoc.")) and not m.startswith(SHIM)]
        assert not above, (filename, above)


def test_each_part_of_the_torch_module_uses_only_those_run_before_it():
    parts = _parts()
    assert sorted(parts) == sorted(f for f in _shim_files() if f.startswith("_gpudoc_torch_")), parts
    assert not uses(TORCH) & set(parts), "_gpudoc_torch.py uses a part"
    below = {TORCH}
    for part in parts:
        above = (uses(part) - below) & (set(parts) | {TORCH})
        assert not above, "%s uses %s, run after it (PARTS)" % (part, ", ".join(sorted(above)))
        below.add(part)


def test_no_name_of_the_torch_module_is_defined_in_two_of_its_files():
    """The parts run in one namespace: a name a later file defined again would replace the earlier one's,
    silently (imports are each file's own, and MYPY is every part's flag)."""
    owner = {}
    for filename in [TORCH] + _parts():
        for node in _tree(filename).body:
            for name in _defined(node):
                if name != "MYPY":
                    assert owner.setdefault(name, filename) == filename, (name, owner[name], filename)
