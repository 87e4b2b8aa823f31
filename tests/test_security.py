"""Security rules (DESIGN.md, issue 11): no pickle on user files, names never become paths,
configs parsed by tomllib / json only."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import pathlib

import numpy as np
import pytest

import sdm
from sdm import errors
from sdm.tiers.manifest import MANIFEST_NAME

PACKAGE = pathlib.Path(sdm.__file__).parent
SOURCES = sorted(PACKAGE.rglob("*.py"))


def _calls(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            yield name, node


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_unsafe_deserializer(path):
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
            for bad in ("pickle", "cPickle", "dill", "marshal", "shelve", "yaml", "joblib"):
                assert bad not in names, f"{path}:{node.lineno} imports {bad}"
    for name, call in _calls(tree):
        assert name not in ("eval", "exec"), f"{path}:{call.lineno} calls {name}"
        kwargs = {k.arg: k.value for k in call.keywords}
        if name == "load" and "allow_pickle" in kwargs:
            assert isinstance(kwargs["allow_pickle"], ast.Constant) and kwargs["allow_pickle"].value is False, \
                f"{path}:{call.lineno} np.load with allow_pickle not False"
        if name == "load" and isinstance(call.func, ast.Attribute) and getattr(call.func.value, "id", "") == "np":
            assert "allow_pickle" in kwargs, f"{path}:{call.lineno} np.load without allow_pickle=False"
        if name == "load" and isinstance(call.func, ast.Attribute) and getattr(call.func.value, "id", "") == "torch":
            w = kwargs.get("weights_only")
            assert isinstance(w, ast.Constant) and w.value is True, f"{path}:{call.lineno} torch.load without weights_only=True"


def _forge_manifest(store, **table_changes):
    """Rewrite the manifest with ``table_changes`` and a matching checksum (an attacker's
    edit, not damage)."""
    path = os.path.join(store, MANIFEST_NAME)
    data = json.load(open(path))
    data.pop("sha256")
    data["tables"][0].update(table_changes)
    body = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    data["sha256"] = hashlib.sha256(body).hexdigest()
    with open(path, "w") as f:
        json.dump(data, f)


@pytest.mark.parametrize("name", ["../outside", "/etc/passwd", "a/b", "..", ".", "a\\b", "x\0y"])
def test_forged_manifest_with_a_path_for_a_name_is_refused(tmp_path, name):
    store = tmp_path / "s"
    sdm.Store.create(store, [sdm.TableSpec("t", 10, 4)]).close()
    _forge_manifest(store, name=name)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(errors.CorruptStoreError, match="manifest"):
        sdm.Store.open(store, config="sdm-nand")
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_scm_row_files_are_named_by_table_id_not_name(tmp_path):
    store = tmp_path / "s"
    with sdm.Store.create(store, [sdm.TableSpec("..x-y_z.1", 10, 4)]) as s:
        s.write_table("..x-y_z.1", np.ones((10, 4), np.float32))
    with sdm.Store.open(store, config="sdm-nand") as s:
        s.lookup("..x-y_z.1", [0])
    assert sorted(os.listdir(store / "scm")) == ["t0.rows"]


def test_trace_with_an_object_array_is_refused_unpickled(tmp_path):
    class Marker:
        def __reduce__(self):
            return (open, (str(tmp_path / "unpickled"), "w"))

    np.savez(tmp_path / "t.npz", schema_version=np.array(1), obj=np.array([Marker()], dtype=object))
    with pytest.raises(sdm.trace.TraceFormatError):
        sdm.trace.load(tmp_path / "t.npz")[0]
    assert not (tmp_path / "unpickled").exists()
