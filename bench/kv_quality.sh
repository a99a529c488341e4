#!/usr/bin/env bash
# Measures KV-cache codecs on the real cache of llama2.c's stories260K model
# (issue 4, "Quality on real KV"): captures the KV cache over the first half
# of the TinyStories validation text, calibrates KVTC on it at several
# ratios, evaluates every codec on the held-out second half and writes
# a markdown table, a CSV and (with python3-matplotlib) a PNG plot of
# compression ratio against loss increase.
#
# usage: bench/kv_quality.sh [BUILD_DIR] [OUT_DIR]
#   BUILD_DIR: a build with kvharbor-calibrate and kvharbor-kv-quality
#              (default build-cal); OUT_DIR default BUILD_DIR/kv_quality (holds a 24 MB sample file).
#   RATIOS=4,8,16,32,64 GROUP_SIZES=4,8,16,32 override the KVTC settings,
#   COMMVQ_BITS=1,2 the CommVQ settings (codebooks trained on the same
#   calibration half by kvharbor-kv-quality itself; empty: no CommVQ rows).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-cal}
OUT=${2:-$BUILD/kv_quality}
MODEL_DIR=${MODEL_DIR:-../shared/stories260K}
RATIOS=${RATIOS:-4,8,16,32,64}
GROUP_SIZES=${GROUP_SIZES:-4,8,16,32}
COMMVQ_BITS=${COMMVQ_BITS-1,2}
mkdir -p "$OUT"
common=(--model "$MODEL_DIR/stories260K.bin" --tokenizer "$MODEL_DIR/tok512.bin"
        --text "$MODEL_DIR/validation_100.txt" --calib-fraction 0.5)

"$BUILD/tools/kvharbor-kv-quality" capture "${common[@]}" \
  --out "$OUT/samples.safetensors"
"$BUILD/tools/kvharbor-calibrate" --samples "$OUT/samples.safetensors" \
  --out "$OUT/stories260K" --ratios "$RATIOS" --group-sizes "$GROUP_SIZES" \
  --page-size 16 --sink-tokens 4 | tee "$OUT/calibration.txt"
cals=""
for r in ${RATIOS//,/ }; do cals+="$OUT/stories260K.${r}x.kvtc,"; done
"$BUILD/tools/kvharbor-kv-quality" eval "${common[@]}" --kvtc "${cals%,}" \
  --commvq-bits "$COMMVQ_BITS" --md "$OUT/table.md" --csv "$OUT/table.csv"

# Debian's python3-matplotlib lives in /usr/bin/python3 (a pyenv python3
# earlier in PATH would not see it).
PY=python3
python3 -c 'import matplotlib' 2>/dev/null || PY=/usr/bin/python3
if "$PY" -c 'import matplotlib' 2>/dev/null; then
  "$PY" - "$OUT/table.csv" "$OUT/ratio_vs_loss.png" <<'PY'
import csv, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
rows = list(csv.DictReader(open(sys.argv[1])))
fig, ax = plt.subplots(figsize=(7, 4.5))
kvtc = [r for r in rows if r["codec"].startswith("kvtc")]
ax.plot([float(r["ratio_vs_bf16"]) for r in kvtc],
        [float(r["loss_increase"]) for r in kvtc], "o-", label="KVTC")
for r in rows:
    if r["codec"].startswith("kvtc"):
        continue
    if r["codec"].startswith("commvq"):
        r = dict(r, codec=r["codec"].split(" (")[0])
    ax.plot(float(r["ratio_vs_bf16"]), float(r["loss_increase"]), "s",
            label=r["codec"])
ax.set_xscale("log", base=2)
ax.set_yscale("symlog", linthresh=1e-3)
ax.set_ylim(bottom=0)
ax.set_xlabel("compression ratio vs bf16 (all bytes counted)")
ax.set_ylabel("loss increase (nats/token)")
ax.set_title("stories260K, held-out TinyStories: KV codec quality")
ax.grid(True, which="both", alpha=0.3)
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=120)
PY
  echo "plot: $OUT/ratio_vs_loss.png"
else
  echo "python3-matplotlib not installed: no plot (apt-get install -y python3-matplotlib)"
fi
echo "table: $OUT/table.md"
