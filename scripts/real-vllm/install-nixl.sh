#!/usr/bin/env bash
# Installs NIXL into the vLLM venv, for vLLM's NixlConnector (prefill/decode disaggregation on
# CPU over UCX; ../shared/reference/real-vllm.md "Prefill/decode disaggregation"): PyPI `nixl`
# (the dispatcher package) and `nixl-cu13` (the build matching PyPI's torch, a CUDA 13 build),
# both 1.5.1, without dependencies: `nixl` would pull `nixl-cu12` too and `nixl-cu13` pulls
# `torch`, either of which could replace the venv's pinned torch (install.sh). Download 59 MB,
# ~200 MB installed. Idempotent: does nothing when `nixl_cu13` already imports.
#   scripts/real-vllm/install-nixl.sh [VENV]   (default ${KVGATE_VLLM_VENV:-.venv-vllm})
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=${1:-${KVGATE_VLLM_VENV:-.venv-vllm}}
version=1.5.1
[ -x "$venv/bin/python" ] || { echo "no vLLM venv at $venv (scripts/real-vllm/install.sh)" >&2; exit 1; }
if "$venv/bin/python" -c 'import nixl_cu13, nixl' 2>/dev/null; then
  exit 0
fi
echo "== installing nixl $version + nixl-cu13 $version into $venv (--no-deps)"
"$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps \
  "nixl==$version" "nixl-cu13==$version"
"$venv/bin/python" -c 'import nixl_cu13, nixl'
