#!/bin/bash
# bench/peer_env, the peers' settings in bench/run: the peer is limited to the ISA tg compiles for. Under TG_CPU=haswell
# on an AVX-512 machine libtorch's oneDNN convolutions must run AVX2 kernels too (ONEDNN_MAX_CPU_ISA: oneDNN ignores
# ATEN_CPU_CAPABILITY); natively, and on an AVX2-only CPU, nothing is limited.
# usage: bench_peer_env.sh SOURCE_ROOT
set -euo pipefail
pe="$1/bench/peer_env"
avx512_flags="flags : fpu sse avx avx2 fma avx512f avx512dq avx512bw avx512vl"
avx2_flags="flags : fpu sse avx avx2 fma"
haswell="CPU: haswell (TG_CPU): AVX2+FMA, 256-bit x 16 vector registers, L2 1 MiB, 2 cores"
native="CPU: znver5 (host): AVX-512, 512-bit x 32 vector registers, L2 1 MiB, 2 cores"
fail=0
expect() {  # expect WHAT OUTPUT LINE present|absent
  if { [ "$4" = present ] && ! grep -qx "$3" <<<"$2"; } || { [ "$4" = absent ] && grep -q "^${3%%=*}=" <<<"$2"; }; then
    echo "FAIL: $1: expected $3 $4 in: $(tr '\n' ' ' <<<"$2")"
    fail=1
  fi
}
out="$("$pe" "$haswell" "$avx512_flags")"
expect "TG_CPU=haswell on AVX-512" "$out" "ONEDNN_MAX_CPU_ISA=AVX2" present
expect "TG_CPU=haswell on AVX-512" "$out" "ATEN_CPU_CAPABILITY=avx2" present
out="$("$pe" "$native" "$avx512_flags")"
expect "AVX-512 host" "$out" "ONEDNN_MAX_CPU_ISA=AVX2" absent
expect "AVX-512 host" "$out" "ATEN_CPU_CAPABILITY=avx2" absent
out="$(OPENBLAS_CORETYPE=Haswell "$pe" "$native" "$avx512_flags")"
expect "AVX-512 host, OPENBLAS_CORETYPE=Haswell in the environment" "$out" "OPENBLAS_CORETYPE=SkylakeX" present
out="$(OPENBLAS_CORETYPE=SkylakeX "$pe" "$haswell" "$avx512_flags")"
expect "TG_CPU=haswell, OPENBLAS_CORETYPE=SkylakeX in the environment" "$out" "OPENBLAS_CORETYPE=Haswell" present
out="$(env -u OPENBLAS_CORETYPE "$pe" "$haswell" "$avx2_flags")"
expect "AVX2-only host" "$out" "ONEDNN_MAX_CPU_ISA=AVX2" absent
expect "AVX2-only host" "$out" "ATEN_CPU_CAPABILITY=avx2" absent
exit $fail
