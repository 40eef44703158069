#!/usr/bin/env python3
"""The `docs` test: runs Doxygen over the installed headers (docs/Doxyfile.in, HTML into a scratch folder) and fails on any warning
that docs/undocumented.txt does not list (a new undocumented public declaration, a broken \\ref, a bad command),
and on a listed one that no longer occurs (so the list only shrinks). Warnings are compared without line numbers.

  docs/check_docs.py DOXYFILE SRCDIR            the test
  docs/check_docs.py DOXYFILE SRCDIR --update   rewrites docs/undocumented.txt from the current warnings
"""
import os
import re
import subprocess
import sys
import tempfile


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__.strip())
    doxyfile, src = sys.argv[1], os.path.abspath(sys.argv[2])
    baseline = os.path.join(src, "docs", "undocumented.txt")
    with tempfile.TemporaryDirectory() as tmp:
        # the configured Doxyfile, writing its HTML into a scratch directory (some warnings, as unresolved links,
        # come only from generating output); later tags override earlier ones
        cfg = open(doxyfile).read() + f"\nOUTPUT_DIRECTORY = {tmp}\nGENERATE_HTML = YES\nSEARCHENGINE = NO\nWARN_AS_ERROR = NO\n"
        r = subprocess.run(["doxygen", "-"], input=cfg, capture_output=True, text=True, cwd=tmp)
    if r.returncode != 0:
        sys.exit(f"check_docs: doxygen failed ({r.returncode}):\n{r.stderr}")
    got = set()
    for line in r.stderr.splitlines():
        m = re.match(r"(.*?):(\d+): (.*)$", line)
        if m:
            got.add(os.path.relpath(m.group(1), src) + ": " + m.group(3).strip())
        elif line.strip():
            got.add(line.strip())
    # Doxygen checks the members of a namespace only when the namespace itself is documented (docs/namespaces.dox):
    # every namespace the headers open, but the internal ones, must be there
    documented = set(re.findall(r"@namespace\s+(\S+)", open(os.path.join(src, "docs", "namespaces.dox")).read()))
    for root, _, files in os.walk(os.path.join(src, "include", "tg")):
        for fn in sorted(files):
            path = os.path.join(root, fn)
            for m in re.finditer(r"^namespace\s+([A-Za-z_][\w:]*)\s*\{", open(path).read(), re.M):
                name = m.group(1)
                full = name if name.startswith("tg") else "tg::" + name
                if "detail" in full.split("::"):
                    continue
                if full not in documented:
                    got.add(os.path.relpath(path, src) + ": namespace " + full + " is not documented in docs/namespaces.dox")
    if "--update" in sys.argv:
        with open(baseline, "w") as f:
            f.write("# Doxygen warnings still allowed (public declarations without a doc comment), one a line; only\n"
                    "# shrinks: document one and remove its line (docs/check_docs.py DOXYFILE SRCDIR --update).\n")
            f.writelines(w + "\n" for w in sorted(got))
        print(f"check_docs: {len(got)} warnings written to {baseline}")
        return
    allowed = {l.rstrip("\n") for l in open(baseline) if l.strip() and not l.startswith("#")}
    new, gone = sorted(got - allowed), sorted(allowed - got)
    for w in new:
        print("new Doxygen warning (document it):", w)
    for w in gone:
        print("fixed, remove from docs/undocumented.txt:", w)
    print(f"check_docs: {len(got)} warnings, {len(allowed)} allowed, {len(new)} new, {len(gone)} stale")
    sys.exit(1 if new or gone else 0)


main()
