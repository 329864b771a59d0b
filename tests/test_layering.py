"""The layers of docs/architecture.md, read from the source: which package imports which, where the kernels
enter the algorithm, a model file without distributed code, and every private torch/Triton/torchtitan call
inside a `compat` module."""
import ast
import importlib.metadata
import warnings
from pathlib import Path

import pytest

from recipe.toml_config import tomllib

REPO = Path(__file__).resolve().parent.parent
# package -> the project packages it may import (besides itself); the command lines above them take any
ALLOWED = {
    "lighthouse_kernels": set(),
    "lighthouse": {"lighthouse_kernels"},
    "models": {"lighthouse"},
    "recipe": {"models", "lighthouse"},
    "eval": {"recipe", "models", "lighthouse", "lighthouse_kernels"},
    "scripts": {"eval", "recipe", "models", "lighthouse", "lighthouse_kernels"},
    "train.py": {"recipe"},
}
PROJECT = {"lighthouse_kernels", "lighthouse", "models", "recipe", "eval", "scripts", "tests"}
# Inside `recipe/` and `eval/`, the subpackages and top-level modules in layer order, lowest first: each imports
# only from itself and the ones before it (docs/architecture.md draws them).
SUBLAYERS = {
    "recipe": ["errors", "toml_config", "progress", "launch", "torchrun", "compat", "data", "resilience", "logs", "hf",
               "train", "experiments"],
    "eval": ["options", "device", "checkpoint_record", "checkpoint", "checkpoint_run", "records", "metrics",
             "benchmarks", "studies"],
}
# The one module of `lighthouse/` that imports `lighthouse_kernels/` (the rest, the reference included, runs without
# Triton; the fused compositions reach the kernels through it).
KERNEL_ENTRIES = {"lighthouse/fused_ops.py"}
COMPAT = ("lighthouse/compat/", "lighthouse_kernels/compat.py", "recipe/compat/")
PRIVATE_ROOTS = {"torch", "triton", "torchtitan"}


def sources(package: str) -> list[Path]:
    path = REPO / package
    return [path] if path.is_file() else sorted(path.rglob("*.py"))


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, absolute (relative imports resolved against its package)."""
    package = rel(path).removesuffix(".py").split("/")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def project_imports(path: Path) -> set[str]:
    return {name.split(".")[0] for name in imported_modules(path)} & PROJECT


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_each_layer_imports_only_the_layers_below_it(package):
    wrong = {rel(p): sorted(project_imports(p) - ALLOWED[package] - {package})
             for p in sources(package)}
    assert {p: names for p, names in wrong.items() if names} == {}


def unit(package: str, module: str) -> str | None:
    """The layer of `package` (SUBLAYERS) that module `package.x...` belongs to; None for another package."""
    parts = module.split(".")
    return parts[1] if parts[0] == package and len(parts) > 1 else None


@pytest.mark.parametrize("package", sorted(SUBLAYERS))
def test_inside_recipe_and_eval_each_subpackage_imports_only_the_ones_below_it(package):
    order = SUBLAYERS[package]
    assert sorted(order) == sorted(p.stem if p.is_file() else p.name for p in (REPO / package).iterdir()
                                   if p.suffix == ".py" and p.stem != "__init__" or (p / "__init__.py").exists())
    wrong = {}
    for path in sources(package):
        own = rel(path).split("/")[1].removesuffix(".py")
        if own == "__init__":
            continue
        above = {u for name in imported_modules(path) if (u := unit(package, name)) in order
                 and order.index(u) > order.index(own)}
        if above:
            wrong[rel(path)] = sorted(above)
    assert wrong == {}


def test_the_algorithm_meets_the_kernels_in_one_module():
    importers = {rel(p) for p in sources("lighthouse") if "lighthouse_kernels" in project_imports(p)}
    assert importers == KERNEL_ENTRIES


def test_no_package_of_ours_shares_its_import_name_with_an_installed_distribution():
    """An installed package of the same top-level name would shadow ours or be shadowed by it, whichever comes first
    on sys.path (transformers >= 5.25 requires Hugging Face's `kernels`, hence `lighthouse_kernels`)."""
    ours = {name.removesuffix("*") for name in tomllib.loads((REPO / "pyproject.toml").read_text())
            ["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert ours == PROJECT - {"scripts", "tests"}
    others = {name: sorted(set(dists) - {"lighthouse-recipe", "lighthouse_recipe"})
              for name, dists in importlib.metadata.packages_distributions().items() if name in ours}
    assert {name: dists for name, dists in others.items() if dists} == {}


def test_the_model_file_knows_nothing_of_distributed_code():
    names = imported_modules(REPO / "models" / "llama3_lighthouse" / "model.py")
    assert not [n for n in names if n.startswith(("torch.distributed", "lighthouse.context_parallel"))]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_uses(path: Path) -> list[str]:
    """Private torch/Triton/torchtitan names `path` uses: imports of private modules or names, attributes
    reached from a module of theirs (`torch._C`, `torch.ops.aten._x`, `DTensor._op_dispatcher`), and private
    methods overridden in a subclass of one of their classes."""
    tree = ast.parse(path.read_text())
    roots, found = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PRIVATE_ROOTS:
                    roots.add((alias.asname or alias.name).split(".")[0])
                    if any(_private(part) for part in alias.name.split(".")):
                        found.append(f"import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PRIVATE_ROOTS:
            for alias in node.names:
                roots.add(alias.asname or alias.name)
                if any(_private(part) for part in node.module.split(".")) or _private(alias.name):
                    found.append(f"from {node.module} import {alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in roots:
                found.append(ast.unparse(node))
        elif isinstance(node, ast.ClassDef) and any(isinstance(b, ast.Name) and b.id in roots for b in node.bases):
            found.extend(f"{node.name}.{f.name}" for f in node.body
                         if isinstance(f, ast.FunctionDef) and _private(f.name))
    return found


def test_private_torch_triton_and_torchtitan_calls_are_in_compat_modules_only():
    outside = {}
    for package in ALLOWED:
        for path in sources(package):
            if not rel(path).startswith(COMPAT) and (uses := private_uses(path)):
                outside[rel(path)] = uses
    assert outside == {}


def test_the_private_call_check_finds_each_kind_of_use(tmp_path):
    path = tmp_path / "sample.py"
    path.write_text(
        "import torch\nfrom torch.distributed.tensor import DTensor\n"
        "from torch.distributed.tensor.experimental._attention import set_rotate_method\n"
        "from torchtitan.config import ConfigManager\n"
        "x = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu\ny = DTensor._op_dispatcher\n"
        "class M(ConfigManager):\n    def _maybe_load_toml(self, args): ...\n    def __init__(self): self._own = 1\n"
    )
    assert sorted(private_uses(path)) == sorted([
        "from torch.distributed.tensor.experimental._attention import set_rotate_method",
        "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu", "DTensor._op_dispatcher",
        "M._maybe_load_toml",
    ])


@pytest.mark.parametrize("package", sorted(PROJECT | {"train.py", "conftest.py"}))
def test_every_source_compiles_without_a_warning(package):
    """An invalid escape sequence ("\\)" in a string that is not raw) is a SyntaxWarning, an error in a later Python."""
    for path in sources(package):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            compile(path.read_text(), str(path), "exec")
