#!/usr/bin/env bash
# Renders deploy/envoy/envoy.yaml with ports from the environment (defaults shown) to stdout.
#   ENVOY_LISTEN_PORT=10000 ENVOY_ADMIN_PORT=9901 KVGATE_EXT_PROC_HOST=127.0.0.1 \
#   KVGATE_EXT_PROC_PORT=9002 deploy/envoy/render.sh > /tmp/envoy.yaml
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
sed -e "s/\${ENVOY_LISTEN_PORT}/${ENVOY_LISTEN_PORT:-10000}/g" \
    -e "s/\${ENVOY_ADMIN_PORT}/${ENVOY_ADMIN_PORT:-9901}/g" \
    -e "s/\${KVGATE_EXT_PROC_HOST}/${KVGATE_EXT_PROC_HOST:-127.0.0.1}/g" \
    -e "s/\${KVGATE_EXT_PROC_PORT}/${KVGATE_EXT_PROC_PORT:-9002}/g" \
    "$here/envoy.yaml"
