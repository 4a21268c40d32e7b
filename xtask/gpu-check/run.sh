#!/usr/bin/env bash
# Hangar's GPU check, run from the carried folder: `bash .gpu-check/run.sh` on the device
# (the device tool sets OUT: what is written there comes back). Everything it needs is in
# this folder: hangard, llama.cpp.tar.gz, the Python scripts. See docs/gpu-check.md.
#
# check.py rewrites $OUT/gpu-check.json after every phase; the `timeout` here is a hard stop
# shortly after its own deadline, so even a hung run leaves a report and its logs.
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export OUT="${OUT:-$here/out}"
mkdir -p "$OUT"
python="${GPU_CHECK_PYTHON:-python3}"
deadline="${GPU_CHECK_DEADLINE_S:-460}"
export GPU_CHECK_DEADLINE_S="$deadline"
chmod +x "$here/hangard" 2>/dev/null || true
# CMake and the setup phase find nvcc on PATH; CUDA images do not always put it there.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="/usr/local/cuda/bin:$PATH"
fi
echo "gpu-check: bundle $(du -sb "$here" | cut -f1) bytes in $here, report in $OUT" >&2
timeout -k 5 "$((deadline + 20))" "$python" "$here/check.py" 2> >(tee "$OUT/check.log" >&2)
rc=$?
if [ ! -s "$OUT/gpu-check.json" ]; then
    printf '{"schema": 1, "ok": false, "finished": false, "error": "check.py wrote no report (exit %s)"}\n' \
        "$rc" > "$OUT/gpu-check.json"
fi
sync
exit "$rc"
