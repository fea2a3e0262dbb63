"""The Python package has no import cycles: every module imports only modules below it (module
level and function level alike), so any module can be imported first. Importing ``a.b.c`` runs
the packages ``a`` and ``a.b`` first, so it depends on their ``__init__`` too (except on the
importer's own enclosing packages, which are already running)."""
import ast
import os

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "torch_spmd")


def _modules():
    mods = {}
    for d, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(d, f)
                rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
                mods[rel[:-len(".__init__")] if rel.endswith(".__init__") else rel] = path
    return mods


def _imports(name, path, mods):
    package = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1])
                target = base + ("." + node.module if node.module else "")
            else:
                target = node.module or ""
            for alias in node.names:
                full = target + "." + alias.name
                if full == "torch_spmd._C":
                    continue  # the C++ extension: imports nothing of ours
                out.add(full if full in mods else target)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    with_packages = set()
    for m in out:
        parts = m.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            enclosing = name == prefix or name.startswith(prefix + ".")
            if prefix in mods and not enclosing:
                with_packages.add(prefix)
    return {m for m in with_packages if m != name}


def test_no_import_cycles():
    mods = _modules()
    graph = {m: _imports(m, p, mods) for m, p in mods.items()}
    state, path, cycles = {}, [], []

    def visit(m):
        state[m] = "open"
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == "open":
                cycles.append(path[path.index(n):] + [n])
            elif n not in state:
                visit(n)
        path.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


CSRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "csrc")
# Which C++ layers each layer may include (docs/architecture.md): a lower layer never includes
# a higher one, and the runtime executes what the compiler hands it, reading no sharding rule.
MAY_INCLUDE = {
    "core": {"core"},
    "sharding": {"core", "sharding"},
    "ir": {"core", "sharding", "ir"},
    "partition": {"core", "sharding", "ir", "partition"},
    # The performance model and layout search read the compiler's programs; the compiler never
    # reads them, nor does the runtime.
    "plan": {"core", "sharding", "ir", "partition", "plan"},
    "runtime": {"core", "sharding", "ir", "partition", "runtime"},
    "aten": {"core", "sharding", "ir", "partition", "plan", "runtime", "aten", "compat"},
}


def test_cpp_layers_include_only_layers_below_and_the_runtime_no_rules():
    import re
    bad, checked = [], 0
    for layer, allowed in MAY_INCLUDE.items():
        for d, _, files in os.walk(os.path.join(CSRC, layer)):
            for f in files:
                path = os.path.join(d, f)
                for line in open(path):
                    m = re.match(r'#include "([^/"]+)/([^"]+)"', line)
                    if not m:
                        continue
                    target, checked = m.group(1), checked + 1
                    if target not in allowed or (layer == "runtime" and
                                                 m.group(2).startswith("rules/")):
                        bad.append(f"{os.path.relpath(path, CSRC)}: {line.strip()}")
    assert checked > 300, checked  # the walk found the sources
    assert not bad, "includes against the layering:\n" + "\n".join(bad)
