"""The main job (`sdm run`, what `make run` calls): presets agree on the SHA-256 of their
pooled bytes, which one float32 ulp of one row changes."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np

import sdm
import sdm.cli.run as cli_run
from sdm.cli import main
from sdm.replay.demo import DEFAULT_TRACE, run_demo
from sdm.replay.live import build_store, replay, table_names
from sdm.trace import load

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "traces" / "tiny-zipf.npz")


def test_demo_presets_agree_and_count_reads(tmp_path):
    from sdm.host import attach_host

    def on_host(result, trace, store, preset):
        attach_host(result, trace, preset, store, arrivals=5_000)

    runs = run_demo(("dram", "sdm-nand", "sdm-3dxp"), trace=TINY, dim=8, workdir=str(tmp_path), each=on_host)
    dram, nand, xp = runs
    assert dram.lookups == nand.lookups == xp.lookups > 0
    digests = {r.extra["checksum"] for r in runs}
    assert len(digests) == 1 and re.fullmatch(r"[0-9a-f]{64}", digests.pop())
    assert [t["name"] for t in dram.tiers] == ["dram"]
    assert [t["name"] for t in nand.tiers] == ["cache", "mmap"]
    assert nand.tiers[1]["device"] == "nand-p4500" and xp.tiers[1]["device"] == "optane-p4800x-512"
    assert nand.tiers[1]["reads"] > 0 and nand.tiers[1]["bytes_read"] == nand.tiers[1]["reads"] * 4096
    # same misses, but 512 B sectors read far fewer bytes than 4 KiB pages
    assert nand.tiers[0]["misses"] == xp.tiers[0]["misses"]
    assert xp.tiers[1]["bytes_read"] < nand.tiers[1]["bytes_read"]
    assert all(r.qps_at_sla > 0 and r.host == "this-machine" for r in runs)


def test_the_digest_changes_with_one_ulp_of_one_pooled_value(tmp_path):
    with load(TINY) as tr:
        store = build_store(str(tmp_path / "s"), tr.table_sizes, dim=8, progress=False)
        indices, offsets = tr[0].indices[0], tr[0].offsets[0]
        # a bag of one id in the first measured request: its pooled value is the row itself,
        # so one ulp of the row is one ulp of the output (in a longer bag the sum may round it away)
        bag = int(np.flatnonzero(np.diff(offsets) == 1)[0])
        row = int(indices[offsets[bag]])

    def digest():
        return replay(TINY, "dram", store=store, sla_us=None, checksum=True).extra["checksum"]

    before = digest()
    assert digest() == before  # deterministic
    name = table_names(1)[0]
    with sdm.Store.open(store) as s:
        rows = s.lookup(name, [row])
        nudged = rows.copy()
        nudged[0, 3] = np.nextafter(rows[0, 3], np.float32(np.inf))
        s.update_rows(name, [row], nudged)
        ulps = np.abs(s.lookup(name, [row]).view(np.int32) - rows.view(np.int32))
        assert ulps.tolist() == [[0, 0, 0, 1, 0, 0, 0, 0]]  # one ulp of one value
        pooled = s.embedding_bag(name, indices, offsets)
    assert pooled[bag].tolist() == nudged[0].tolist()
    assert digest() != before


def test_default_trace_is_bundled():
    assert DEFAULT_TRACE.is_file()


def test_cli_run_prints_a_table_and_writes_the_report(capsys, tmp_path):
    report = tmp_path / "report"
    assert main(["run", "--trace", TINY, "--dim", "8", "--batches", "2", "--report", str(report)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"pooled results identical across presets: yes \(SHA-256 of the pooled bytes "
                     r"[0-9a-f]{16}\.\.\.\)", out), out
    for preset in ("dram", "sdm-nand", "sdm-3dxp"):
        assert f"| {preset} |" in out
    assert "QPS at SLA" in out and "read amp." in out
    assert "savings vs dram" in out and "| qps-bound | sdm-nand |" in out
    data = json.loads((report / "report.json").read_text())
    assert {c["name"] for sc in data["scenarios"] for c in sc["configs"]} >= {"dram", "sdm-nand", "sdm-3dxp"}
    assert (report / "report.md").is_file() and (report / "report.html").is_file()


def test_cli_run_json(capsys, tmp_path):
    assert main(["run", "--trace", TINY, "--dim", "8", "--batches", "1", "--presets", "dram", "--json",
                 "--no-report"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["identical"] and data["runs"][0]["config"] == "dram" and "report" not in data
    assert data["pooled_sha256"] == [data["runs"][0]["extra"]["checksum"]]
    assert not (tmp_path / "report").exists()


def test_cli_run_says_no_when_one_digest_differs(capsys, monkeypatch):
    """Identical only when every preset's digest is equal: one differing digest (what one ulp
    of one pooled value gives, as above) makes ``sdm run`` say NO and exit 1."""
    def demo(*args, **kwargs):
        runs = run_demo(*args, **kwargs)
        runs[-1].extra["checksum"] = hashlib.sha256(b"one ulp off").hexdigest()
        return runs

    monkeypatch.setattr(cli_run, "run_demo", demo)
    assert main(["run", "--trace", TINY, "--dim", "8", "--batches", "1", "--presets", "dram", "sdm-nand",
                 "--no-report"]) == 1
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("pooled results identical"))
    assert re.fullmatch(r"pooled results identical across presets: NO \(SHA-256 of the pooled bytes: "
                        r"dram [0-9a-f]{16}\.\.\., sdm-nand " + hashlib.sha256(b"one ulp off").hexdigest()[:16]
                        + r"\.\.\.\)", line), line
    assert main(["run", "--trace", TINY, "--dim", "8", "--batches", "1", "--presets", "dram", "sdm-nand",
                 "--no-report", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["identical"] is False and len(set(data["pooled_sha256"])) == 2


def test_make_run_tells_one_story_the_power_table_uses_the_replay_tables_qps(capsys, tmp_path):
    """Issue 18: the per-host QPS at the SLA in ``sdm run``'s replay table is the number its power
    table (and report.json) uses, with the hit rate it was measured at, for every scenario."""
    report = tmp_path / "report"
    assert main(["run", "--trace", TINY, "--dim", "8", "--report", str(report)]) == 0
    out = capsys.readouterr().out
    replay = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 9 and cells[0] in ("dram", "sdm-nand", "sdm-3dxp"):
            replay[cells[0]] = (cells[6], cells[3])            # QPS at SLA, hit rate
    assert set(replay) == {"dram", "sdm-nand", "sdm-3dxp"}, out
    tail = out[out.index("Power and cost"):]                 # the power table, after the replay table
    power = [[c.strip() for c in line.strip().strip("|").split("|")] for line in tail.splitlines()
             if line.startswith("| ") and line.count("|") == 10 and not line.startswith("| scenario")]
    assert len(power) == 12, out                              # 4 shipped scenarios x 3 configs
    for scenario, config, qps, source, hit, *_ in power:
        assert (qps, hit) == replay[config], (scenario, config)
        assert source == "host-model"
    data = json.loads((report / "report.json").read_text())
    runs = {r["config"]: r for r in data["replays"]}
    for sc in data["scenarios"]:
        for c in sc["configs"]:
            assert c["qps_per_host"] == runs[c["name"]]["qps_at_sla"] and c["qps_source"] == "host-model"
            assert c["hit_rate"] == runs[c["name"]]["hit_rate"]
    assert data["host_model"]["computed_runs"] == 0  # the replays' own host-model figures, not re-run
