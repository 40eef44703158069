#!/usr/bin/env python3
"""Writes a C++ header holding a file's bytes as `inline constexpr char NAME[]` (the chat page, at build time).
Usage: embed.py INPUT OUTPUT NAME"""
import sys

src, out, name = sys.argv[1:4]
data = open(src, 'rb').read()
rows = [', '.join(str(b if b < 128 else b - 256) for b in data[i:i + 24]) for i in range(0, len(data), 24)]
with open(out, 'w') as f:
    f.write('// generated from %s by embed.py\n#pragma once\n' % src.split('/')[-1])
    f.write('inline constexpr char %s[] = {\n  %s,\n  0};\n' % (name, ',\n  '.join(rows)))
