"""The README walked as a new user would: every command it names, on the bundled traces, under
every hierarchy preset, each output checked against the run's own facts (hit rates in [0, 1],
p50 <= p99, nand slower than 3dxp slower than dram, a placement never worse than none, what the
text says a request is matches the trace).

The fast form runs the tiny traces in-process (``make test``); the long form (``slow``) runs
``traces/default.npz``, the trace ``make run`` replays, over the 8 x 100,000 x 64 store of
issue 21's reproduction.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import sdm
from sdm.cli import main
from sdm.store.config import HIERARCHY_PRESETS

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces"
TINY = str(TRACES / "tiny-zipf.npz")
INFERENCE = str(TRACES / "inference-small.npz")
DEFAULT = str(TRACES / "default.npz")
PRESETS = sorted(HIERARCHY_PRESETS)
PERCENTILES = ("p50", "p95", "p99", "p999")


def sdm_json(capsys, *argv):
    """Run ``sdm *argv`` in this process; its exit code 0 and its stdout parsed as JSON."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def sdm_text(capsys, *argv) -> str:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def request_ids(path, max_batches=None) -> int:
    """Requests a replay of ``path`` serves by default: one per trace batch, or one per
    request id of a batch that carries them."""
    with sdm.trace.load(path) as tr:
        n = len(tr) if max_batches is None else min(len(tr), max_batches)
        batches = [tr[i] for i in range(n)]
    return sum(1 if b.request_ids is None else len(np.unique(b.request_ids)) for b in batches)


def check_replay(r: dict, trace: str, max_batches=None) -> None:
    """The facts every replay result must hold, from its own numbers and its trace's."""
    with sdm.trace.load(trace) as tr:
        n = len(tr) if max_batches is None else min(len(tr), max_batches)
        lookups = int(tr.batch_lookups[:n].sum())
        carries_ids = tr[0].request_ids is not None
    assert r["lookups"] == lookups and r["batches"] == n
    assert r["requests"] == request_ids(trace, max_batches)
    assert r["request_definition"] == ("request_ids" if carries_ids else "batch")
    assert 0.0 <= r["hit_rate"] <= 1.0
    lat = [r["latency_us"][q] for q in PERCENTILES]
    assert 0 < lat[0] and lat == sorted(lat)
    measured = [r["measured_latency_us"][q] for q in PERCENTILES]
    assert measured == sorted(measured)
    sla = r["sla"]
    if sla is None:  # a hierarchy the host model does not cover: no QPS, and the output says why
        assert r["qps_at_sla"] is None and r["extra"]["host_model"]["error"]
    else:  # the host model's QPS for the host the output names
        assert r["host"] == r["extra"]["host_model"]["host"] and sla["reason"]
        assert r["qps_at_sla"] == sla["qps"] >= 0 and sla["sla_us"] == r["sla_us"]
        if r["qps_at_sla"] == 0:  # no rate meets it: the reason, and the every result still there
            assert "no request rate meets it" in sla["reason"] or "zero load" in sla["reason"]
        else:
            assert sla["zero_load_us"] <= sla["sla_us"]
    for t in r["tiers"]:
        assert t["hits"] >= 0 and t["misses"] >= 0 and t["reads"] >= 0 and t["wall_ns"] >= 0
        if t["reads"]:
            assert t["bytes_read"] >= t["useful_bytes"] > 0 and t["read_amplification"] >= 1.0
    assert sum(t["modeled_ns"] for t in r["tiers"]) == pytest.approx(r["modeled_s"] * 1e9, rel=1e-3)


@pytest.fixture(scope="module")
def walk(tmp_path_factory):
    """The directory a user works in, with the store `sdm store create` builds for TINY."""
    return tmp_path_factory.mktemp("walk")


@pytest.fixture(scope="module")
def tiny_store(walk):
    assert main(["store", "create", str(walk / "emb.sdm"), "--trace", TINY, "--dim", "16"]) == 0
    return str(walk / "emb.sdm")


def test_store_info_and_verify(tiny_store, capsys):
    info = sdm_json(capsys, "store", "info", tiny_store, "--json")
    with sdm.trace.load(TINY) as tr:
        assert [t["num_rows"] for t in info["tables"]] == [int(x) for x in tr.table_sizes]
    report = sdm_json(capsys, "store", "verify", tiny_store, "--json")
    assert report["damage"] is None and report["blocks"] == sum(t["blocks"] for t in info["tables"])


@pytest.fixture(scope="module")
def zipf(walk):
    """A trace from `sdm trace gen` whose tables (2 x 100,000 rows) are much larger than what a
    request reads, as real tables are, and the store `sdm store create` builds for it. (On
    TINY's 1,000-row tables a whole table is 16 Nand blocks, so Nand reads few blocks and
    can beat 3DXP's 512 B ones: true of the model, not of a real workload.)"""
    trace, store = walk / "zipf.npz", walk / "zipf.sdm"
    assert main(["trace", "gen", "--profile", "zipf", "--tables", "2", "--table-size", "100000",
                 "--batches", "4", "--batch-size", "32", "-o", str(trace)]) == 0
    assert main(["store", "create", str(store), "--trace", str(trace), "--dim", "16"]) == 0
    return str(trace), str(store)


def cache_option(preset: str, size: str) -> list[str]:
    return ["--cache-bytes", size] if HIERARCHY_PRESETS[preset].tiers[0].kind == "cache" else []


@pytest.fixture(scope="module")
def replays(zipf, walk):
    """``sdm replay zipf.npz --store S --config P --cache-bytes 64K --json F`` per preset: a
    cache of 1,000 rows, smaller than the working set, so the devices show."""
    trace, store = zipf
    out = {}
    for preset in PRESETS:
        path = walk / f"{preset}.json"
        assert main(["replay", trace, "--store", store, "--config", preset, *cache_option(preset, "64K"),
                     "--json", str(path)]) == 0
        out[preset] = json.loads(path.read_text())
    return out


@pytest.mark.parametrize("preset", PRESETS)
def test_replay_facts_under_every_preset(replays, zipf, preset):
    r = replays[preset]
    check_replay(r, zipf[0])
    assert r["config"] == preset and r["io_mode"] == "modeled"
    if preset == "dram":
        assert r["hit_rate"] == 1.0 and [t["kind"] for t in r["tiers"]] == ["dram"]


def test_nand_is_slower_than_3dxp_is_slower_than_dram(replays):
    for q in PERCENTILES:
        assert replays["sdm-nand"]["latency_us"][q] > replays["sdm-3dxp"]["latency_us"][q] \
            > replays["dram"]["latency_us"][q], q
    assert replays["sdm-nand"]["modeled_s"] > replays["sdm-3dxp"]["modeled_s"] > replays["dram"]["modeled_s"]
    # the same lookups under both cache presets: one cache policy, one size, one key stream
    assert replays["sdm-nand"]["tiers"][0]["hits"] == replays["sdm-3dxp"]["tiers"][0]["hits"]


def test_the_summary_says_what_the_json_says(tiny_store, capsys):
    text = sdm_text(capsys, "replay", TINY, "--store", tiny_store, "--config", "sdm-nand")
    r = sdm_json(capsys, "replay", TINY, "--store", tiny_store, "--config", "sdm-nand", "--json")
    assert f"{r['requests']:,} requests" in text and "a request is one trace batch" in text
    assert "DRAM hit rate" in text and f"{r['hit_rate']:.4f}" in text
    assert f"{r['latency_us']['p50']:,.1f} µs" in text or f"{r['latency_us']['p50'] / 1e3:,.2f} ms" in text


@pytest.mark.parametrize("preset", ["sdm-nand", "sdm-3dxp", "three-tier"])
def test_a_placement_is_never_worse_than_none(zipf, replays, walk, capsys, preset):
    trace, store = zipf
    placement = walk / "placement.npz"
    if not placement.exists():
        sdm_text(capsys, "place", trace, "--store", store, "--dram-bytes", "64K", "-o", placement)
    none = replays[preset]
    placed = sdm_json(capsys, "replay", trace, "--store", store, "--config", preset,
                      "--cache-bytes", "64K", "--placement", placement, "--json")
    check_replay(placed, trace)
    assert placed["hit_rate"] >= none["hit_rate"]
    assert placed["modeled_s"] <= none["modeled_s"]
    for q in PERCENTILES:
        assert placed["latency_us"][q] <= none["latency_us"][q], q


def test_an_inference_trace_counts_request_ids(walk, capsys):
    text = sdm_text(capsys, "replay", INFERENCE, "--max-batches", "2", "--dim", "4", "--config", "sdm-nand")
    r = sdm_json(capsys, "replay", INFERENCE, "--max-batches", "2", "--dim", "4", "--config", "sdm-nand",
                 "--pooled-cache-bytes", "1M", "--json")
    check_replay(r, INFERENCE, max_batches=2)
    assert "a request is one request id (user x items) of a batch" in text
    assert f"{r['requests']:,} requests" in text
    assert r["pooled_cache"]["hits"] > 0 and 0 <= r["pooled_cache"]["bag_share"] <= 1


def test_sweep_miss_ratios_and_the_belady_bound(zipf, capsys):
    s = sdm_json(capsys, "sweep", zipf[0], "--policies", "lru,s3fifo", "--cache-sizes", "8K", "32K",
                 "--dim", "16", "--json")
    by = {(p["policy"], p["cache_bytes"]): p for p in s["points"]}
    for (policy, size), p in by.items():
        assert 0.0 <= p["miss_ratio"] <= 1.0
        assert p["miss_ratio"] >= by[("belady", size)]["miss_ratio"]
        nand, xp = p["devices"]["nand-p4500"], p["devices"]["optane-p4800x-512"]
        for q in PERCENTILES:
            assert nand["latency_us"][q] > xp["latency_us"][q], q
    for policy in ("lru", "s3fifo", "belady"):
        assert by[(policy, 32 << 10)]["miss_ratio"] <= by[(policy, 8 << 10)]["miss_ratio"]


def test_trace_gen_stats_and_a_replay_of_it(walk, capsys):
    made = walk / "my.npz"
    info = sdm_json(capsys, "trace", "gen", "--profile", "zipf", "--tables", "2", "--table-size", "500",
                    "--batches", "3", "--batch-size", "32", "-o", made, "--json")
    stats = sdm_json(capsys, "trace", "stats", made, "--json")
    assert info["batches"] == 3 and info["tables"] == 2 and info["lookups"] == stats["lookups"]
    r = sdm_json(capsys, "replay", made, "--config", "sdm-3dxp", "--dim", "8", "--json")
    check_replay(r, str(made))
    assert r["lookups"] == info["lookups"]


def test_report_from_a_replay(walk, replays, capsys):  # replays wrote walk/<preset>.json
    out = walk / "report"
    # a scenario with typed figures beside the replay: the shipped ones run the host model
    # for the configurations the replay does not give (tests/test_report_measure.py)
    typed = ROOT / "tests" / "data" / "typed-scenarios" / "mixed.toml"
    report = sdm_json(capsys, "report", "-o", out, "--scenario", typed, "--replay", walk / "sdm-nand.json",
                      "--no-plots", "--json")
    assert (out / "report.md").is_file() and report["scenarios"]
    for sc in report["scenarios"]:
        for c in sc["configs"]:
            assert c["hosts"] >= 1 and c["power_watts"] > 0


def test_devices_and_run(capsys):
    devices = sdm_json(capsys, "devices", "--json")
    names = {d["name"] for d in devices} if isinstance(devices, list) else set(devices)
    assert {"dram", "nand-p4500", "optane-p4800x-512"} <= names
    run = sdm_json(capsys, "run", "--trace", TINY, "--dim", "8", "--no-report", "--json")
    assert run["identical"] is True
    lat = {r["config"]: r["latency_us"]["p50"] for r in run["runs"]}
    assert lat["sdm-nand"] >= lat["sdm-3dxp"] >= lat["dram"]


# -- the long form: the bundled default trace over the store of issue 21 ----------------------


@pytest.fixture(scope="module")
def default_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("default") / "emb.sdm"
    assert main(["store", "create", str(path), "--trace", DEFAULT]) == 0
    return str(path)


@pytest.mark.slow
def test_default_trace_under_every_preset_and_a_placement(default_store, capsys):
    runs = {p: sdm_json(capsys, "replay", DEFAULT, "--store", default_store, "--config", p, "--json")
            for p in PRESETS}
    for r in runs.values():
        check_replay(r, DEFAULT)
    for q in PERCENTILES:
        assert runs["sdm-nand"]["latency_us"][q] > runs["sdm-3dxp"]["latency_us"][q] > runs["dram"]["latency_us"][q]
    placement = Path(default_store).parent / "placement.npz"
    sdm_text(capsys, "place", DEFAULT, "--store", default_store, "--dram-bytes", "128M", "-o", placement)
    for preset in ("sdm-nand", "sdm-3dxp"):
        none, placed = (sdm_json(capsys, "replay", DEFAULT, "--store", default_store, "--config", preset,
                                 "--cache-bytes", "128M", *extra, "--json")
                        for extra in ((), ("--placement", placement)))
        assert placed["hit_rate"] > none["hit_rate"]
        for q in PERCENTILES:
            assert placed["latency_us"][q] <= none["latency_us"][q], (preset, q)
    # The QPS at the SLA is the host model's: an SLA above its zero-load p99 is met, one at half
    # of it is a result with QPS 0 and the reason. (That zero-load p99 is a warm host's, with
    # CPU measured here, so it is not the replay's printed latency, which counts the cold start.)
    zero = runs["sdm-nand"]["sla"]["zero_load_us"]
    met = sdm_json(capsys, "replay", DEFAULT, "--store", default_store, "--config", "sdm-nand",
                   "--sla-us", f"{zero * 3!r}", "--json")
    unmet = sdm_json(capsys, "replay", DEFAULT, "--store", default_store, "--config", "sdm-nand",
                     "--sla-us", f"{zero * 0.5!r}", "--json")
    assert met["qps_at_sla"] > 0 and met["host"] == "this-machine"
    assert unmet["qps_at_sla"] == 0 and "zero load" in unmet["sla"]["reason"]
    for key in ("requests", "lookups", "hit_rate", "latency_us"):  # every other figure still there
        assert unmet[key] == runs["sdm-nand"][key], key


@pytest.mark.slow
def test_default_trace_sweep_and_run(capsys):
    s = sdm_json(capsys, "sweep", DEFAULT, "--policies", "lru,s3fifo", "--cache-sizes", "4M", "64M", "--json")
    for p in s["points"]:
        assert 0.0 <= p["miss_ratio"] <= 1.0
    run = sdm_json(capsys, "run", "--no-report", "--json")
    assert run["identical"] is True
    for r in run["runs"]:
        check_replay(r, DEFAULT)
