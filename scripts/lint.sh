#!/usr/bin/env bash
# Lints the repository and checks the deployment files (no GPU, no Docker):
#   1. yamllint (.yamllint) on every YAML file,
#   2. shellcheck on every shell script (*.sh, and files whose first line is
#      an sh/bash shebang, such as .ci/run),
#   3. scripts/check_layers.sh: includes point one way (types <- core/base <-
#      core/memory, core/index <- core/codec <- core/calibration <- core/store),
#   4. the house rules' sizes: scripts/check_file_size.sh (source files
#      under 800 lines) and scripts/check_function_size.py (functions under
#      80 lines, found by universal-ctags in the product folders' sources
#      and headers; about a second), each with an allowlist of today's
#      offenders that it prints as warnings,
#   5. scripts/check_docs.py: every path, flag, config key and RPC that
#      README.md and docs/*.md name exists (scripts/docs_exceptions.txt:
#      other projects' names, each with its reason),
#   6. tests/deploy/*_test.sh: the Dockerfile's build steps and the deploy/
#      configs, run outside Docker against BUILD_DIR (default build/; the
#      daemon checks are skipped, with a message, when it has no kvharbord).
# Files: tracked ones and new ones git does not ignore. scripts/test.sh runs
# this after its first build; scripts/install_deps.sh installs the tools.
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in yamllint shellcheck git ctags python3; do
  command -v "$tool" >/dev/null || {
    echo "lint: $tool missing (scripts/install_deps.sh installs it)" >&2
    exit 1
  }
done

yaml=()
shell=()
while IFS= read -r f; do
  [ -f "$f" ] || continue  # deleted, not yet committed
  case "$f" in fuzz/corpus/*) continue ;; esac  # fuzzer inputs, not our config
  case "$f" in
    *.yaml | *.yml | .yamllint) yaml+=("$f") ;;
    *.sh) shell+=("$f") ;;
    *.*) ;;
    *) head -n1 "$f" | grep -Eq '^#!.*[/ ](ba|da)?sh( |$)' && shell+=("$f") ;;
  esac
done < <(git ls-files --cached --others --exclude-standard)

echo "== yamllint: ${#yaml[@]} files"
yamllint --strict "${yaml[@]}"
echo "== shellcheck: ${#shell[@]} scripts"
# SC2317 (unreachable command) is left out: shellcheck 0.9 (Debian 12) reports
# every line of a function that is only called from a trap.
shellcheck --external-sources --exclude=SC2317 "${shell[@]}"

echo "== include layers"
bash scripts/check_layers.sh

echo "== file size"
bash scripts/check_file_size.sh
echo "== function size"
python3 scripts/check_function_size.py
echo "== docs: paths, flags, config keys and RPCs"
BUILD_DIR=${BUILD_DIR:-build} python3 scripts/check_docs.py

if [ "${KVHARBOR_LINT_DEPLOY_TESTS:-1}" != 0 ]; then
  for t in tests/deploy/*_test.sh; do
    echo "== $t"
    bash "$t"
  done
fi
echo "lint: all checks passed"
