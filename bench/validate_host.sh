#!/bin/sh
# The host model against live load on this machine (bench/RESULTS.md, "The host model").
# Usage: sh bench/validate_host.sh OUTDIR [CASE ...]   (all cases: about 40-60 minutes; writes
# one JSON per run). Naming cases runs only those, e.g. `... /tmp/v dram-processes sdm-nand-processes`.
# DURATION=S sets each live rate's seconds (default 3; the p99 of a point rests on 1% of its requests).
# Each case has its own rates, from far below its knee to past it on a 2-core VM (a machine
# 3x faster or slower moves the knee; the search finds it either way).
set -e
OUT=${1:-/tmp/sdm-validate-host}
[ $# -gt 0 ] && shift
ONLY="$*"
mkdir -p "$OUT"
PY=${PY:-.venv/bin/python}
DURATION=${DURATION:-3}
TRACE=traces/default.npz
cat > "$OUT/nand-4m.toml" <<'TOML'
# sdm-nand with a 4 MiB DRAM cache, so the warm bundled trace still reads Nand
[[tiers]]
kind = "cache"
device = "dram"
capacity_bytes = 4194304
queue_depth = 10
[[tiers]]
kind = "mmap"
device = "nand-p4500"
queue_depth = 16
TOML
uptime > "$OUT/uptime.txt"
$PY -m sdm devices calibrate "$OUT" --seconds 0.5 --file-mib 256 -o "$OUT/disk.toml" --json > "$OUT/calibrate.json"
run() {  # name config io-mode "rates" [model] [processes]
  name=$1; config=$2; mode=$3; rates=$4; model=$5; procs=$6
  if [ -n "$ONLY" ]; then case " $ONLY " in *" $name "*) ;; *) return 0 ;; esac; fi
  extra=""; [ -n "$model" ] && extra="--model $model --fit-model"  # the preset's MLPs over the trace's tables
  workers="--workers 8"; [ -n "$procs" ] && workers="--workers 2"  # one process per core
  live="$workers"; [ -n "$procs" ] && live="$workers --processes"
  echo "$name: $(uptime)" >> "$OUT/uptime.txt"
  # the machine's stalls: 8 s of spinning sees the rare long ones (1 s, the default, rarely does)
  $PY -m sdm host $TRACE --config "$config" --io-mode "$mode" --host this-machine --disk "$OUT/disk.toml" \
      --platform-seconds 8 $live --rate $rates $extra --json "$OUT/$name-host.json"
  $PY -m sdm load $TRACE --config "$config" --io-mode "$mode" $live --duration "$DURATION" --rate $rates \
      --search $extra --json "$OUT/$name-load.json"
  echo "$name done: $(uptime)" >> "$OUT/uptime.txt"
}
run dram dram paced "150 300 600 1200 2400"
run sdm-3dxp sdm-3dxp paced "150 300 600 1200 2400"
run sdm-nand sdm-nand paced "150 300 600 1200 2400"
run nand-4m "$OUT/nand-4m.toml" paced "5 10 20 40 80"
run dram-rm2 dram paced "10 20 40 80" rm2
run nand-4m-direct "$OUT/nand-4m.toml" direct "2 5 10 20"
# process workers, one per core: no GIL between requests (each process has its own cache; the
# device models are per process too). The thread cases above are modeled by one process's
# closed-loop thread curve (sdm.host.threads), these by the cores-and-devices simulation.
run dram-processes dram paced "150 300 600 900" "" processes
run sdm-3dxp-processes sdm-3dxp paced "100 200 400 600" "" processes
run sdm-nand-processes sdm-nand paced "100 200 400 600" "" processes
run nand-4m-processes "$OUT/nand-4m.toml" paced "5 10 20 40 80" "" processes
run dram-rm2-processes dram paced "20 40 80 160" rm2 processes
run sdm-nand-rm2-processes sdm-nand paced "20 40 80 160" rm2 processes
run nand-4m-direct-processes "$OUT/nand-4m.toml" direct "2 5 10 20" "" processes
