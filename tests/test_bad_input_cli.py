"""Bad-input corpus over the command line: every command and subcommand of ``sdm``.

Each case feeds one malformed argument or file to one command, in-process through
``sdm.cli.main``, and asserts: a non-zero exit; stderr holds exactly one error line, which
starts with ``sdm <command>`` (``sdm trace gen``, ``sdm replay``...) and ``error:`` and names
the bad value or field (the command's own check: exit 2 with nothing else on stderr;
argparse's usage error: exit 2 after the usage lines; the system refusing an output: exit 1);
no ``Traceback`` anywhere; and no half-written ``*.tmp-*`` file left beside the outputs. A
few cases run ``python -m sdm`` in a real subprocess to prove nothing escapes the process.

A case is ``(id, argv, words)`` (or ``(id, argv, words, kind)`` with kind ``"usage"`` for an
argparse error, ``"os"`` for an OS error): ``argv`` holds ``{name}`` placeholders filled from
the fixture's files (``{out}`` is the case's own empty directory), ``words`` must all appear
in the error line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import sdm
from sdm.cli import main

ROOT = Path(__file__).resolve().parents[1]
FIX = Path("/work/shared/fixtures/dlrm_input")
DLRM_TRACE = FIX / "trace.log"
DLRM_DIST = FIX / "dist_emb_0.log"

# A scenario with typed QPS and hit rates (as shipped before they named a workload), so that
# every bad-input case fails on its own field and no case runs the host model.
SCENARIO = (ROOT / "tests" / "data" / "typed-scenarios" / "small-model.toml").read_text()
CRITEO_LINE = "\t".join(["1"] + ["2"] * 13 + ["0000abcd"] * 26) + "\n"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A tiny trace and a store of its tables, plus every kind of bad file a command may meet."""
    d = tmp_path_factory.mktemp("badcli")
    files = {"dir": str(d)}

    def put(name, data):
        p = d / name
        p.write_bytes(data if isinstance(data, bytes) else data.encode())
        files[name.replace(".", "_").replace("-", "_")] = str(p)
        return str(p)

    trace = str(d / "tiny.npz")
    assert main(["trace", "gen", "--profile", "zipf", "--batches", "4", "--batch-size", "16", "--tables", "2",
                 "--table-size", "200", "--seed", "1", "--json", "-o", trace]) == 0
    files["trace"] = trace
    raw = Path(trace).read_bytes()
    put("garbage.npz", b"\x00\xffnot a zip at all" * 8)
    put("empty.npz", b"")
    put("trunc.npz", raw[: len(raw) // 3])
    np.savez(d / "other.npz", a=np.arange(3))
    files["other_npz"] = str(d / "other.npz")
    put("notes.txt", "hello\n")
    put("binary.bin", bytes(range(256)) * 4)
    put("regular", "a regular file\n")
    files["under_file"] = os.path.join(files["regular"], "sub", "out")
    # configs (hierarchy TOML)
    put("bad.toml", "[[[ not toml")
    put("binary.toml", b"\x00\xff\xfe")
    put("tiers-str.toml", 'tiers = "x"\n')
    put("qd0.toml", '[[tiers]]\nkind = "dram"\nqueue_depth = 0\n')
    put("device-nan.toml", '[[tiers]]\nkind = "dram"\ndevice = "nope"\n')
    put("cache-neg.toml", '[[tiers]]\nkind = "cache"\ncapacity_bytes = -1\n[[tiers]]\nkind = "lmdb"\n')
    put("empty.toml", "")
    # scenarios
    put("scen-qps-nan.toml", SCENARIO.replace("target_qps = 400000.0", "target_qps = nan"))
    put("scen-qps-neg.toml", SCENARIO.replace("target_qps = 400000.0", "target_qps = -1.0"))
    put("scen-qps-str.toml", SCENARIO.replace("target_qps = 400000.0", 'target_qps = "lots"'))
    put("scen-qps-inf.toml", SCENARIO.replace("target_qps = 400000.0", "target_qps = inf"))
    put("scen-hit-rate.toml", SCENARIO.replace("hit_rate = 0.9", "hit_rate = 1.5", 1))
    put("scen-device.toml", SCENARIO.replace('device = "nand-p4500"', 'device = "floppy"'))
    put("scen-preset.toml", SCENARIO.replace('preset = "criteo-terabyte"', 'preset = "rm99"'))
    put("scen-no-model.toml", SCENARIO.replace("[model]\npreset = \"criteo-terabyte\"\n", ""))
    put("scen-years.toml", SCENARIO.replace("years = 3.0", "years = -1.0"))
    put("scen-slots.toml", SCENARIO.replace("dram_slots = 24", "dram_slots = -24"))
    # replay results for `report --replay`
    put("bad.json", "{not json")
    put("list.json", "[1, 2, 3]")
    put("empty.json", "")
    put("binary.json", b"\xff\xfe\x00")
    put("neither.json", '{"hello": 1}')
    put("nan.json", "NaN")
    # distribution files (reference DLRM 3-line format) and locality_stats references
    put("dist-2lines.log", "1 2\n3 4\n")
    put("dist-words.log", "a b\nc d\ne f\n")
    put("dist-probs.log", "1, 2\n0, 1\n0.9, 0.1\n")
    put("dist-lengths.log", "1, 2\n0, 1, 2\n0.5, 1.0\n")
    put("dist-nan.log", "1, 2\n0, 1\nnan, 1.0\n")
    put("dist-huge.log", "1, 99999999999999999999999\n0, 1\n0.5, 1.0\n")
    # trace import sources
    put("criteo-short.txt", "1\t2\t3\n")
    put("criteo-hash.txt", CRITEO_LINE.replace("0000abcd", "zzzz", 1))
    put("criteo.txt", CRITEO_LINE * 2)
    put("dlrm-neg.log", "1, 2, -3\n")
    np.savez(d / "fbgemm-bad-offsets.npz", indices=np.arange(6), offsets=np.array([0, 5, 2, 6]),
             lengths=np.ones((1, 3), dtype=np.int64))
    files["fbgemm_bad_offsets_npz"] = str(d / "fbgemm-bad-offsets.npz")
    np.savez(d / "fbgemm-float.npz", indices=np.linspace(0, 1, 6), offsets=np.arange(7),
             lengths=np.ones((2, 3), dtype=np.int64))
    files["fbgemm_float_npz"] = str(d / "fbgemm-float.npz")
    # a store of the trace's tables, a valid placement, a store of other tables
    with sdm.trace.load(trace) as tr:
        specs = [sdm.TableSpec(f"t{i}", int(n), 8, "fp32") for i, n in enumerate(tr.table_sizes)]
    with sdm.Store.create(d / "store", specs):
        pass
    files["store"] = str(d / "store")
    with sdm.Store.create(d / "store-other", [sdm.TableSpec("x", 5, 4)]):
        pass
    files["store_other"] = str(d / "store-other")
    return files


def run_cli(argv):
    """``main(argv)`` -> (exit code, usage error?) with argparse's SystemExit caught."""
    try:
        return main(argv), False
    except SystemExit as exc:
        return exc.code, True


def check(argv, words, kind, capsys, out_dir):
    code, usage = run_cli(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert code not in (0, None), f"exit {code}: {argv} was accepted\n{out}\n{err}"
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error:" in ln]
    assert len(errors) == 1, f"want one error line, got {lines!r}"
    line = errors[0]
    if kind == "usage":
        assert usage and code == 2, f"not an argparse usage error: exit {code}, {line!r}"
        assert line == lines[-1] and line.startswith("sdm") and ": error: " in line, line
    else:
        assert not usage, f"argparse refused it, but the command should: {line!r}"
        assert lines == [line], f"more than the error line on stderr: {lines!r}"
        want = 1 if kind == "os" else 2
        assert code == want, f"exit {code}, want {want}: {line!r}"
    if kind != "usage":  # argparse names the parser that refused (``sdm``, ``sdm trace gen``)
        with_sub = argv[0] in ("trace", "shard", "store") or argv[1:2] == ["calibrate"]
        prefix = "sdm " + " ".join(argv[:2] if with_sub else argv[:1])
        assert line.startswith(prefix + ": error: "), f"{line!r} does not start with {prefix!r}: error:"
    for word in words:
        assert word in line, f"{word!r} not in {line!r}"
    leftovers = [p for p in Path(out_dir).rglob("*") if ".tmp-" in p.name]
    assert not leftovers, f"half-written files left: {leftovers}"
    return line


def cases(*rows):
    out = []
    for r in rows:
        case_id, argv, words = r[:3]
        kind = r[3] if len(r) > 3 else "error"
        marks = r[4] if len(r) > 4 else ()
        out.append(pytest.param(argv, words, kind, id=case_id, marks=marks))
    return out


def fill(argv, env, out_dir):
    values = dict(env, out=str(out_dir))
    return [a.format(**values) for a in argv]


USAGE = "usage"

# -- top level, devices ------------------------------------------------------------------

TOP = cases(
    ("no-command", [], ["a command is needed", "replay"], USAGE),
    ("unknown-command", ["bogus"], ["invalid choice", "'bogus'"], USAGE),
    ("unknown-top-option", ["--bogus"], ["unrecognized arguments", "--bogus"], USAGE),
    ("devices-unknown-option", ["devices", "--bogus"], ["unrecognized arguments", "--bogus"], USAGE),
    ("devices-extra-arg", ["devices", "nand"], ["invalid choice", "'nand'"], USAGE),
    ("calibrate-missing-path", ["devices", "calibrate", "{dir}/missing"], ["neither a directory nor a file"]),
    ("calibrate-small-file", ["devices", "calibrate", "{regular}"], ["calibrating needs at least"]),
    ("calibrate-seconds-zero", ["devices", "calibrate", "{dir}", "--seconds", "0"], ["seconds", "0"]),
    ("calibrate-out-under-file", ["devices", "calibrate", "{dir}", "-o", "{under_file}/d.toml"],
     ["output directory"]),
)

# -- trace gen -----------------------------------------------------------------------------

G = ["trace", "gen", "-o", "{out}/g.npz", "--batches", "1", "--batch-size", "8"]
GEN = cases(
    ("gen-no-output", ["trace", "gen"], ["-o FILE"]),
    ("gen-no-subcommand", ["trace"], ["a subcommand is needed", "gen"], USAGE),
    ("gen-unknown-subcommand", ["trace", "bogus"], ["invalid choice", "'bogus'"], USAGE),
    ("gen-profile-unknown", G + ["--profile", "bogus"], ["'bogus'", "zipf"]),
    ("gen-requests-negative", ["trace", "gen", "-o", "{out}/g.npz", "--requests", "-5"], ["requests", ">= 1", "-5"]),
    ("gen-requests-zero", ["trace", "gen", "-o", "{out}/g.npz", "--requests", "0"], ["requests", ">= 1", "0"]),
    ("gen-requests-text", ["trace", "gen", "-o", "{out}/g.npz", "--requests", "abc"], ["--requests", "'abc'"], USAGE),
    ("gen-requests-1e999", ["trace", "gen", "-o", "{out}/g.npz", "--requests", "1e999"], ["--requests", "'1e999'"],
     USAGE),
    ("gen-requests-huge", ["trace", "gen", "-o", "{out}/g.npz", "--requests", str(10**20)],
     ["requests", str(10**20), "2**63 - 1"]),
    ("gen-batches-zero", ["trace", "gen", "-o", "{out}/g.npz", "--batches", "0"], ["batches", ">= 1", "0"]),
    ("gen-batch-size-negative", ["trace", "gen", "-o", "{out}/g.npz", "--batch-size", "-3"], ["batch_size", "-3"]),
    ("gen-batch-size-huge", ["trace", "gen", "-o", "{out}/g.npz", "--batch-size", str(2**64)],
     ["batch_size", str(2**64), "2**63 - 1"]),
    ("gen-tables-zero", G + ["--tables", "0"], ["tables", "[1, 65536]", "0"]),
    ("gen-tables-huge", G + ["--tables", "100000000"], ["tables", "[1, 65536]", "100000000"]),
    ("gen-tables-nan", G + ["--tables", "nan"], ["--tables", "'nan'"], USAGE),
    ("gen-table-size-zero", G + ["--table-size", "0"], [">= 1 row", "0"]),
    ("gen-table-size-negative", G + ["--table-size", "-10"], [">= 1 row", "-10"]),
    ("gen-table-size-text", G + ["--table-size", "abc"], ["table_size", "'abc'"]),
    ("gen-table-size-nan", G + ["--table-size", "nan"], ["table_size", "'nan'"]),
    ("gen-table-size-1e999", G + ["--table-size", "1e999"], ["table_size", "'1e999'"]),
    ("gen-table-size-huge", G + ["--table-size", "9" * 23], ["table_size", "9" * 23, "2**63 - 1"]),
    ("gen-table-size-list-length", G + ["--table-size", "10,,20"], ["table_size", "2 entries", "4 tables"]),
    ("gen-pooling-negative", G + ["--pooling", "-1"], ["pooling", ">= 0", "-1"]),
    ("gen-pooling-nan", G + ["--pooling", "nan"], ["pooling", "finite", "'nan'"]),
    ("gen-pooling-1e999", G + ["--pooling", "1e999"], ["pooling", "finite", "'1e999'"]),
    ("gen-alpha-negative", G + ["--alpha", "-1"], ["alpha", ">= 0", "-1"]),
    ("gen-alpha-nan", G + ["--alpha", "nan"], ["alpha", "finite", "'nan'"]),
    ("gen-alpha-text", G + ["--alpha", "x"], ["alpha", "'x'"]),
    ("gen-alpha-too-many", G + ["--alpha", "1,2,3,4,5,6,7,8,9"], ["alpha", "9 entries", "4 tables"]),
    ("gen-max-rows-zero", G + ["--max-rows", "0"], ["max_rows", ">= 1", "0"]),
    ("gen-drift-nan", G + ["--profile", "drift", "--drift", "nan"], ["drift", "finite", "nan"]),
    ("gen-drift-1e999", G + ["--profile", "drift", "--drift", "1e999"], ["drift", "finite", "inf"]),
    ("gen-items-per-request-zero", G + ["--profile", "inference", "--items-per-request", "0"],
     ["items_per_request", ">= 1", "0"]),
    ("gen-dense-negative", G + ["--dense", "-1"], ["dense", ">= 0", "-1"]),
    ("gen-seed-negative", G + ["--seed", "-1"], ["seed", ">= 0", "-1"]),
    ("gen-seed-text", G + ["--seed", "x"], ["--seed", "'x'"], USAGE),
    ("gen-stack-distance-no-dist", G + ["--profile", "stack-distance"], ["stack-distance", "--dist FILE"]),
    ("gen-dist-missing", G + ["--profile", "stack-distance", "--dist", "{dir}/missing.log"],
     ["no distribution file", "missing.log"]),
    ("gen-dist-directory", G + ["--profile", "stack-distance", "--dist", "{dir}"], ["is a directory"]),
    ("gen-dist-binary", G + ["--profile", "stack-distance", "--dist", "{binary_bin}"], ["binary.bin", "UTF-8"]),
    ("gen-dist-empty", G + ["--profile", "stack-distance", "--dist", "{empty_npz}"], ["empty.npz", "3 lines", "got 0"]),
    ("gen-dist-two-lines", G + ["--profile", "stack-distance", "--dist", "{dist_2lines_log}"],
     ["dist-2lines.log", "3 lines", "got 2"]),
    ("gen-dist-words", G + ["--profile", "stack-distance", "--dist", "{dist_words_log}"], ["dist-words.log", "line 1", "'a b'"]),
    ("gen-dist-probabilities", G + ["--profile", "stack-distance", "--dist", "{dist_probs_log}"],
     ["dist-probs.log", "line 3", "non-decreasing"]),
    ("gen-dist-lengths", G + ["--profile", "stack-distance", "--dist", "{dist_lengths_log}"],
     ["dist-lengths.log", "line 2", "3 stack distances"]),
    ("gen-dist-nan", G + ["--profile", "stack-distance", "--dist", "{dist_nan_log}"], ["dist-nan.log", "line 3", "'nan'", "finite"]),
    ("gen-dist-huge-key", G + ["--profile", "stack-distance", "--dist", "{dist_huge_log}"],
     ["dist-huge.log", "line 1", "99999999999999999999999", "2**63 - 1"]),
    ("gen-dist-wrong-profile", G + ["--profile", "zipf", "--dist", "{notes_txt}"], ["--dist", "stack-distance", "'zipf'"]),
    ("gen-output-is-directory", ["trace", "gen", "-o", "{out}", "--batches", "1", "--batch-size", "8"],
     ["cannot write a trace", "is a directory"]),
    ("gen-output-under-file", ["trace", "gen", "-o", "{under_file}"], ["sub", "regular", "is a file"]),
    ("gen-output-unwritable", ["trace", "gen", "-o", "/proc/sdm-bad-input.npz", "--batches", "1",
                               "--batch-size", "8"], ["cannot write a trace", "/proc/sdm-bad-input.npz"]),
)

# -- trace import ---------------------------------------------------------------------------

I = ["trace", "import"]
O = ["-o", "{out}/i.npz"]
IMPORT = cases(
    ("import-kind-unknown", I + ["bogus", "{notes_txt}"] + O, ["KIND", "'bogus'"], USAGE),
    ("import-no-output", I + ["criteo", "{notes_txt}"], ["-o/--output"], USAGE),
    ("fbgemm-missing", I + ["fbgemm", "{dir}/missing.npz"] + O, ["no file", "missing.npz"]),
    ("fbgemm-directory", I + ["fbgemm", "{dir}"] + O, ["is a directory"]),
    ("fbgemm-garbage", I + ["fbgemm", "{garbage_npz}"] + O, ["garbage.npz", "not a readable .npz"]),
    ("fbgemm-empty", I + ["fbgemm", "{empty_npz}"] + O, ["empty.npz", "not a readable .npz"]),
    ("fbgemm-truncated", I + ["fbgemm", "{trunc_npz}"] + O, ["trunc.npz", "not a readable .npz"]),
    ("fbgemm-text", I + ["fbgemm", "{notes_txt}"] + O, ["notes.txt", "torch"]),
    ("fbgemm-sdm-trace", I + ["fbgemm", "{trace}"] + O, ["tiny.npz", "'indices'"]),
    ("fbgemm-bad-offsets", I + ["fbgemm", "{fbgemm_bad_offsets_npz}"] + O, ["fbgemm-bad-offsets.npz", "offsets"]),
    ("fbgemm-float-ids", I + ["fbgemm", "{fbgemm_float_npz}"] + O, ["fbgemm-float.npz", "indices", "integer"]),
    ("fbgemm-table-sizes-text", I + ["fbgemm", "{trace}", "--table-sizes", "abc"] + O, ["--table-sizes", "'abc'"]),
    ("fbgemm-batch-size-zero", I + ["fbgemm", "{trace}", "--batch-size", "0"] + O, ["batch_size", ">= 1", "0"]),
    ("fbgemm-output-under-file", I + ["fbgemm", "{trace}", "-o", "{under_file}"], ["regular", "is a file"]),
    ("dlrm-trace-missing", I + ["dlrm-trace", "{dir}/missing.log"] + O, ["no file", "missing.log"]),
    ("dlrm-trace-binary", I + ["dlrm-trace", "{garbage_npz}"] + O, ["garbage.npz", "line 1", "not an integer"]),
    ("dlrm-trace-empty", I + ["dlrm-trace", "{empty_npz}"] + O, ["empty.npz", "no row ids"]),
    ("dlrm-trace-negative-id", I + ["dlrm-trace", "{dlrm_neg_log}"] + O, ["dlrm-neg.log", "negative", "-3"]),
    ("dlrm-trace-pooling-zero", I + ["dlrm-trace", str(DLRM_TRACE), "--pooling", "0"] + O, ["pooling", ">= 1", "0"]),
    ("dlrm-trace-batch-size-zero", I + ["dlrm-trace", str(DLRM_TRACE), "--batch-size", "0"] + O,
     ["batch_size", ">= 1", "0"]),
    ("dlrm-trace-two-files", I + ["dlrm-trace", str(DLRM_TRACE), str(DLRM_TRACE)] + O, ["one file", "got 2"]),
    ("dlrm-dist-missing", I + ["dlrm-dist", "{dir}/missing.log"] + O, ["no distribution file", "missing.log"]),
    ("dlrm-dist-text", I + ["dlrm-dist", "{notes_txt}"] + O, ["notes.txt", "3 lines", "got 1"]),
    ("dlrm-dist-lookups-zero", I + ["dlrm-dist", str(DLRM_DIST), "--lookups", "0"] + O, ["lookups", "[1, 2**63 - 1]", "0"]),
    ("dlrm-dist-lookups-negative", I + ["dlrm-dist", str(DLRM_DIST), "--lookups", "-5"] + O, ["lookups", "-5"]),
    ("dlrm-dist-lookups-huge", I + ["dlrm-dist", str(DLRM_DIST), "--lookups", str(10**20)] + O,
     ["lookups", str(10**20), "2**63 - 1"]),
    ("dlrm-dist-lookups-1e999", I + ["dlrm-dist", str(DLRM_DIST), "--lookups", "1e999"] + O, ["--lookups", "'1e999'"],
     USAGE),
    ("dlrm-dist-pooling-zero", I + ["dlrm-dist", str(DLRM_DIST), "--pooling", "0", "--lookups", "10"] + O,
     ["pooling", "0"]),
    ("dlrm-dist-batch-size-zero", I + ["dlrm-dist", str(DLRM_DIST), "--batch-size", "0", "--lookups", "10"] + O,
     ["batch_size", "0"]),
    ("dlrm-dist-seed-negative", I + ["dlrm-dist", str(DLRM_DIST), "--seed", "-1", "--lookups", "10"] + O,
     ["seed", "-1"]),
    ("criteo-missing", I + ["criteo", "{dir}/missing.txt"] + O, ["no file", "missing.txt"]),
    ("criteo-directory", I + ["criteo", "{dir}"] + O, ["is a directory"]),
    ("criteo-empty", I + ["criteo", "{empty_npz}"] + O, ["empty.npz", "no Criteo lines"]),
    ("criteo-short-line", I + ["criteo", "{criteo_short_txt}"] + O, ["criteo-short.txt", "line 1", "40"]),
    ("criteo-bad-hash", I + ["criteo", "{criteo_hash_txt}"] + O, ["criteo-hash.txt", "line 1", "'zzzz'"]),
    ("criteo-binary", I + ["criteo", "{binary_bin}"] + O, ["binary.bin", "line 1", "40"]),
    ("criteo-table-sizes-profile", I + ["criteo", "{criteo_txt}", "--table-sizes", "bogus"] + O, ["'bogus'"]),
    ("criteo-table-sizes-count", I + ["criteo", "{criteo_txt}", "--table-sizes", "1,2,3"] + O, ["26 sizes", "[1, 2, 3]"]),
    ("criteo-limit-zero", I + ["criteo", "{criteo_txt}", "--limit", "0"] + O, ["limit", ">= 1", "0"]),
    ("criteo-limit-negative", I + ["criteo", "{criteo_txt}", "--limit", "-1"] + O, ["limit", ">= 1", "-1"]),
    ("criteo-batch-size-zero", I + ["criteo", "{criteo_txt}", "--batch-size", "0"] + O, ["batch_size", ">= 1", "0"]),
    ("criteo-output-is-directory", I + ["criteo", "{criteo_txt}", "-o", "{out}"], ["{out}", "is a directory"]),
)

# -- trace stats ----------------------------------------------------------------------------

S = ["trace", "stats"]
STATS = cases(
    ("stats-missing", S + ["{dir}/missing.npz"], ["no trace", "missing.npz"]),
    ("stats-directory", S + ["{dir}"], ["is a directory, not a trace file"]),
    ("stats-garbage", S + ["{garbage_npz}"], ["garbage.npz", "not a readable trace"]),
    ("stats-empty", S + ["{empty_npz}"], ["empty.npz", "not a readable trace"]),
    ("stats-truncated", S + ["{trunc_npz}"], ["trunc.npz", "not a readable trace"]),
    ("stats-foreign-npz", S + ["{other_npz}"], ["other.npz", "'schema_version'", "not an sdm trace"]),
    ("stats-text", S + ["{notes_txt}"], ["notes.txt", "not a readable trace"]),
    ("stats-stack-lookups-negative", S + ["{trace}", "--stack-lookups", "-1"], ["stack_lookups", ">= 0", "-1"]),
    ("stats-stack-lookups-text", S + ["{trace}", "--stack-lookups", "abc"], ["--stack-lookups", "'abc'"], USAGE),
    ("stats-table-out-of-range", S + ["{trace}", "--table", "3"], ["--table 3", "2 tables"]),
    ("stats-table-negative", S + ["{trace}", "--table", "-1", "--dist-out", "{out}/d.log"], ["table -1", "2 tables"]),
    ("stats-dist-out-under-file", S + ["{trace}", "--dist-out", "{under_file}"], ["distribution file", "Not a directory"]),
    ("stats-dist-out-directory", S + ["{trace}", "--dist-out", "{out}"], ["distribution file", "Is a directory"]),
    ("stats-plot-is-file", S + ["{trace}", "--plot", "{regular}"], ["cannot write plots", "regular"]),
    ("stats-reference-missing", S + ["{trace}", "--reference", "{dir}/missing.txt"], ["locality_stats", "missing.txt"]),
    ("stats-reference-directory", S + ["{trace}", "--reference", "{dir}"], ["locality_stats", "is a directory"]),
    ("stats-reference-garbage", S + ["{trace}", "--reference", "{binary_bin}"], ["binary.bin", "no locality_stats block"]),
)

# -- replay ---------------------------------------------------------------------------------

R = ["replay", "{trace}", "--max-batches", "1", "--dim", "8"]
REPLAY = cases(
    ("replay-trace-missing", ["replay", "{dir}/missing.npz"], ["no trace", "missing.npz"]),
    ("replay-trace-directory", ["replay", "{dir}"], ["is a directory"]),
    ("replay-trace-garbage", ["replay", "{garbage_npz}"], ["garbage.npz", "not a readable trace"]),
    ("replay-trace-truncated", ["replay", "{trunc_npz}"], ["trunc.npz", "not a readable trace"]),
    ("replay-trace-foreign", ["replay", "{other_npz}"], ["other.npz", "not an sdm trace"]),
    ("replay-config-unknown", R + ["--config", "bogus"], ["'bogus'", "sdm-nand"]),
    ("replay-config-missing", R + ["--config", "{dir}/missing.toml"], ["missing.toml", "does not exist"]),
    ("replay-config-not-toml", R + ["--config", "{bad_toml}"], ["bad.toml", "not valid TOML"]),
    ("replay-config-binary", R + ["--config", "{binary_toml}"], ["binary.toml", "not UTF-8"]),
    ("replay-config-empty", R + ["--config", "{empty_toml}"], ["at least one tier"]),
    ("replay-config-tiers-str", R + ["--config", "{tiers_str_toml}"], ["'tiers' must be an array of tables"]),
    ("replay-config-queue-depth-0", R + ["--config", "{qd0_toml}"], ["queue_depth", "[1, 1024]", "0"]),
    ("replay-config-device-unknown", R + ["--config", "{device_nan_toml}"], ["'nope'"]),
    ("replay-config-capacity-negative", R + ["--config", "{cache_neg_toml}"], ["capacity_bytes", "-1"]),
    ("replay-config-directory", R + ["--config", "{dir}"], ["neither a preset", "nor a .toml file"]),
    ("replay-cache-bytes-text", R + ["--config", "sdm-nand", "--cache-bytes", "lots"], ["'lots'", "64M"]),
    ("replay-cache-bytes-negative", R + ["--config", "sdm-nand", "--cache-bytes", "-1"], ["'-1'", "at least 1 byte"]),
    ("replay-cache-bytes-zero", R + ["--config", "sdm-nand", "--cache-bytes", "0"], ["'0'", "at least 1 byte"]),
    ("replay-cache-bytes-nan", R + ["--config", "sdm-nand", "--cache-bytes", "nan"], ["'nan'"]),
    ("replay-cache-bytes-1e999", R + ["--config", "sdm-nand", "--cache-bytes", "1e999"], ["'1e999'"]),
    ("replay-cache-bytes-huge", R + ["--config", "sdm-nand", "--cache-bytes", "9" * 20 + "T"],
     ["size", "9" * 20 + "T", "2**63 - 1"]),
    ("replay-cache-bytes-no-cache", R + ["--config", "dram", "--cache-bytes", "64K"], ["'dram'", "no cache tier", "cache_bytes"]),
    ("replay-policy-unknown", R + ["--config", "sdm-nand", "--policy", "bogus"], ["'bogus'", "lru"]),
    ("replay-policy-belady", R + ["--config", "sdm-nand", "--policy", "belady"], ["'belady'", "lru"]),
    ("replay-admission-unknown", R + ["--admission", "bogus"], ["--admission", "'bogus'"], USAGE),
    ("replay-io-mode-unknown", R + ["--io-mode", "fast"], ["--io-mode", "'fast'"], USAGE),
    ("replay-placement-missing", R + ["--config", "sdm-nand", "--placement", "{dir}/missing.npz"],
     ["no placement file", "missing.npz"]),
    ("replay-placement-directory", R + ["--config", "sdm-nand", "--placement", "{dir}"], ["placement", "is a directory"]),
    ("replay-placement-garbage", R + ["--config", "sdm-nand", "--placement", "{garbage_npz}"],
     ["placement file", "garbage.npz", "cannot be read"]),
    ("replay-placement-is-a-trace", R + ["--config", "sdm-nand", "--placement", "{trace}"],
     ["placement file", "tiny.npz", "not a placement file"]),
    ("replay-pooled-cache-bytes-text", R + ["--pooled-cache-bytes", "x"], ["'x'"]),
    ("replay-pooled-cache-bytes-negative", R + ["--pooled-cache-bytes", "-5"], ["'-5'", "at least 1 byte"]),
    ("replay-model-unknown", R[:4] + ["--model", "bogus"], ["'bogus'", "rm1"]),
    ("replay-model-and-dim", R + ["--model", "rm1"], ["--dim", "--model"]),
    ("replay-sla-nan", R + ["--sla-us", "nan"], ["SLA", "nan"]),
    ("replay-sla-negative", R + ["--sla-us", "-1"], ["SLA", "-1.0"]),
    ("replay-sla-zero", R + ["--sla-us", "0"], ["SLA", "0.0"]),
    ("replay-sla-1e999", R + ["--sla-us", "1e999"], ["SLA", "inf"]),
    ("replay-sla-text", R + ["--sla-us", "abc"], ["--sla-us", "'abc'"], USAGE),
    ("replay-store-missing", R[:4] + ["--store", "{dir}/missing-store"], ["no sdm store", "missing-store"]),
    ("replay-store-is-file", R[:4] + ["--store", "{regular}"], ["no sdm store", "regular"]),
    ("replay-store-other-tables", R[:4] + ["--store", "{store_other}"], ["store-other", "1 tables", "the trace has 2"]),
    ("replay-workdir-missing", R + ["--workdir", "{dir}/missing-dir"], ["workdir", "missing-dir", "not a directory"]),
    ("replay-workdir-is-file", R + ["--workdir", "{regular}"], ["workdir", "regular", "not a directory"]),
    ("replay-dim-zero", R[:4] + ["--dim", "0"], ["dim", "[1, 65536]", "0"]),
    ("replay-dim-negative", R[:4] + ["--dim", "-4"], ["dim", "-4"]),
    ("replay-dim-huge", R[:4] + ["--dim", "99999999999"], ["dim", "99999999999", "65536"]),
    ("replay-dim-float", R[:4] + ["--dim", "1e3"], ["--dim", "'1e3'"], USAGE),
    ("replay-fmt-unknown", R + ["--fmt", "fp64"], ["'fp64'", "fp32"]),
    ("replay-request-size-zero", R + ["--request-size", "0"], ["request_size", ">= 1", "0"]),
    ("replay-request-size-negative", R + ["--request-size", "-1"], ["request_size", "-1"]),
    ("replay-warmup-negative", R + ["--warmup", "-1"], ["warmup_batches", ">= 0", "-1"]),
    ("replay-warmup-whole-trace", R + ["--warmup", "100"], ["warmup_batches 100", "4 batches"]),
    ("replay-max-batches-zero", R[:2] + ["--max-batches", "0"], ["max_batches", ">= 1", "0"]),
    ("replay-max-batches-negative", R[:2] + ["--max-batches", "-1"], ["max_batches", "-1"]),
    ("replay-max-batches-nan", R[:2] + ["--max-batches", "nan"], ["--max-batches", "'nan'"], USAGE),
    ("replay-seed-negative", R + ["--seed", "-1"], ["seed", ">= 0", "-1"]),
    ("replay-json-under-file", R + ["--json", "{under_file}"], ["output directory", "is a file, not a directory"]),
    ("replay-json-directory", R + ["--json", "{out}"], ["cannot write", "Is a directory"]),
    ("replay-out-under-file", R + ["--out", "{under_file}"], ["cannot write", "Not a directory"]),
    ("replay-out-is-file", R + ["--out", "{regular}"], ["cannot write", "regular"]),
)

# -- sweep ----------------------------------------------------------------------------------

W = ["sweep", "{trace}", "--dim", "8", "--cache-sizes", "4K", "--devices", "nand-p4500", "--workers", "1"]
SWEEP = cases(
    ("sweep-trace-missing", ["sweep", "{dir}/missing.npz"], ["no trace", "missing.npz"]),
    ("sweep-trace-directory", ["sweep", "{dir}"], ["is a directory"]),
    ("sweep-trace-garbage", ["sweep", "{garbage_npz}"], ["garbage.npz", "not a readable trace"]),
    ("sweep-trace-empty", ["sweep", "{empty_npz}"], ["empty.npz", "not a readable trace"]),
    ("sweep-policy-unknown", W + ["--policies", "bogus"], ["'bogus'", "belady"]),
    ("sweep-policy-none", W + ["--policies", ","], ["at least one policy"]),
    ("sweep-cache-size-text", ["sweep", "{trace}", "--cache-sizes", "lots"], ["'lots'", "64M"]),
    ("sweep-cache-size-zero", ["sweep", "{trace}", "--cache-sizes", "0"], ["'0'", "at least 1 byte"]),
    ("sweep-cache-size-negative", ["sweep", "{trace}", "--cache-sizes", "-1"], ["'-1'", "at least 1 byte"]),
    ("sweep-cache-size-1e999", ["sweep", "{trace}", "--cache-sizes", "1e999"], ["'1e999'"]),
    ("sweep-cache-size-nan", ["sweep", "{trace}", "--cache-sizes", "nan"], ["'nan'"]),
    ("sweep-cache-size-huge", ["sweep", "{trace}", "--cache-sizes", "9" * 20 + "T"], ["size", "2**63 - 1"]),
    ("sweep-device-unknown", W[:2] + ["--devices", "bogus"], ["'bogus'", "nand-p4500"]),
    ("sweep-dim-zero", ["sweep", "{trace}", "--dim", "0"], ["dim", "[1, 65536]", "0"]),
    ("sweep-dim-text", ["sweep", "{trace}", "--dim", "abc"], ["--dim", "'abc'"], USAGE),
    ("sweep-fmt-unknown", W + ["--fmt", "fp64"], ["'fp64'", "fp32"]),
    ("sweep-sla-nan", W + ["--sla-us", "nan"], ["SLA", "nan"]),
    ("sweep-sla-negative", W + ["--sla-us", "-5"], ["SLA", "-5.0"]),
    ("sweep-sla-1e999", W + ["--sla-us", "1e999"], ["SLA", "inf"]),
    ("sweep-request-size-zero", W + ["--request-size", "0"], ["request_size", "0"]),
    ("sweep-queue-depth-zero", W + ["--queue-depth", "0"], ["queue_depth", "[1, 1024]", "0"]),
    ("sweep-queue-depth-huge", W + ["--queue-depth", str(10**20)], ["queue_depth", str(10**20)]),
    ("sweep-cache-queue-depth-negative", W + ["--cache-queue-depth", "-3"], ["cache_queue_depth", "-3"]),
    ("sweep-workers-zero", W[:-2] + ["--workers", "0"], ["workers", ">= 1", "0"]),
    ("sweep-workers-negative", W[:-2] + ["--workers", "-1"], ["workers", "-1"]),
    ("sweep-json-under-file", W + ["--json", "{under_file}"], ["output directory", "is a file, not a directory"]),
    ("sweep-json-directory", W + ["--json", "{out}"], ["cannot write", "Is a directory"]),
    ("sweep-plot-under-file", W + ["--plot", "{under_file}"], ["output directory", "is a file, not a directory"]),
    ("sweep-plot-directory", W + ["--plot", "{out}"], ["sweep plot", "is a directory"]),
)

# -- place ----------------------------------------------------------------------------------

P = ["place", "{trace}", "--store", "{store}", "-o", "{out}/p.npz"]
PLACE = cases(
    ("place-dram-bytes-missing", P, ["--dram-bytes"], USAGE),
    ("place-dram-bytes-text", P + ["--dram-bytes", "lots"], ["--dram-bytes", "'lots'"]),
    ("place-dram-bytes-negative", P + ["--dram-bytes", "-1"], ["--dram-bytes", "'-1'"]),
    ("place-dram-bytes-nan", P + ["--dram-bytes", "nan"], ["--dram-bytes", "'nan'"]),
    ("place-dram-bytes-1e999", P + ["--dram-bytes", "1e999"], ["--dram-bytes", "'1e999'"]),
    ("place-dram-bytes-huge", P + ["--dram-bytes", "9" * 23 + "T"], ["dram_bytes", "2**63 - 1"]),
    ("place-pin-fraction-nan", P + ["--dram-bytes", "1K", "--pin-fraction", "nan"], ["pin_fraction", "[0, 1]", "nan"]),
    ("place-pin-fraction-negative", P + ["--dram-bytes", "1K", "--pin-fraction", "-0.1"], ["pin_fraction", "-0.1"]),
    ("place-pin-fraction-1e999", P + ["--dram-bytes", "1K", "--pin-fraction", "1e999"], ["pin_fraction", "inf"]),
    ("place-pin-fraction-two", P + ["--dram-bytes", "1K", "--pin-fraction", "2"], ["pin_fraction", "2"]),
    ("place-pin-fraction-text", P + ["--dram-bytes", "1K", "--pin-fraction", "abc"], ["--pin-fraction", "'abc'"],
     USAGE),
    ("place-block-bytes-zero", P + ["--dram-bytes", "1K", "--block-bytes", "0"], ["block_bytes", "0"]),
    ("place-block-bytes-negative", P + ["--dram-bytes", "1K", "--block-bytes", "-4096"], ["block_bytes", "-4096"]),
    ("place-block-bytes-huge", P + ["--dram-bytes", "1K", "--block-bytes", str(10**20)], ["block_bytes", str(10**20)]),
    ("place-layout-unknown", P + ["--dram-bytes", "1K", "--layout", "bogus"], ["--layout", "'bogus'"], USAGE),
    ("place-output-is-directory", ["place", "{trace}", "--store", "{store}", "--dram-bytes", "1K", "-o", "{out}"],
     ["placement file", "is a directory"]),
    ("place-output-under-file", ["place", "{trace}", "--store", "{store}", "--dram-bytes", "1K", "-o",
                                 "{under_file}"], ["regular", "is a file"]),
    ("place-output-unwritable", ["place", "{trace}", "--store", "{store}", "--dram-bytes", "1K", "-o",
                                 "/proc/sdm-bad-input.npz"], ["cannot write placement file", "/proc"]),
    ("place-store-missing", ["place", "{trace}", "--store", "{dir}/nostore", "--dram-bytes", "1K", "-o",
                             "{out}/p.npz"], ["no sdm store", "nostore"]),
    ("place-store-is-file", ["place", "{trace}", "--store", "{regular}", "--dram-bytes", "1K", "-o",
                             "{out}/p.npz"], ["no sdm store", "regular"]),
    ("place-store-other-tables", ["place", "{trace}", "--store", "{store_other}", "--dram-bytes", "1K", "-o",
                                  "{out}/p.npz"], ["2 tables", "the store 1"]),
    ("place-trace-missing", ["place", "{dir}/missing.npz", "--store", "{store}", "--dram-bytes", "1K", "-o",
                             "{out}/p.npz"], ["no trace", "missing.npz"]),
    ("place-trace-garbage", ["place", "{garbage_npz}", "--store", "{store}", "--dram-bytes", "1K", "-o",
                             "{out}/p.npz"], ["garbage.npz", "not a readable trace"]),
    ("place-trace-directory", ["place", "{dir}", "--store", "{store}", "--dram-bytes", "1K", "-o", "{out}/p.npz"],
     ["is a directory"]),
)

# -- report ---------------------------------------------------------------------------------

RP = ["report", "-o", "{out}/r", "--no-plots"]
REPORT = cases(
    ("report-no-out", ["report", "--no-plots"], ["-o/--out"], USAGE),
    ("report-scenario-missing", RP + ["--scenario", "{dir}/missing.toml"], ["missing.toml", "does not exist"]),
    ("report-scenario-directory", RP + ["--scenario", "{dir}"], ["scenario file", "is a directory"]),
    ("report-scenario-not-toml", RP + ["--scenario", "{bad_toml}"], ["bad.toml", "not valid TOML"]),
    ("report-scenario-binary", RP + ["--scenario", "{binary_toml}"], ["binary.toml", "not UTF-8"]),
    ("report-scenario-garbage", RP + ["--scenario", "{garbage_npz}"], ["garbage.npz", "not UTF-8"]),
    ("report-scenario-empty", RP + ["--scenario", "{empty_npz}"], ["[model]", "missing"]),
    ("report-scenario-qps-nan", RP + ["--scenario", "{scen_qps_nan_toml}"], ["target_qps", "nan"]),
    ("report-scenario-qps-negative", RP + ["--scenario", "{scen_qps_neg_toml}"], ["target_qps", "-1"]),
    ("report-scenario-qps-inf", RP + ["--scenario", "{scen_qps_inf_toml}"], ["target_qps", "inf"]),
    ("report-scenario-qps-text", RP + ["--scenario", "{scen_qps_str_toml}"], ["target_qps", "'lots'"]),
    ("report-scenario-hit-rate", RP + ["--scenario", "{scen_hit_rate_toml}"], ["hit_rate", "1.5"]),
    ("report-scenario-device", RP + ["--scenario", "{scen_device_toml}"], ["configs[1].device", "'floppy'"]),
    ("report-scenario-model-preset", RP + ["--scenario", "{scen_preset_toml}"], ["model.preset", "'rm99'", "rm1"]),
    ("report-scenario-no-model", RP + ["--scenario", "{scen_no_model_toml}"], ["[model]", "missing"]),
    ("report-scenario-years-negative", RP + ["--scenario", "{scen_years_toml}"], ["years", ">= 0", "-1.0"]),
    ("report-scenario-slots-negative", RP + ["--scenario", "{scen_slots_toml}"], ["dram_slots", "-24"]),
    ("report-replay-missing", RP + ["--replay", "{dir}/missing.json"], ["replay result", "missing.json"]),
    ("report-replay-directory", RP + ["--replay", "{dir}"], ["replay result", "Is a directory"]),
    ("report-replay-not-json", RP + ["--replay", "{bad_json}"], ["replay result", "bad.json", "not JSON"]),
    ("report-replay-empty", RP + ["--replay", "{empty_json}"], ["replay result", "empty.json", "not JSON"]),
    ("report-replay-list", RP + ["--replay", "{list_json}"], ["list.json", "JSON object", "list"]),
    ("report-replay-binary", RP + ["--replay", "{binary_json}"], ["binary.json", "cannot be read"]),
    ("report-replay-neither", RP + ["--replay", "{neither_json}"], ["neither.json", "'tiers'", "'points'"]),
    ("report-replay-nan", RP + ["--replay", "{nan_json}"], ["nan.json", "JSON object", "float"]),
    ("report-replay-a-trace", RP + ["--replay", "{trace}"], ["tiny.npz", "cannot be read"]),
    ("report-out-under-file", ["report", "-o", "{under_file}", "--no-plots"], ["output directory", "Not a directory"]),
    ("report-out-is-file", ["report", "-o", "{regular}", "--no-plots"], ["output directory", "regular"]),
)

# -- run ------------------------------------------------------------------------------------

RUN = cases(
    ("run-preset-unknown", ["run", "--presets", "bogus", "--no-report", "--dim", "8"], ["'bogus'", "sdm-nand"]),
    ("run-trace-missing", ["run", "--trace", "{dir}/missing.npz", "--no-report"], ["no trace", "missing.npz"]),
    ("run-trace-garbage", ["run", "--trace", "{garbage_npz}", "--no-report"], ["garbage.npz", "not a readable trace"]),
    ("run-trace-directory", ["run", "--trace", "{dir}", "--no-report"], ["is a directory"]),
    ("run-batches-zero", ["run", "--trace", "{trace}", "--batches", "0", "--no-report", "--dim", "8"],
     ["max_batches", "0"]),
    ("run-batches-negative", ["run", "--trace", "{trace}", "--batches", "-1", "--no-report", "--dim", "8"],
     ["max_batches", "-1"]),
    ("run-batches-text", ["run", "--batches", "x"], ["--batches", "'x'"], USAGE),
    ("run-dim-zero", ["run", "--trace", "{trace}", "--dim", "0", "--no-report"], ["dim", "0"]),
    ("run-dim-negative", ["run", "--trace", "{trace}", "--dim", "-1", "--no-report"], ["dim", "-1"]),
    ("run-sla-nan", ["run", "--trace", "{trace}", "--sla-us", "nan", "--no-report", "--dim", "8"], ["SLA", "nan"]),
    ("run-sla-negative", ["run", "--trace", "{trace}", "--sla-us", "-1", "--no-report", "--dim", "8"], ["SLA", "-1.0"]),
    ("run-sla-1e999", ["run", "--trace", "{trace}", "--sla-us", "1e999", "--no-report", "--dim", "8"], ["SLA", "inf"]),
    ("run-report-under-file", ["run", "--trace", "{trace}", "--batches", "1", "--dim", "8", "--report",
                               "{under_file}"], ["output directory", "Not a directory"]),
)

# -- load -----------------------------------------------------------------------------------

LD = ["load", "{trace}", "--duration", "0.2", "--workers", "1"]
LOAD = cases(
    ("load-no-rate", LD, ["at least one rate"]),
    ("load-rate-zero", LD + ["--rate", "0"], ["rate", "0"]),
    ("load-rate-negative", LD + ["--rate", "-5"], ["rate", "-5"]),
    ("load-rate-text", LD + ["--rate", "x"], ["--rate", "'x'"], USAGE),
    ("load-workers-zero", ["load", "{trace}", "--rate", "10", "--workers", "0"], ["workers", "0"]),
    ("load-duration-zero", ["load", "{trace}", "--rate", "10", "--duration", "0"], ["duration_s", "0"]),
    ("load-duration-nan", ["load", "{trace}", "--rate", "10", "--duration", "nan"], ["duration_s", "nan"]),
    ("load-sla-negative", LD + ["--rate", "10", "--sla-us", "-1"], ["SLA", "-1.0"]),
    ("load-config-unknown", LD + ["--rate", "10", "--config", "bogus"], ["'bogus'"]),
    ("load-trace-missing", ["load", "{dir}/missing.npz", "--rate", "10"], ["no trace", "missing.npz"]),
    ("load-json-under-file", LD + ["--rate", "10", "--json", "{under_file}/x.json"], ["output directory"]),
)

# -- shard (the full corpus of sdm shard is tests/test_cluster_build.py) -----------------------

SHARD = cases(
    ("shard-no-subcommand", ["shard"], ["subcommand is needed"], USAGE),
    ("shard-workers-zero", ["shard", "plan", "{store}", "--workers", "0", "-o", "{out}/p.json"],
     ["num_workers", "0"]),
    ("shard-build-missing-plan", ["shard", "build", "{store}", "{dir}/missing.json", "-o", "{out}/s"],
     ["missing.json"]),
)

STORE = cases(
    ("store-no-subcommand", ["store"], ["subcommand"], USAGE),
    ("store-create-no-source", ["store", "create", "{out}/s"], ["--arrays", "--preset", "--trace"], USAGE),
    ("store-create-two-sources", ["store", "create", "{out}/s", "--trace", "{trace}", "--preset", "rm2"],
     ["not allowed with"], USAGE),
    ("store-create-exists", ["store", "create", "{store}", "--trace", "{trace}"], ["already exists"]),
    ("store-create-garbage-trace", ["store", "create", "{out}/s", "--trace", "{garbage_npz}"],
     ["garbage.npz", "not a readable trace"]),
    ("store-create-arrays-text", ["store", "create", "{out}/s", "--arrays", "{notes_txt}"], [".npy or .npz"]),
    ("store-create-fmt", ["store", "create", "{out}/s", "--trace", "{trace}", "--fmt", "int4"], ["'int4'"]),
    ("store-info-missing", ["store", "info", "{dir}/missing"], ["no sdm store", "missing"]),
    ("store-verify-file", ["store", "verify", "{regular}"], ["no sdm store"]),
)
# -- host -----------------------------------------------------------------------------------

H = ["host", "{trace}", "--dim", "8"]
HOST = cases(
    ("host-unknown-host", H + ["--host", "bogus"], ["host 'bogus'", "2-socket", "this-machine"]),
    ("host-config-unknown", H + ["--config", "bogus"], ["'bogus'"]),
    ("host-json-under-file", H + ["--json", "{under_file}/x.json"], ["output directory"]),
    ("host-sla-negative", H + ["--sla-us", "-1"], ["SLA", "-1.0"]),
    ("host-workers-zero", H + ["--workers", "0"], ["workers", "0"]),
    ("host-platform-other-host", H + ["--host", "2-socket", "--platform-seconds", "1"],
     ["--platform-seconds", "this-machine", "2-socket"]),
    ("host-platform-seconds-zero", H + ["--platform-seconds", "0"], ["spin_s", "0"]),
)

ALL = TOP + GEN + IMPORT + STATS + REPLAY + SWEEP + PLACE + REPORT + RUN + LOAD + SHARD + STORE + HOST


@pytest.mark.parametrize("argv, words, kind", ALL)
def test_bad_input(env, tmp_path, capsys, argv, words, kind):
    argv = fill(argv, env, tmp_path)
    words = [w.format(out=str(tmp_path)) for w in words]
    check(argv, words, kind, capsys, tmp_path)


def test_the_corpus_covers_every_command():
    """Every registered command (and trace subcommand) has at least one case here."""
    from sdm.cli import COMMAND_MODULES

    seen = {p.values[0][0] for p in ALL if p.values[0]}
    assert set(COMMAND_MODULES) <= seen, set(COMMAND_MODULES) - seen
    subs = {p.values[0][1] for p in ALL if p.values[0][:1] == ["trace"] and len(p.values[0]) > 1}
    assert {"gen", "import", "stats"} <= subs
    assert len(ALL) >= 80


def test_a_bad_case_writes_no_output(env, tmp_path, capsys):
    """A refused command leaves nothing at its output path."""
    out = tmp_path / "g.npz"
    assert main(["trace", "gen", "-o", str(out), "--batches", "1", "--batch-size", "8", "--alpha", "-1"]) == 2
    assert main(["place", env["trace"], "--store", env["store"], "--dram-bytes", "1K", "--pin-fraction", "2",
                 "-o", str(tmp_path / "p.npz")]) == 2
    capsys.readouterr()
    assert os.listdir(tmp_path) == []


# -- a real process: nothing escapes as a traceback ------------------------------------------

SUBPROCESS = [
    pytest.param(["trace", "stats", "{garbage_npz}"], 2, id="stats-garbage"),
    pytest.param(["trace", "gen", "-o", "/proc/sdm-bad-input.npz", "--batches", "1", "--batch-size", "8"], 2,
                 id="gen-unwritable"),
    pytest.param(["replay", "{trace}", "--config", "{bad_toml}"], 2, id="replay-bad-config"),
    pytest.param(["sweep", "{trace}", "--cache-sizes", "1e999"], 2, id="sweep-size-1e999"),
    pytest.param(["place", "{trace}", "--store", "{store}", "--dram-bytes", "1K", "-o", "{under_file}"], 2,
                 id="place-under-file"),
    pytest.param(["report", "-o", "{out}/r", "--replay", "{binary_json}", "--no-plots"], 2, id="report-binary-replay"),
    pytest.param(["run", "--batches", "abc"], 2, id="run-usage"),
    pytest.param([], 2, id="no-command"),
]


@pytest.mark.parametrize("argv, code", SUBPROCESS)
def test_no_traceback_in_a_real_process(env, tmp_path, argv, code):
    argv = fill(argv, env, tmp_path)
    proc = subprocess.run([sys.executable, "-m", "sdm", *argv], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1 and errors[0].startswith("sdm"), proc.stderr
