#!/usr/bin/env bash
# The style gate: clang-format-14 (.clang-format) on the C/C++ files a change
# touches, and a short clang-tidy-14 run (.clang-tidy) on the lines it
# changed in the .cpp files of the shipped code (client_lib/, daemon/,
# engine/). Exits 0 when both are clean, 1 on findings (or a missing tool).
#
# Usage: scripts/check-style.sh [-p BUILD_DIR] [BASE]
#   BASE       what the change is measured from (default HEAD~1): the files
#              that differ between BASE and the working tree, plus untracked
#              files git does not ignore. By default that is the last commit
#              plus uncommitted work; on a fresh CI clone, HEAD~1..HEAD.
#              Without such a commit (a single-commit or depth-1 clone) every
#              tracked file is format-checked and clang-tidy is skipped.
#   BUILD_DIR  a configured build whose compile_commands.json clang-tidy
#              uses (default: build-test); clang-tidy is skipped, with a
#              message, when it has none.
# TOKENMETER_TIDY_MAX_FILES (default 4) bounds the clang-tidy run (5 to 15 s
# a file, two at a time).
set -euo pipefail
cd "$(dirname "$0")/.."

build="build-test"
while getopts "p:" opt; do
  case $opt in
    p) build=$OPTARG ;;
    *) echo "usage: $0 [-p BUILD_DIR] [BASE]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
base=${1:-HEAD~1}
max_tidy=${TOKENMETER_TIDY_MAX_FILES:-4}

for tool in clang-format-14 clang-tidy-14 clang-tidy-diff-14.py; do
  if ! command -v "$tool" >/dev/null; then
    echo "check-style: $tool not found (scripts/install-deps.sh installs it)"
    exit 1
  fi
done

if ! git rev-parse --git-dir >/dev/null 2>&1; then
  echo "check-style: not a git checkout, nothing to compare: skipped"
  exit 0
fi

cxx_re='\.(c|cc|cpp|h|hpp|cu|cuh)$'
if git rev-parse --verify -q "$base^{commit}" >/dev/null; then
  mapfile -t changed < <(
    { git diff --name-only --diff-filter=d "$base" --
      git ls-files --others --exclude-standard; } | sort -u)
  scope="changed since $base"
else
  echo "check-style: no commit $base here (single-commit or shallow clone):" \
    "checking the format of every tracked file, skipping clang-tidy"
  mapfile -t changed < <(git ls-files)
  scope="all tracked files"
  base=""
fi
files=()
for f in "${changed[@]}"; do
  [[ $f =~ $cxx_re && -f $f ]] && files+=("$f")
done

status=0
if [ ${#files[@]} -eq 0 ]; then
  echo "clang-format: no C/C++ files $scope"
elif clang-format-14 --dry-run --Werror "${files[@]}" 2>&1; then
  echo "clang-format: ${#files[@]} files $scope: ok"
else
  echo "clang-format: FAILED; fix with: clang-format-14 -i FILE..."
  status=1
fi

[ -n "$base" ] || exit $status
db="$build/compile_commands.json"
if [ ! -f "$db" ]; then
  echo "clang-tidy: skipped, no $db (configure a build, or pass -p BUILD_DIR)"
  exit $status
fi
# The shipped code's .cpp files that the build compiles (compile_commands
# does not list CUDA sources or the fuzz build's targets).
mapfile -t tidy < <(
  printf '%s\n' "${files[@]}" | grep -E '^(client_lib|daemon|engine)/.*\.cpp$' |
    /usr/bin/python3 -c '
import json, os, sys
db = json.load(open(sys.argv[1]))
known = {os.path.realpath(os.path.join(e["directory"], e["file"])) for e in db}
for line in sys.stdin:
    if os.path.realpath(line.strip()) in known:
        print(line.strip())
' "$db")
if [ ${#tidy[@]} -eq 0 ]; then
  echo "clang-tidy: no changed .cpp files in client_lib/, daemon/, engine/"
  exit $status
fi
if [ ${#tidy[@]} -gt "$max_tidy" ]; then
  echo "clang-tidy: checking the first $max_tidy of ${#tidy[@]} changed" \
    "files (TOKENMETER_TIDY_MAX_FILES)"
  tidy=("${tidy[@]:0:$max_tidy}")
fi
# Only the changed lines are judged (-line-filter, via clang-tidy-diff): old
# findings in a touched file do not fail a change. -Wno-error: the build's
# -Werror would turn clang's own warnings (which gcc, the compiler of record,
# does not give) into errors; tidy checks are what this run is for.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
{
  git diff -U0 "$base" -- "${tidy[@]}"
  for f in "${tidy[@]}"; do
    git ls-files --error-unmatch -- "$f" >/dev/null 2>&1 ||
      git diff --no-index -U0 /dev/null "$f" || true
  done
} | clang-tidy-diff-14.py -p1 -path "$build" -quiet -j 2 -timeout 120 \
  -clang-tidy-binary "$(command -v clang-tidy-14)" \
  -iregex '.*\.cpp' -extra-arg=-Wno-error >"$log" 2>&1 || true
if grep -qE '(warning|error): |Terminated by timeout' "$log"; then
  grep -vE '^[0-9]+ (warning|error)s? generated\.$|^$' "$log" | head -200
  echo "clang-tidy: FAILED on ${#tidy[@]} files (${tidy[*]})"
  status=1
else
  echo "clang-tidy: ${#tidy[@]} files $scope: ok (${tidy[*]})"
fi
exit $status
