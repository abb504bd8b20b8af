#!/usr/bin/env bash
# The install step of the normaudit GitHub Action (action.yml): torch as the CPU wheel of the pinned version
# (from download.pytorch.org's CPU index: no CUDA libraries, a few hundred MB less), then normaudit and the
# packages the models need, under a constraint file that holds torch at that version so no later
# requirement replaces it with the default (CUDA) wheel of another version.
#
# Environment (action.yml passes the inputs):
#   INPUT_TORCH_VERSION  the torch version (default 2.13.0)
#   INPUT_NORMAUDIT      what to install as normaudit: a version (0.1.0 -> normaudit==0.1.0), a requirement
#                        or a path; default GITHUB_ACTION_PATH, this action's own checkout
#   INPUT_PIP_INSTALL    more requirements (your project: `-e .`, `-r requirements.txt`, `transformers`),
#                        split as a shell does (no expansion); empty: none
#   RUNNER_TEMP          where the constraint file is written (normaudit-constraints.txt)
#   GITHUB_OUTPUT        the step's output: constraints (the constraint file's path)
#   NORMAUDIT_PYTHON     the interpreter to install into (default python)
set -euo pipefail

python=${NORMAUDIT_PYTHON:-python}
torch=${INPUT_TORCH_VERSION:-2.13.0}
source=${INPUT_NORMAUDIT:-${GITHUB_ACTION_PATH:?neither the normaudit input nor GITHUB_ACTION_PATH is set}}
if [[ "$source" =~ ^[0-9]+(\.[0-9]+)*((a|b|rc|\.post|\.dev)[0-9]+)*$ ]]; then
    source="normaudit==$source"
fi
constraints=${RUNNER_TEMP:-${TMPDIR:-/tmp}}/normaudit-constraints.txt
echo "torch==$torch" > "$constraints"

pip=("$python" -m pip install --disable-pip-version-check --no-input)
"${pip[@]}" "torch==$torch" --index-url https://download.pytorch.org/whl/cpu
"${pip[@]}" --constraint "$constraints" "$source"
if [ -n "${INPUT_PIP_INSTALL:-}" ]; then
    words=$(mktemp "${RUNNER_TEMP:-${TMPDIR:-/tmp}}/normaudit-words.XXXXXX")
    trap 'rm -f "$words"' EXIT
    "$python" -c 'import shlex, sys
sys.stdout.write("".join(w + "\0" for w in shlex.split(sys.argv[1])))' "$INPUT_PIP_INSTALL" > "$words"
    mapfile -d '' more < "$words"
    "${pip[@]}" --constraint "$constraints" "${more[@]}"
fi
if [ -n "${GITHUB_OUTPUT:-}" ]; then
    echo "constraints=$constraints" >> "$GITHUB_OUTPUT"
fi
