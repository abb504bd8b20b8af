#!/usr/bin/env bash
# The audit step of the normaudit GitHub Action (action.yml at the repository root): runs normaudit once over
# the targets, writing SARIF to a file and the concise lines to the log (stdout), records the step's outputs
# and exits with normaudit's status (0: nothing at or above --fail-on, 1: such findings, 2: bad input or
# usage, 3: internal error). It installs nothing: action.yml's install step (action/install.sh) does.
#
# Environment (action.yml passes the inputs; the runner sets the GITHUB_* and RUNNER_* variables):
#   INPUT_TARGETS            targets separated by white space or new lines, quoted as in a shell when one
#                            holds a space; empty: the `targets` of [tool.normaudit] / normaudit.toml
#   INPUT_FAIL_ON            error | warning | info | never; empty: the settings' fail-on, else error
#   INPUT_ARGS               more arguments for normaudit, split as a shell does (no expansion)
#   INPUT_SARIF_FILE         the SARIF file, relative to the working directory (default normaudit.sarif)
#   INPUT_WORKING_DIRECTORY  where normaudit runs, relative to GITHUB_WORKSPACE (default .)
#   GITHUB_WORKSPACE         the checkout (default: the current directory)
#   GITHUB_OUTPUT            the step's outputs file: exit-code, findings (SARIF results), sarif-file
#                            (absolute; written only when the file exists)
#   NORMAUDIT_PYTHON         the interpreter with normaudit installed (default python)
set -u

python=${NORMAUDIT_PYTHON:-python}
workdir=${GITHUB_WORKSPACE:-.}/${INPUT_WORKING_DIRECTORY:-.}
cd "$workdir" || { echo "::error title=normaudit::no working directory $workdir"; exit 2; }

# shell-like splitting without expansion or globbing (shlex), one NUL-terminated word each, through a file
# (a shell variable cannot hold NUL) so that an input shlex refuses (an open quote) stops the step
split() {
    "$python" -c 'import shlex, sys
try:
    words = shlex.split(sys.argv[2])
except ValueError as err:
    sys.exit(f"::error title=normaudit::cannot split the {sys.argv[1]} input: {err}")
sys.stdout.write("".join(w + "\0" for w in words))' "$1" "$2"
}
words=$(mktemp "${RUNNER_TEMP:-${TMPDIR:-/tmp}}/normaudit-words.XXXXXX") || exit 2
trap 'rm -f "$words"' EXIT
split targets "${INPUT_TARGETS:-}" > "$words" || exit 2
mapfile -d '' targets < "$words"
split args "${INPUT_ARGS:-}" > "$words" || exit 2
mapfile -d '' extra < "$words"

sarif=${INPUT_SARIF_FILE:-normaudit.sarif}
mkdir -p -- "$(dirname -- "$sarif")" || exit 2
cmd=("$python" -m normaudit)
cmd+=("${targets[@]}")
if [ -n "${INPUT_FAIL_ON:-}" ]; then
    cmd+=(--fail-on "$INPUT_FAIL_ON")
fi
cmd+=(--format concise --format sarif -o "$sarif")
cmd+=("${extra[@]}")

"${cmd[@]}"
status=$?

if [ -n "${GITHUB_OUTPUT:-}" ]; then
    echo "exit-code=$status" >> "$GITHUB_OUTPUT"
    if [ -f "$sarif" ]; then
        "$python" - "$sarif" >> "$GITHUB_OUTPUT" <<'PY'
import json, os, sys
path = sys.argv[1]
try:
    with open(path, encoding="utf-8") as fh:
        runs = json.load(fh).get("runs", [])
    print(f"findings={sum(len(run.get('results', [])) for run in runs)}")
except (OSError, ValueError, AttributeError):
    pass
print(f"sarif-file={os.path.abspath(path)}")
PY
    fi
fi
exit "$status"
