"""The package's layers: no import runs upward, whatever the import statement's place.

The order is docs/architecture.md's, lowest first. A module may import from its own layer
and from any layer below; every ``import`` and ``from ... import`` counts, including those
inside functions (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "sdm"

#: Lowest first. A name is a top-level module or subpackage of sdm.
LAYERS = ("errors", "validate", "progress", "formats", "kernels", "devices", "policies", "tiers", "store",
          "model", "trace", "replay", "host", "load", "report", "cluster", "cli")
TOP = ("__init__", "__main__")  # the package's face: may import anything


def _layer_of(module: str) -> str:
    """``sdm.store.hierarchy`` -> ``store``."""
    return module.split(".")[1]


def _imports(path: Path, module: str):
    """(line, imported sdm module) of every import in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the importing package
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            if base == "sdm":  # `from sdm import store` names submodules
                for alias in node.names:
                    yield node.lineno, f"sdm.{alias.name}"
            else:
                yield node.lineno, base


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        yield path, ".".join(parts)


def test_every_top_level_name_has_a_layer():
    names = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if (p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists()))}
    assert names - set(LAYERS) - set(TOP) == set()


def _root_rank(rank) -> int:
    """The highest layer the package root (``sdm/__init__.py``) imports: importing ``sdm``
    itself runs all of those, so only layers above it may."""
    return max(rank[_layer_of(t)] for _, t in _imports(PACKAGE / "__init__.py", "sdm")
               if t.startswith("sdm.") and _layer_of(t) in rank)


def test_no_import_runs_up_the_layers():
    rank = {name: i for i, name in enumerate(LAYERS)}
    root = _root_rank(rank)
    upward = []
    for path, module in _modules():
        if module == "sdm" or module == "sdm.__main__":
            continue
        mine = _layer_of(module)
        where = f"{path.relative_to(PACKAGE.parent)}"
        for line, target in _imports(path, module):
            if target == "sdm" or (target.startswith("sdm.") and _layer_of(target) not in rank):
                # the package root, or a name it defines (`from sdm import __version__`)
                if rank[mine] <= root:
                    upward.append(f"{where}:{line} ({mine}) imports the package root, which "
                                  f"imports layers up to {LAYERS[root]}")
                continue
            if not target.startswith("sdm."):
                continue
            theirs = _layer_of(target)
            if rank[theirs] > rank[mine]:
                upward.append(f"{where}:{line} ({mine}) imports {target} ({theirs})")
    assert upward == []


def test_the_check_sees_upward_imports(tmp_path):
    """The checker itself: a lazy upward import inside a function is found."""
    bad = tmp_path / "probe.py"
    bad.write_text("def f():\n    from sdm.cli import main\n    return main\n")
    assert [t for _, t in _imports(bad, "sdm.tiers.probe")] == ["sdm.cli"]
    rel = tmp_path / "rel.py"
    rel.write_text("from ..store import Store\nfrom . import base\n")
    assert [t for _, t in _imports(rel, "sdm.tiers.rel")] == ["sdm.store", "sdm.tiers"]


@pytest.mark.parametrize("name", LAYERS)
def test_layers_name_real_packages_or_future_ones(name):
    # host, load and cluster are the serving and scale-out layers; the others exist now
    if name in ("host", "load", "cluster"):
        return
    assert (PACKAGE / f"{name}.py").exists() or (PACKAGE / name / "__init__.py").exists()
