#!/usr/bin/env bash
# Compile one snippet with -fsyntax-only and check the outcome.
#
#   check.sh fail MESSAGE SOURCE COMPILER [FLAGS...]   exit 0 iff compilation FAILS and the compiler output
#                                                      contains MESSAGE (a fixed string, not a regex)
#   check.sh failtop MESSAGE SOURCE COMPILER [FLAGS...]  as fail, and MESSAGE is on one of the first 5 lines of
#                                                      the output (the mistake is the first thing the user reads)
#   check.sh ok   -       SOURCE COMPILER [FLAGS...]   exit 0 iff compilation SUCCEEDS
#
# COMPILER may be several words (e.g. `ccache c++`): everything after SOURCE is the command line, to which
# `-fsyntax-only SOURCE` is appended. Works with g++ and clang++ (both print the static_assert text verbatim).
set -u

if [ "$#" -lt 4 ]; then
  echo "usage: $0 fail|ok MESSAGE SOURCE COMPILER [FLAGS...]" >&2
  exit 2
fi
mode=$1 msg=$2 src=$3
shift 3
case "$mode" in
  fail | failtop | ok) ;;
  *) echo "check.sh: unknown mode '$mode' (want fail or ok)" >&2; exit 2 ;;
esac
if [ ! -f "$src" ]; then
  echo "check.sh: no such source file: $src" >&2
  exit 2
fi

out=$(LC_ALL=C "$@" -fsyntax-only "$src" 2>&1)
rc=$?
echo "+ $* -fsyntax-only $src  (exit $rc)"

if [ "$mode" = ok ]; then
  if [ "$rc" -eq 0 ]; then
    echo "PASS: compiled as expected"
    exit 0
  fi
  echo "FAIL: expected $src to compile, but the compiler failed:"
  printf '%s\n' "$out" | grep -E 'error|static assert|static_assert' | head -n 40
  echo "--- full output (first 80 lines) ---"
  printf '%s\n' "$out" | head -n 80
  exit 1
fi

if [ "$rc" -eq 0 ]; then
  echo "FAIL: expected $src to fail to compile with \"$msg\", but it compiled"
  exit 1
fi
if [ "$rc" -ge 126 ]; then
  echo "FAIL: the compiler could not be run (exit $rc):"
  printf '%s\n' "$out" | head -n 20
  exit 1
fi
if printf '%s\n' "$out" | grep -qF -- "$msg"; then
  at=$(printf '%s\n' "$out" | grep -nF -- "$msg" | head -n 1 | cut -d: -f1)
  if [ "$mode" = failtop ] && [ "$at" -gt 5 ]; then
    echo "FAIL: the expected message is on line $at of the compiler output, not within the first 5:"
    printf '%s\n' "$out" | head -n 40
    exit 1
  fi
  echo "PASS: compilation failed with the expected message (output line $at):"
  printf '%s\n' "$out" | grep -F -- "$msg" | head -n 3
  exit 0
fi
echo "FAIL: $src failed to compile, but without the expected message \"$msg\". Compiler errors:"
printf '%s\n' "$out" | grep -E 'error' | head -n 40
echo "--- full output (first 80 lines) ---"
printf '%s\n' "$out" | head -n 80
exit 1
