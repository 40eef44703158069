#!/usr/bin/env python3
"""Sum doctest case counts over a meson test log; non-doctest tests (compile_fail_*) count as one case each.
Prints 'N passed, N failed' and exits 1 when anything failed."""
import json, re, sys

passed = failed = 0
for line in open(sys.argv[1]):
    t = json.loads(line)
    out = t.get("stdout") or ""
    m = re.findall(r"test cases:\s*(\d+)\s*\|\s*(\d+) passed\s*\|\s*(\d+) failed", out)
    ok = t.get("result") in ("OK", "EXPECTEDFAIL")
    if m:
        _, p, f = (int(v) for v in m[-1])
        passed += p
        failed += f
        if not ok and f == 0:
            failed += 1  # crashed or timed out after its last summary
    elif ok:
        passed += 1
    else:
        failed += 1
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
