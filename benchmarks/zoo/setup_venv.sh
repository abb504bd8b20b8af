#!/usr/bin/env bash
# Make the sweep's virtual environment: the main environment's packages (torch 2.13 CPU, transformers,
# normaudit installed with `pip install -e .`) plus timm and torchvision, torch kept at the main one's version.
# A .pth file makes every start of the venv's python import tv_shim (benchmarks/zoo/tv_shim.py), so that
# `import torchvision` / `import timm` work there although the registry's torchvision wheel is a CUDA build.
# Usage: benchmarks/zoo/setup_venv.sh [VENV_DIR]       (default /work/zoo-venv)
set -euo pipefail
venv="${1:-/work/zoo-venv}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
torch_version="$(python -c 'import torch; print(torch.__version__.split("+")[0])')"
python -m venv --system-site-packages "$venv"
"$venv/bin/pip" install -q timm torchvision -c <(echo "torch==$torch_version")
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
printf '%s\nimport tv_shim; tv_shim.install_on_import()\n' "$here" > "$site/normaudit_zoo_tv_shim.pth"
"$venv/bin/python" -c 'import torch, torchvision, timm; print("ok: torch", torch.__version__, "torchvision", torchvision.__version__, "timm", timm.__version__)'
