"""`sdm trace gen | import | stats` run in-process through sdm.cli.main."""

import json
from pathlib import Path

import numpy as np

from sdm.cli import main
from sdm.trace import load

FIX = Path("/work/shared/fixtures")


def _json(capsys):
    return json.loads(capsys.readouterr().out)


def test_gen_and_stats(tmp_path, capsys):
    out = tmp_path / "z.npz"
    assert main(["trace", "gen", "--profile", "zipf", "--requests", "1000", "--batch-size", "250",
                 "--seed", "3", "--json", "-o", str(out)]) == 0
    info = _json(capsys)
    assert info["batches"] == 4 and info["samples"] == 1000 and info["metadata"]["seed"] == 3
    assert main(["trace", "stats", str(out), "--json"]) == 0
    st = _json(capsys)
    assert st["lookups"] == info["lookups"] and len(st["tables"]) == 4
    assert st["reuse_histogram"]["bins"][-1] == 32768 and len(st["reuse_histogram"]["rows"]) == 17
    assert sum(t["lookups"] for t in st["tables"]) == st["lookups"]
    assert main(["trace", "stats", str(out)]) == 0
    assert "reuse bin" in capsys.readouterr().out


def test_stats_plots_and_dist_out(tmp_path, capsys):
    out = tmp_path / "u.npz"
    assert main(["trace", "gen", "--profile", "uniform", "--batches", "2", "--batch-size", "64",
                 "--table-size", "500", "-o", str(out)]) == 0
    capsys.readouterr()
    dist = tmp_path / "d.log"
    assert main(["trace", "stats", str(out), "--json", "--plot", str(tmp_path / "p"),
                 "--dist-out", str(dist), "--table", "1"]) == 0
    st = _json(capsys)
    assert len(st["plots"]) == 5 and all(Path(p).exists() for p in st["plots"])
    assert len(dist.read_text().splitlines()) == 3
    # the fitted file drives the stack-distance profile
    sd = tmp_path / "sd.npz"
    assert main(["trace", "gen", "--profile", "stack-distance", "--dist", str(dist), "--batches", "3",
                 "--batch-size", "100", "-o", str(sd)]) == 0
    assert load(sd).table_sizes[0] <= 500


def test_gen_presets_meta_and_list(tmp_path, capsys):
    assert main(["trace", "gen", "--list"]) == 0
    text = capsys.readouterr().out
    for name in ("meta-2021", "criteo-kaggle", "rm3", "inference"):
        assert name in text
    out = tmp_path / "m.npz"
    assert main(["trace", "gen", "--profile", "meta-2021", "--batches", "1", "--batch-size", "512",
                 "--table-size", "100000", "-o", str(out)]) == 0
    tr = load(out)
    assert tr.num_tables == 8 and tr.metadata["profile"] == "meta-2021"


def test_import_commands(tmp_path, capsys):
    out = tmp_path / "d.npz"
    assert main(["trace", "import", "dlrm-trace", str(FIX / "dlrm_input" / "trace.log"), "-o", str(out),
                 "--batch-size", "5", "--json"]) == 0
    assert _json(capsys)["lookups"] == 11
    assert main(["trace", "import", "dlrm-dist", str(FIX / "dlrm_input" / "dist_emb_0.log"), "-o",
                 str(out), "--lookups", "300", "--batch-size", "100"]) == 0
    assert load(out).num_lookups == 300
    line = "\t".join(["1"] + ["2"] * 13 + ["0000abcd"] * 26)
    (tmp_path / "c.txt").write_text(line + "\n" + line + "\n")
    assert main(["trace", "import", "criteo", str(tmp_path / "c.txt"), "-o", str(out),
                 "--table-sizes", "criteo-kaggle"]) == 0
    assert load(out).table_sizes[0] == 1460
    lengths = np.ones((2, 3), dtype=np.int64)
    np.savez(tmp_path / "f.npz", indices=np.arange(6), offsets=np.arange(7), lengths=lengths)
    assert main(["trace", "import", "fbgemm", str(tmp_path / "f.npz"), str(tmp_path / "f.npz"),
                 "-o", str(out), "--batch-size", "2"]) == 0
    assert load(out).batch_sizes.tolist() == [2, 1, 2, 1]


def test_errors_are_one_line(tmp_path, capsys):
    assert main(["trace", "gen", "--profile", "nope", "-o", str(tmp_path / "x.npz")]) == 2
    err = capsys.readouterr().err
    assert "unknown trace profile 'nope'" in err and "Traceback" not in err
    assert main(["trace", "stats", str(tmp_path / "missing.npz")]) == 2
    assert "no trace" in capsys.readouterr().err
    (tmp_path / "bad.txt").write_text("1\t2\n")
    assert main(["trace", "import", "criteo", str(tmp_path / "bad.txt"), "-o", str(tmp_path / "o.npz")]) == 2
    assert "line 1 has 2 tab-separated columns" in capsys.readouterr().err
    assert main(["trace", "gen", "--profile", "zipf"]) == 2
    assert "-o FILE" in capsys.readouterr().err


REPO = Path(__file__).resolve().parents[1]


def _readme_commands():
    text = (REPO / "traces" / "README.md").read_text()
    cmds = []
    for block in text.split("```sh")[1:]:
        cmd = block.split("```")[0].replace("\\\n", " ").split()
        assert cmd[:3] == [".venv/bin/python", "-m", "sdm"]
        cmds.append(cmd[3:])
    return cmds


def test_bundled_traces_are_what_the_readme_commands_make(tmp_path):
    cmds = _readme_commands()
    assert len(cmds) == 4
    total = 0
    for cmd in cmds:
        at = cmd.index("-o")
        bundled = REPO / cmd[at + 1]
        total += bundled.stat().st_size
        cmd[at + 1] = str(tmp_path / bundled.name)
        assert main(cmd) == 0
        assert (tmp_path / bundled.name).read_bytes() == bundled.read_bytes(), bundled.name
        load(bundled)[0]
    assert total <= 5 * 2**20


def test_stats_reference_comparison(tmp_path, capsys):
    out = tmp_path / "m.npz"
    assert main(["trace", "gen", "--profile", "meta-2021", "--batches", "2", "--batch-size", "1024",
                 "--table-size", "200000", "-o", str(out)]) == 0
    capsys.readouterr()
    ref = FIX / "dlrm_datasets" / "locality_stats_2021.txt"
    assert main(["trace", "stats", str(out), "--json", "--reference", str(ref)]) == 0
    r = _json(capsys)["reference"]
    assert r["block"] == "fbgemm_t856_bs65536.pt" and len(r["per_batch_max_abs_diff"]) == 2
    # 129K lookups per batch: no row can reach the top bins, whose shares move down a bin or two
    assert r["max_abs_diff_rows"] < 0.01 and r["max_abs_diff_lookups"] < 0.1
