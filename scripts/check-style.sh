#!/usr/bin/env bash
# The style gate: clang-format-14 (.clang-format) on the C/C++ files a change
# touches, and a short clang-tidy-14 run (.clang-tidy) on the lines it
# changed in the .cpp files of the shipped code (client_lib/, daemon/,
# engine/). Exits 0 when both are clean, 1 on findings (or a missing tool).
#
# Usage: scripts/check-style.sh [-p BUILD_DIR] [BASE]
#   BASE       what the change is measured from: the files that differ
#              between BASE and the working tree, plus untracked files git
#              does not ignore. BASE, else $TOKENMETER_STYLE_BASE, else the
#              start of the change: the merge base of HEAD and origin/main,
#              so that every commit of a branch (of a push) is checked, not
#              only its last. Where there is no origin/main (a checkout
#              without that remote) or the merge base is HEAD itself (HEAD
#              on or behind origin/main), HEAD~1: the last commit. The base
#              and the number of commits it covers are printed first.
#              Without a commit BASE (a single-commit or shallow clone)
#              every tracked file is format-checked and clang-tidy skipped.
#   BUILD_DIR  a configured build whose compile_commands.json clang-tidy
#              uses (default: build-test); clang-tidy is skipped, with a
#              message, when it has none.
# clang-format checks every changed C/C++ file, clang-tidy the changed lines
# of every changed .cpp file of the shipped code, two files at a time.
# clang-tidy is the slow part; measured on the 2-core development machine
# while other builds shared it (load 5 to 9): 0.3 to 10 s a file run alone
# (about 5 s on average; the daemon's, with the most headers, the slowest),
# and all 55 shipped .cpp files in 6 min 17 s. A branch that touches 10 of
# them costs about a minute; one that touches them all, about 6 minutes.
# TOKENMETER_TIDY_MAX_FILES=N caps the run at the first N files (unset: no
# cap) and names the files it did not check.
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
base=${1:-${TOKENMETER_STYLE_BASE:-}}
max_tidy=${TOKENMETER_TIDY_MAX_FILES:-}
if [[ -n $max_tidy && ! $max_tidy =~ ^[1-9][0-9]*$ ]]; then
  echo "check-style: TOKENMETER_TIDY_MAX_FILES=$max_tidy is not a count" \
    "of files (1 or more; unset for no cap)" >&2
  exit 2
fi

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

# The base: as given, else the start of the change, else the last commit.
if [ -n "${1:-}" ]; then
  why="given"
elif [ -n "$base" ]; then
  why="TOKENMETER_STYLE_BASE"
elif ! git rev-parse --verify -q "origin/main^{commit}" >/dev/null; then
  base=HEAD~1 why="no origin/main: the last commit"
elif ! start=$(git merge-base HEAD origin/main); then
  base=HEAD~1 why="no merge base with origin/main: the last commit"
elif [ "$start" = "$(git rev-parse HEAD)" ]; then
  base=HEAD~1 why="HEAD is on origin/main: the last commit"
else
  base=$start why="the merge base of HEAD and origin/main"
fi

cxx_re='\.(c|cc|cpp|h|hpp|cu|cuh)$'
if git rev-parse --verify -q "$base^{commit}" >/dev/null; then
  short=$(git rev-parse --short "$base")
  name=$short
  [[ $(git rev-parse "$base") == "$base"* ]] || name="$base = $short"
  commits=$(git rev-list --count "$base..HEAD")
  [ "$commits" = 1 ] && commits="1 commit" || commits="$commits commits"
  echo "check-style: base $name ($why): $commits and the working tree"
  mapfile -t changed < <(
    { git diff --name-only --diff-filter=d "$base" --
      git ls-files --others --exclude-standard; } | sort -u)
  scope="changed since $short"
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
if [ -n "$max_tidy" ] && [ ${#tidy[@]} -gt "$max_tidy" ]; then
  echo "clang-tidy: TOKENMETER_TIDY_MAX_FILES=$max_tidy: checking" \
    "$max_tidy of ${#tidy[@]} changed files; NOT checked:" \
    "${tidy[*]:$max_tidy}"
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
