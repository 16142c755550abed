#!/usr/bin/env bash
# What the test suite runs beside Rust, installed when missing, so that `make test` (and CI,
# which calls it) works on a fresh machine:
#   redis-server  the shared-cache test's real Redis
#   postgresql    the ledger's tests start a real PostgreSQL (initdb in a temporary folder)
#   prometheus    the watch test reads a fleet through a real Prometheus server's API
#   openssl       makes a private CA and a certificate for the ledger's TLS test
#   jq            README's `frugal report --json | jq ...`, which scripts/first-hour.py runs
#   openai        the end-to-end test drives `frugal serve` with the official OpenAI client
#   kubernetes-validate, jsonschema
#                 scripts/validate-manifests.py checks `frugal deploy kubernetes` offline
#   gguf          llama.cpp's reader checks `frugal quantize`'s files
# Debian packages need root, or sudo.
set -euo pipefail
packages=()
command -v redis-server >/dev/null || packages+=(redis-server)
command -v initdb >/dev/null || compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null ||
  packages+=(postgresql)
command -v prometheus >/dev/null || packages+=(prometheus)
command -v openssl >/dev/null || packages+=(openssl)
command -v jq >/dev/null || packages+=(jq)
if [ ${#packages[@]} -gt 0 ]; then
  echo "installing ${packages[*]}"
  sudo=()
  [ "$(id -u)" = 0 ] || sudo=(sudo)
  "${sudo[@]}" apt-get update -q
  "${sudo[@]}" apt-get install -y -q "${packages[@]}"
fi
pip() { python3 -m pip install --quiet --disable-pip-version-check "$@"; }
python3 -c 'import openai' 2>/dev/null || pip 'openai>=1.50'
python3 -c 'import kubernetes_validate, jsonschema' 2>/dev/null ||
  pip 'kubernetes-validate>=1.30' jsonschema
python3 -c 'import gguf' 2>/dev/null || pip 'gguf>=0.10'
