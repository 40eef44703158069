#!/usr/bin/env python3
"""Writes src/nn/gguf_grids.hpp: the lattice tables of ggml's IQ quantisation types, taken from ggml's
ggml-common.h (MIT). They are part of the GGUF format's definition (a code indexes them), so they are copied,
never retyped. With --check PY, every entry is compared with tinygrad's copy (tinygrad/runtime/autogen/ggml_common.py).

  scripts/gen_gguf_grids.py path/to/ggml-common.h [--check path/to/ggml_common.py] > src/nn/gguf_grids.hpp
"""
import re, sys

TABLES = [  # name, C type, entries
  ("kmask_iq2xs", "uint8_t", 8), ("ksigns_iq2xs", "uint8_t", 128),
  ("iq2xxs_grid", "uint64_t", 256), ("iq2xs_grid", "uint64_t", 512), ("iq2s_grid", "uint64_t", 1024),
  ("iq3xxs_grid", "uint32_t", 256), ("iq3s_grid", "uint32_t", 512), ("iq1s_grid", "uint64_t", 2048),
]

def tables_from_c(src):
  out = {}
  for name, ctype, n in TABLES:
    m = re.search(r"GGML_TABLE_BEGIN\(\s*" + ctype + r"\s*,\s*" + name + r"\s*,\s*\w+\s*\)(.*?)GGML_TABLE_END\(\)", src, re.S)
    if not m: sys.exit(f"{name} not found")
    vals = [int(v, 0) for v in re.findall(r"0x[0-9a-fA-F]+|\d+", m.group(1))]
    if len(vals) != n: sys.exit(f"{name}: {len(vals)} entries, expected {n}")
    out[name] = vals
  delta = re.search(r"#define IQ1S_DELTA\s+([0-9.]+)f", src)
  if not delta or float(delta.group(1)) != 0.125: sys.exit("IQ1S_DELTA is not 0.125")
  return out

def main():
  args = sys.argv[1:]
  src = open(args[0]).read()
  t = tables_from_c(src)
  if "--check" in args:
    py = open(args[args.index("--check") + 1]).read()
    for name, _, n in TABLES:
      m = re.search(r"^" + name + r" = \((.*?)\)$", py, re.M)
      theirs = [int(v, 0) for v in re.findall(r"0x[0-9a-fA-F]+|\d+", m.group(1))]
      if theirs != t[name]: sys.exit(f"{name} differs from tinygrad's copy")
      print(f"// {name}: {n} entries, equal to tinygrad's", file=sys.stderr)
  w = sys.stdout.write
  w("// The lattice tables of ggml's IQ quantisation types (iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s, iq1_s, iq1_m):\n"
    "// part of the GGUF format's definition, copied from ggml's ggml-common.h (MIT License, Copyright (c) 2023-2024\n"
    "// The ggml authors) by scripts/gen_gguf_grids.py, and checked there entry by entry against tinygrad's copy.\n"
    "// Do not edit by hand. Each grid entry packs 4 (uint32) or 8 (uint64) byte-sized values, lowest byte first.\n"
    "#pragma once\n#include <cstdint>\n\nnamespace tg::nn::ggml_grids {\n\n")
  for name, ctype, n in TABLES:
    hexa = ctype != "uint8_t"
    digits = 16 if ctype == "uint64_t" else 8
    per = 4 if ctype == "uint64_t" else 8 if hexa else 16
    vals = [f"0x{v:0{digits}x}" if hexa else str(v) for v in t[name]]
    w(f"inline constexpr {ctype} {name}[{n}] = {{\n")
    for i in range(0, n, per): w("    " + ", ".join(vals[i:i + per]) + ",\n")
    w("};\n\n")
  w("// iq1_s / iq1_m: y = dl * (grid value + delta), delta = +-IQ1S_DELTA\ninline constexpr float iq1s_delta = 0.125f;\n\n"
    "}  // namespace tg::nn::ggml_grids\n")

main()
