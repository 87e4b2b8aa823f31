"""Hierarchy configuration: presets, TOML files, and the typed errors bad ones raise."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import sdm
from sdm.store.config import (
    HIERARCHY_PRESETS, HierarchyConfig, TierConfig, load_toml, resolve_config, with_io_mode,
)
from sdm.errors import ConfigError

GOOD = """
name = "mine"
io_mode = "paced"

[[tiers]]
kind = "cache"
device = "dram"
capacity_rows = 1000
policy = "lru"

[[tiers]]
kind = "cache"
device = "optane-p4800x-512"
capacity_bytes = 1048576
queue_depth = 8

[[tiers]]
kind = "lmdb"

[tiers.device]
name = "my-nand"
media = "TLC Nand"
access_bytes = 4096
read_latency_us = 90.0
max_read_iops = 400000
read_bandwidth_gbps = 3.0
active_watts = 10.0
idle_watts = 4.0
capacity_gb = 4000
usd_per_gb = 0.2
"""


def write(tmp_path, text, name="h.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_presets_exist_and_are_well_formed():
    assert {"dram", "ssd", "sdm-nand", "sdm-3dxp", "three-tier"} <= set(HIERARCHY_PRESETS)
    assert [t.kind for t in HIERARCHY_PRESETS["sdm-nand"].tiers] == ["cache", "mmap"]
    assert HIERARCHY_PRESETS["sdm-nand"].tiers[1].device.name == "nand-p4500"
    assert HIERARCHY_PRESETS["sdm-3dxp"].tiers[1].device.access_bytes == 512
    assert [t.kind for t in HIERARCHY_PRESETS["three-tier"].tiers] == ["cache", "cache", "lmdb"]
    for name, config in HIERARCHY_PRESETS.items():
        assert resolve_config(name) is config and config.io_mode == "modeled"


def test_toml_round_trip(tmp_path):
    config = load_toml(write(tmp_path, GOOD))
    assert config.name == "mine" and config.io_mode == "paced"
    cache, scm, ssd = config.tiers
    assert (cache.kind, cache.device.name, cache.capacity_rows, cache.policy) == ("cache", "dram", 1000, "lru")
    assert (scm.capacity_bytes, scm.queue_depth, scm.device.access_bytes) == (1 << 20, 8, 512)
    assert ssd.device.name == "my-nand" and ssd.device.read_latency_us == 90.0
    assert resolve_config(write(tmp_path, GOOD)) == config


def test_toml_defaults(tmp_path):
    config = load_toml(write(tmp_path, '[[tiers]]\nkind = "mmap"\n', "plain.toml"))
    assert config.name == "plain" and config.io_mode == "modeled" and config.io_submission is None
    chosen = load_toml(write(tmp_path, 'io_submission = "threads"\n[[tiers]]\nkind = "mmap"\n', "t.toml"))
    assert chosen.io_submission == "threads"
    assert config.tiers[0].device.name == "optane-p4800x-4k" and config.tiers[0].queue_depth == 1


@pytest.mark.parametrize("text, field", [
    ('[[tiers]]\nkind = "dram"\ncolour = "red"\n', "colour"),
    ('speed = 3\n[[tiers]]\nkind = "dram"\n', "speed"),
    ('[[tiers]]\nkind = "tape"\n', "tape"),
    ('[[tiers]]\nkind = "cache"\n[[tiers]]\nkind = "lmdb"\n', "capacity"),
    ('[[tiers]]\nkind = "cache"\ncapacity_rows = 0\n[[tiers]]\nkind = "lmdb"\n', "capacity_rows"),
    ('[[tiers]]\nkind = "cache"\ncapacity_bytes = -5\n[[tiers]]\nkind = "lmdb"\n', "capacity_bytes"),
    ('[[tiers]]\nkind = "cache"\ncapacity_rows = 5\ncapacity_bytes = 5\n[[tiers]]\nkind = "lmdb"\n',
     "capacity_rows or capacity_bytes"),
    ('[[tiers]]\nkind = "cache"\ncapacity_rows = 5\npolicy = "mru"\n[[tiers]]\nkind = "lmdb"\n', "policy"),
    ('[[tiers]]\nkind = "mmap"\npolicy = "lru"\n', "policy"),
    ('[[tiers]]\nkind = "mmap"\nqueue_depth = 0\n', "queue_depth"),
    ('[[tiers]]\nkind = "mmap"\ndevice = "floppy"\n', "floppy"),
    ('[[tiers]]\nkind = "mmap"\n[tiers.device]\nname = "x"\n', "missing"),
    ('[[tiers]]\nkind = "cache"\ncapacity_rows = 5\n', "last tier must hold all rows"),
    ('[[tiers]]\nkind = "dram"\n[[tiers]]\nkind = "lmdb"\n', "never be read"),
    ('io_mode = "fast"\n[[tiers]]\nkind = "dram"\n', "io_mode"),
    ('io_submission = "uring"\n[[tiers]]\nkind = "dram"\n', "io_submission 'uring' is not one of"),
    ('name = "empty"\n', "at least one tier"),
    ('[[tiers]\n', "not valid TOML"),
    ('tiers = 3\n', "array of tables"),
])
def test_bad_toml_raises_config_error_naming_the_field(tmp_path, text, field):
    with pytest.raises(ConfigError, match=field):
        load_toml(write(tmp_path, text))


@pytest.mark.parametrize("field, value", [("read_latency_us", -3.0), ("max_read_iops", 0),
                                          ("capacity_gb", 0), ("access_bytes", 100)])
def test_bad_inline_device_names_the_field(tmp_path, field, value):
    text = GOOD.replace(f"\n{field} = ", f"\n{field} = {value}\n_old_{field} = ")
    text = "\n".join(line for line in text.splitlines() if not line.startswith("_old_"))
    with pytest.raises(ConfigError, match=field):
        load_toml(write(tmp_path, text))


def test_unknown_preset_and_bad_types():
    with pytest.raises(ConfigError, match="sdm-nand"):
        resolve_config("sdm-tape")
    with pytest.raises(ConfigError, match="does not exist"):
        resolve_config("/nonexistent/h.toml")
    with pytest.raises(ConfigError):
        resolve_config(42)
    with pytest.raises(ConfigError, match="tiers\\[0\\]"):
        HierarchyConfig("x", ("dram",))
    with pytest.raises(ConfigError, match="queue_depth"):
        TierConfig("mmap", queue_depth=True)


def test_with_io_mode():
    config = with_io_mode("sdm-3dxp", "direct")
    assert config.io_mode == "direct" and config.tiers == HIERARCHY_PRESETS["sdm-3dxp"].tiers
    with pytest.raises(ConfigError, match="io_mode"):
        with_io_mode("dram", "warp")


def test_capacities_are_checked_against_the_store(tmp_path):
    spec = sdm.TableSpec("t", 100, 8, "fp32")  # 3200 bytes of rows
    with sdm.Store.create(tmp_path / "s", [spec]) as store:
        store.write_table("t", np.ones((100, 8), np.float32))
    too_small = HierarchyConfig("small", (TierConfig("mmap", capacity_bytes=3000),))
    with pytest.raises(ConfigError, match="capacity_bytes 3000"):
        sdm.Store.open(tmp_path / "s", config=too_small)
    with pytest.raises(ConfigError, match="capacity_rows 99"):
        sdm.Store.open(tmp_path / "s", config=HierarchyConfig("r", (TierConfig("dram", capacity_rows=99),)))
    tiny_cache = HierarchyConfig("c", (TierConfig("cache", capacity_bytes=16), TierConfig("lmdb")))
    with pytest.raises(ConfigError, match="holds no row"):
        sdm.Store.open(tmp_path / "s", config=tiny_cache)
    ok = HierarchyConfig("ok", (TierConfig("cache", capacity_bytes=32 * 10), TierConfig("mmap", capacity_bytes=3200)))
    with sdm.Store.open(tmp_path / "s", config=ok) as store:
        assert store.lookup("t", [1]).tolist() == [[1.0] * 8]
        assert store.stats()["tiers"][0]["capacity_rows"] == 10


def test_configs_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        HIERARCHY_PRESETS["dram"].io_mode = "paced"
