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


# The Python package's floors, lowest first (docs/architecture.md): a module imports only from
# its own floor or those below (module level and function level alike). A name with "=" is that
# module alone (a package's __init__, which every import of the package runs); otherwise the
# name and everything under it. A module is on the floor of its longest match.
FLOORS = (
    # The device, the state of the process and its world, the presets: what every layer reads.
    ("private", ("torch_spmd._C", "torch_spmd._impl", "torch_spmd.device_module",
                 "=torch_spmd._torch_patches")),
    # xr: the device set, plan mode and memory APIs.
    ("runtime", ("torch_spmd.runtime", "torch_spmd.memory", "torch_spmd.amp")),
    # The sharding annotations (the package's __init__ is only the multi-process entry points).
    ("sharding", ("torch_spmd.distributed.spmd", "=torch_spmd.distributed")),
    # xm: steps, collectives, devices.
    ("xm", ("torch_spmd.core",)),
    # Training on top of xm and the annotations: FSDP, data parallel, checkpoints, loaders.
    ("training", ("torch_spmd.distributed", "torch_spmd.utils")),
    # Reading the programs: plans, reports, debugging views.
    ("planning", ("torch_spmd.plan", "torch_spmd.debug")),
    # What assembles the others: pipelines, the experimental and torch_xla-compatible APIs, the
    # integrations with torch (its patches), the package itself.
    ("assembly", ("torch_spmd", "torch_spmd.distributed.pipeline", "torch_spmd.experimental",
                  "torch_spmd.xla", "torch_spmd._torch_patches")),
)


def _floor_of(module):
    best, floor = -1, None
    for index, (_, names) in enumerate(FLOORS):
        for name in names:
            exact = name.startswith("=")
            name = name.lstrip("=")
            matches = module == name or (not exact and module.startswith(name + "."))
            weight = len(name) * 2 + exact  # longest first; an exact name over its prefix
            if matches and weight > best:
                best, floor = weight, index
    return floor


def test_no_import_runs_up_a_floor():
    mods = _modules()
    assert all(_floor_of(m) is not None for m in mods)
    up = []
    for m, path in sorted(mods.items()):
        for target in sorted(_imports(m, path, mods)):
            if target.startswith("torch_spmd") and _floor_of(target) > _floor_of(m):
                up.append(f"{m} ({FLOORS[_floor_of(m)][0]}) imports {target} "
                          f"({FLOORS[_floor_of(target)][0]})")
    assert not up, "imports up a floor:\n" + "\n".join(up)
