#!/usr/bin/env bash
# Code in public header comments is an excerpt of a compiled example or test:
# after a line `// From examples/NAME:` (or `tests/NAME`) come indented
# `//   ` lines, each of which must be a line of that file (leading spaces
# aside; `...` marks a gap). Indented code-like lines outside such a block
# (a line ending in `;` or `{`) fail too: every snippet is compiled.
# Fails, naming the header and line, when one is not; so the excerpts
# cannot drift from code that compiles.
#   header_snippet_check.sh SOURCE_DIR
set -euo pipefail
root=$1
status=0 checked=0
while IFS= read -r header; do
  example="" in_block=0 lineno=0
  while IFS= read -r line; do
    lineno=$((lineno + 1))
    if [[ $line =~ ^//\ From\ ((examples|tests)/[A-Za-z0-9_./]+): ]]; then
      example=$root/${BASH_REMATCH[1]} in_block=1
      [[ -f $example ]] || { echo "FAIL: $header:$lineno names $example, which does not exist"; status=1; }
      continue
    fi
    if ((!in_block)); then
      if [[ $line == "//   "* && $line =~ [\;\{]$ ]]; then
        echo "FAIL: $header:$lineno looks like code outside a '// From examples/NAME:' excerpt: $line"
        status=1
      fi
      continue
    fi
    if [[ $line == "//" ]]; then continue; fi
    if [[ $line != "//   "* ]]; then in_block=0; continue; fi
    code=${line#//   }
    code=${code#"${code%%[! ]*}"} # leading spaces
    [[ $code == "..." ]] && continue
    checked=$((checked + 1))
    if ! sed 's/^ *//' "$example" | grep -Fx -- "$code" >/dev/null; then
      echo "FAIL: $header:$lineno is not a line of $example: $code"
      status=1
    fi
  done <"$header"
done < <(find "$root"/*/include -name '*.hpp' | sort)
((checked > 0)) || { echo "FAIL: no excerpt found (the marker is '// From examples/NAME:')"; exit 1; }
((status == 0)) && echo "OK: $checked excerpt lines in public headers are lines of their examples"
exit $status
