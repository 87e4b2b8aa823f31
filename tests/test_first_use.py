"""What a new user hit (issue 21, items 3-12), one test or more per item: each failed before its
fix. Items 1 and 2 are in test_hierarchy_placement.py and test_queueing.py / test_replay.py,
item 13 in test_cli_store.py, the README walk in test_cli_walk.py and test_readme.py."""

from __future__ import annotations

import io
import json
import pickle
import re
from pathlib import Path

import numpy as np
import pytest

import sdm
from sdm.cli import main
from sdm.errors import ConfigError, InvalidArgumentError
from sdm.replay.live import replay
from sdm.replay.render import replay_markdown
from sdm.store.build import build_store

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "traces" / "tiny-zipf.npz")
INFERENCE = str(ROOT / "traces" / "inference-small.npz")


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(code, err, command, *words):
    assert code == 2 and err.count("\n") == 1 and err.startswith(f"{command}: error:"), err
    assert "Traceback" not in err and all(w in err for w in words), err


@pytest.fixture(scope="module")
def inference_store(tmp_path_factory):
    with sdm.trace.load(INFERENCE) as tr:
        return build_store(tmp_path_factory.mktemp("inference") / "s", tr.table_sizes, dim=4)


# -- 3: the pooled-embedding cache is reported, and never lowers the hit rate -----------------


def test_the_pooled_cache_is_reported_and_does_not_lower_the_hit_rate(inference_store):
    plain = replay(INFERENCE, "sdm-nand", store=inference_store, sla_us=None)
    pooled = replay(INFERENCE, sdm.store.config.with_options("sdm-nand", pooled_cache_bytes=8 << 20),
                    store=inference_store, sla_us=None)
    p = pooled.pooled
    assert plain.pooled is None and plain.to_json()["pooled_cache"] is None
    assert p["hits"] > 0 and 0 < p["bag_share"] <= 1 and 0 < p["lookup_share"] < 1
    def reached(r):  # distinct rows a request asked of the first tier
        return r.tiers[0]["hits"] + r.tiers[0]["misses"]

    assert reached(pooled) < reached(plain) and p["served_lookups"] <= pooled.lookups
    assert pooled.hit_rate >= plain.hit_rate  # the bags served whole no longer lower it
    assert json.loads(json.dumps(pooled.to_json()))["pooled_cache"]["hits"] == p["hits"]
    text = replay_markdown(pooled)
    assert "## Pooled-embedding cache" in text and f"{p['hits']:,} of" in text


# -- 4: --model never silently swaps in the trace's tables ------------------------------------


def test_a_model_of_other_tables_is_refused_naming_both_shapes(tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"26 tables .*but the trace has 2 tables .*--fit-model"):
        replay(TINY, "dram", model="criteo-kaggle", workdir=str(tmp_path))
    code, _, err = run(capsys, "replay", TINY, "--model", "rm2")
    one_error_line(code, err, "sdm replay", "'rm2'", "32 tables", "2 tables (1,000, 1,000 rows)")
    code, out, _ = run(capsys, "replay", TINY, "--model", "criteo-kaggle", "--fit-model")
    assert code == 0 and "criteo-kaggle's MLPs rebuilt over the trace's 2 tables" in out


# -- 5: sizes are checked against what they allocate, before allocating -----------------------


def test_a_cache_is_capped_at_the_stores_rows(tmp_path, capsys):
    path = build_store(tmp_path / "s", [1000, 1000], dim=8)  # TINY's tables
    for size, nbytes in (("100G", 100 << 30), ("1T", 1 << 40)):
        with sdm.Store.open(path, config=sdm.store.config.with_options("sdm-nand", cache_bytes=nbytes)) as store:
            assert store.stats()["tiers"][0]["capacity_rows"] == 2000
        code, out, err = run(capsys, "replay", TINY, "--store", path, "--config", "sdm-nand",
                             "--cache-bytes", size, "--json", "-")
        assert code == 0 and json.loads(out)["hit_rate"] > 0, err
    code, out, err = run(capsys, "sweep", TINY, "--cache-sizes", "1T", "--json")
    assert code == 0 and {p["capacity_rows"] for p in json.loads(out)["points"]} == {2000}, err


def test_sizes_beyond_memory_are_one_error_line(tmp_path, capsys, monkeypatch):
    import sdm.validate

    path = build_store(tmp_path / "s", [1500, 500], dim=8)
    monkeypatch.setattr(sdm.validate, "memory_bytes", lambda: 32 << 10)  # a 32 KiB host
    code, _, err = run(capsys, "replay", TINY, "--store", path, "--config", "sdm-nand", "--cache-bytes", "1M")
    one_error_line(code, err, "sdm replay", "--cache-bytes", "1048576", "2,000 cache slots",
                   "more than this host's 32,768 bytes of memory")
    code, _, err = run(capsys, "replay", TINY, "--store", path, "--pooled-cache-bytes", "1M")
    one_error_line(code, err, "sdm replay", "--pooled-cache-bytes", "1048576", "memory")


def test_trace_gen_checks_tables_and_batch_size_before_allocating(tmp_path, capsys):
    out = tmp_path / "t.npz"
    code, _, err = run(capsys, "trace", "gen", "--tables", "100000000", "-o", out)
    one_error_line(code, err, "sdm trace gen", "tables", "[1, 65536]", "100000000")
    code, _, err = run(capsys, "trace", "gen", "--batch-size", str(10**12), "-o", out)
    one_error_line(code, err, "sdm trace gen", "batch_size x pooling", str(10**12), "GiB of memory")
    assert not out.exists()


# -- 6: errors never point to unsafe loading ---------------------------------------------------


def test_a_text_file_is_not_an_sdm_trace(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not a trace\n")
    for argv in (["trace", "stats"], ["replay"]):
        code, _, err = run(capsys, *argv, tmp_path / "notes.txt")
        one_error_line(code, err, "sdm " + " ".join(argv), "notes.txt", "not an sdm trace")
        assert "pickle" not in err


def test_a_pickle_is_not_an_fbgemm_trace(tmp_path, capsys):
    (tmp_path / "evil.pt").write_bytes(pickle.dumps({"indices": [1, 2]}))
    code, _, err = run(capsys, "trace", "import", "fbgemm", tmp_path / "evil.pt", "-o", tmp_path / "o.npz")
    one_error_line(code, err, "sdm trace import", "evil.pt", "not an FBGEMM trace file (")
    said = err.replace(str(tmp_path), "")  # the test's own folder is named for pickles
    assert not re.search("weights_only|allow_pickle|pickle", said) and not (tmp_path / "o.npz").exists()


# -- 7: direct IO: measured beside modeled, each tier's own time and true mode -----------------


def test_direct_io_reports_measured_time_and_true_modes(tmp_path):
    path = build_store(tmp_path / "s", [1000, 1000], dim=64)
    r = replay(TINY, "sdm-nand", store=path, io_mode="direct", sla_us=None)
    modes = {t["name"]: t["io_mode"] for t in r.tiers}
    assert modes == {"cache": "modeled", "mmap": "direct"}
    # each tier's own time: together no more than the serving calls took (the cache's time
    # once included the SCM reads it waited on, counting them twice)
    assert sum(t["wall_ns"] for t in r.tiers) <= r.wall_ns.sum()
    assert all(t["wall_ns"] > 0 for t in r.tiers)
    text = replay_markdown(r)
    assert "| modeled (device model) |" in text and "| measured (wall clock, direct) |" in text
    assert r.to_json()["measured_latency_us"]["p50"] > 0
    three = replay(TINY, "three-tier", store=path, io_mode="direct", sla_us=None)
    assert {t["io_mode"] for t in three.tiers} == {"modeled"}  # none reads with O_DIRECT


# -- 8: text that matches the run ---------------------------------------------------------------


def test_run_says_what_a_request_is(capsys):
    code, out, _ = run(capsys, "run", "--trace", INFERENCE, "--presets", "dram", "sdm-nand", "--dim", "4",
                       "--batches", "1", "--no-report")
    assert code == 0
    assert "a request = one request id (user x items) of a batch" in out and "one batch)" not in out
    assert "1 batch, 8 requests of 32 samples" in out


def test_one_batch_is_singular(capsys):
    code, out, _ = run(capsys, "replay", TINY, "--max-batches", "1", "--dim", "8")
    assert code == 0 and "from 1 batch;" in out and "1 batches" not in out


def test_trace_gen_list_has_a_header_and_one_table_for_stack_distance(capsys):
    code, out, _ = run(capsys, "trace", "gen", "--list")
    lines = out.splitlines()
    assert code == 0 and lines[0].split()[:3] == ["profile", "kind", "tables"]
    stack = next(line for line in lines if line.startswith("stack-distance"))
    assert stack.split()[2] == "1" and "one table" in stack


def test_every_sweep_option_has_help(capsys):
    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    out = capsys.readouterr().out
    for option in ("--dim", "--fmt", "--request-size"):
        block = out[out.index(option):].split("\n  -")[0]
        assert len(block.split()) > 3, block  # the option, its metavar, then words


def test_trace_import_help_is_each_kinds_own(capsys):
    helps = {}
    for kind in ("fbgemm", "dlrm-trace", "dlrm-dist", "criteo"):
        with pytest.raises(SystemExit):
            main(["trace", "import", kind, "--help"])
        helps[kind] = capsys.readouterr().out
    assert len(set(helps.values())) == 4
    assert "--limit" in helps["criteo"] and "--limit" not in helps["fbgemm"]
    assert "--lookups" in helps["dlrm-dist"] and "--lookups" not in helps["dlrm-trace"]


# -- 9: scenario errors name the unknown key and every allowed one ------------------------------


def _scenario(tmp_path, old, new):
    text = (ROOT / "scenarios" / "small-model.toml").read_text().replace(old, new, 1)
    (tmp_path / "s.toml").write_text(text)
    return tmp_path / "s.toml"


def test_a_misspelt_scenario_key_is_named(tmp_path):
    from sdm.report.scenario import load_scenario

    with pytest.raises(ConfigError, match=r"base_watts is missing.*unknown key 'base_wats'"):
        load_scenario(_scenario(tmp_path, "base_watts = 400.0", "base_wats = 400.0"))
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['tables'\]; allowed: .*'model'.*'traffic'"):
        load_scenario(_scenario(tmp_path, 'name = "small-model"', 'name = "small-model"\ntables = 3'))


# -- 10: one rule for each thing -----------------------------------------------------------------


def test_an_output_file_needs_its_folder_everywhere(tmp_path, capsys):
    missing = tmp_path / "no" / "such" / "x.json"
    for argv in (["replay", TINY, "--dim", "8", "--json", missing], ["sweep", TINY, "--json", missing],
                 ["sweep", TINY, "--plot", tmp_path / "no" / "p.png"],
                 ["trace", "gen", "--batches", "1", "-o", missing]):
        code, _, err = run(capsys, *argv)
        assert code == 2 and "does not exist" in err, (argv, err)
    assert not (tmp_path / "no").exists()
    code, _, _ = run(capsys, "replay", TINY, "--dim", "8", "--out", tmp_path / "new" / "dir")
    assert code == 0 and (tmp_path / "new" / "dir" / "summary.md").is_file()  # a directory option


def test_ctrl_c_is_one_line_and_exit_130(capsys, monkeypatch):
    import sdm.host

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(sdm.host, "replay_on_host", interrupted)  # what `sdm replay` runs
    code, out, err = run(capsys, "replay", TINY)
    assert code == 130 and out == "" and err.strip() == "sdm replay: interrupted"


def test_lookup_calls_count_as_batches(tmp_path):
    path = build_store(tmp_path / "s", [100], dim=4)
    with sdm.Store.open(path) as store:
        store.lookup("emb_0", [1, 2])
        store.lookup_raw("emb_0", [3])
        store.embedding_bag("emb_0", [1], [0, 1])
        assert (store.stats()["batches"], store.stats()["lookups"]) == (3, 4)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 1e39])
def test_non_finite_weights_are_refused_like_non_finite_rows(tmp_path, bad):
    path = build_store(tmp_path / "s", [100], dim=4)
    weights = np.array([1.0, bad])
    with pytest.raises(InvalidArgumentError, match=r"per_sample_weights must be finite .* at 1"):
        sdm.embedding_bag(np.ones((100, 4), np.float32), np.array([0, 1]), np.array([0, 2]),
                          per_sample_weights=weights)
    with sdm.Store.open(path) as store, pytest.raises(InvalidArgumentError, match="finite"):
        store.embedding_bag("emb_0", [0, 1], [0, 2], per_sample_weights=weights)
    with sdm.Store.open(path) as store, pytest.raises(InvalidArgumentError, match="finite"):
        store.update_rows("emb_0", [0], np.full((1, 4), bad))


# -- 11: big temporary stores are announced, progress shows off a terminal -----------------------


def test_progress_lines_off_a_terminal(monkeypatch):
    import sdm.progress

    monkeypatch.setattr(sdm.progress, "LINE_INTERVAL_S", 0.0)
    stream = io.StringIO()
    bar = sdm.progress.progress_bar(total=4, desc="write emb_0", unit="row", show=True, stream=stream)
    for _ in range(2):
        bar.update(2)
    bar.close()
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("write emb_0: 2 of 4 (50%) rows") and lines[-1].startswith("write emb_0: 4 of 4")
    assert "\r" not in stream.getvalue()
    quiet = io.StringIO()  # a library call stays quiet off a terminal unless asked
    sdm.progress.progress_bar(total=4, desc="x", stream=quiet).update(4)
    assert quiet.getvalue() == ""


def test_a_big_temporary_store_is_announced(capsys, monkeypatch):
    import sdm.cli.replay

    monkeypatch.setattr(sdm.cli.replay, "ANNOUNCE_BYTES", 2 * 1000 * 8 * 4)
    code, _, err = run(capsys, "replay", TINY, "--dim", "8")
    assert code == 0
    assert "building a temporary store of the trace's 2 tables, 2,000 rows of dim 8 fp32" in err
    assert "sdm store create DIR --trace" in err
    code, _, err = run(capsys, "replay", TINY, "--dim", "4")  # below the bar: said nothing
    assert code == 0 and "building" not in err


# -- 12: the Criteo importer says that remap flatters SCM --------------------------------------


def test_criteo_remap_is_explained_in_help_and_readme(capsys):
    with pytest.raises(SystemExit):
        main(["trace", "import", "criteo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "flatters SCM" in text and "--table-sizes criteo-kaggle" in text
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "remap" in readme and "flatters SCM" in readme
