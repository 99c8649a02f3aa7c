# Sourced by scripts/test: the linters as one step that fails when either fails.
# Each command's status is kept by hand, not left to `set -e`: bash does not stop on a
# failing command that is not the last of an `&&` list, nor inside an `if` condition.

lint() {
  local status=0
  ruff check "$@" || status=1
  ruff format --check "$@" || status=1
  return "$status"
}

# The step must fail on a lint error and on a formatting error alone: shown on two
# small files before it is trusted with the tree.
lint_self_test() {
  local dir
  dir="$(mktemp -d)"
  printf 'import os\n' >"$dir/unused_import.py"
  printf 'x = {  "a":1 }\n' >"$dir/badly_formatted.py"
  printf 'X = 1\n' >"$dir/clean.py"
  local failed=""
  lint --isolated "$dir/unused_import.py" >/dev/null 2>&1 && failed="a lint error"
  lint --isolated "$dir/badly_formatted.py" >/dev/null 2>&1 && failed="a formatting error"
  lint --isolated "$dir/clean.py" >/dev/null 2>&1 || failed="a clean file (it failed)"
  rm -rf "$dir"
  if [ -n "$failed" ]; then
    echo "scripts/test: the lint step passed $failed: it would not fail the run" >&2
    return 1
  fi
}
