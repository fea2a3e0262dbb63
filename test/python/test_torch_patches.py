"""The table of patched torch attributes (torch_spmd/_torch_patches) names every assignment to
a torch attribute in torch_spmd's source, and nothing it lists is patched nowhere; each patch
installed at import is in place."""
import ast
import importlib
import inspect
import os

import torch

import torch_spmd  # noqa: F401  (installs the import-time patches)
from torch_spmd._torch_patches import PATCHES

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "torch_spmd")


def _torch_names(tree):
    """Names a module binds to torch objects: `import torch`, `from torch.x import y`."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "torch" or a.name.startswith("torch."):
                    names[a.asname or a.name.split(".")[0]] = a.name if a.asname else "torch"
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module and \
                (node.module == "torch" or node.module.startswith("torch.")):
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def _dotted(node):
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id] + parts[::-1] if isinstance(node, ast.Name) else None


def _targets(node):
    """The attribute and item targets an assignment writes (tuples unpacked)."""
    targets = node.targets if isinstance(node, ast.Assign) else []
    out = []
    while targets:
        t = targets.pop()
        if isinstance(t, (ast.Tuple, ast.List)):
            targets.extend(t.elts)
        elif isinstance(t, ast.Subscript):
            out.append((t.value, "[]"))
        elif isinstance(t, ast.Attribute):
            out.append((t, ""))
    return out


def _assigned_torch_attributes():
    """(attribute, module) for every assignment to, or setattr on, a torch attribute: through
    a name bound to torch (an import, or a local `x = torch.a.b` / `getattr(torch.a, "b")`)."""
    found = set()
    for d, _, files in os.walk(ROOT):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(d, f)
            module = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
            tree = ast.parse(open(path).read())
            names = _torch_names(tree)
            for node in ast.walk(tree):  # local aliases of torch objects
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                        isinstance(node.targets[0], ast.Name):
                    value = node.value
                    attr = ""
                    if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "getattr" \
                            and len(value.args) >= 2 and isinstance(value.args[1], ast.Constant):
                        value, attr = value.args[0], "." + value.args[1].value
                    parts = _dotted(value)
                    if parts and parts[0] in names and (len(parts) > 1 or attr):
                        names[node.targets[0].id] = ".".join([names[parts[0]]] + parts[1:]) + attr
            for node in ast.walk(tree):
                for target, suffix in _targets(node):
                    parts = _dotted(target)
                    if parts and parts[0] in names:
                        found.add((".".join([names[parts[0]]] + parts[1:]) + suffix, module))
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setattr":
                    parts = _dotted(node.args[0])
                    if parts and parts[0] in names:
                        found.add((".".join([names[parts[0]]] + parts[1:]) + ".*", module))
    return found


WHEN = ("import", "import, CUDA builds", "torch.compile",
        "import of torch.distributed.checkpoint.default_planner")


def test_the_table_lists_every_patch_in_the_source_and_nothing_else():
    in_source = _assigned_torch_attributes()
    # A setattr over several names is listed name by name.
    listed = {(p.attribute, p.module) for p in PATCHES}
    wildcards = {(a, m) for a, m in in_source if a.endswith(".*")}
    for attr, module in wildcards:
        assert any(p.module == module and p.attribute.startswith(attr[:-1]) for p in PATCHES), \
            f"{module} patches {attr}, which the table does not list"
    plain = in_source - wildcards
    assert plain <= listed, f"patched but not in the table: {sorted(plain - listed)}"
    # The other way: each entry's module assigns its name (some through names the scan does
    # not follow: a patched module handed in as an argument).
    for p in PATCHES:
        source = open(os.path.join(ROOT, p.module.replace(".", os.sep) + ".py")).read()
        name = p.attribute.rsplit(".", 1)[1].rstrip("[]")
        assert name in source, f"{p.module} does not patch {p.attribute}"
    for p in PATCHES:
        assert p.reason and p.torch and p.when in WHEN, p


def test_import_time_patches_are_in_place():
    for p in PATCHES:
        installed = p.when == "import" or (p.when == "import, CUDA builds" and
                                           torch.backends.cuda.is_built())
        if not installed or p.attribute == "torch.compile":
            continue  # (torch.compile's is installed by its own first use)
        owner_path, name = p.attribute.rsplit(".", 1)
        owner = importlib.import_module("torch")
        for part in owner_path.split(".")[1:]:
            owner = getattr(owner, part)
        value = getattr(owner, name)
        # Where its code lives (a functools.wraps wrapper keeps torch's name, not its code).
        code = getattr(value, "__code__", None)
        where = code.co_filename if code else inspect.getfile(value)
        assert os.path.realpath(where).startswith(os.path.realpath(ROOT)), \
            f"{p.attribute} is torch's own ({where})"
