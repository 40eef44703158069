// The in-process CPU compiler: LLVM IR text -> O2 for the host CPU -> ELF object in memory, and the loader that
// links objects into one process-wide ORC LLJIT, one JITDylib per program.
#include <array>
#include <math.h>
#include <unistd.h>

#include <llvm/ADT/SmallVector.h>
#include <llvm/ADT/StringMap.h>
#include <llvm/Analysis/ValueTracking.h>
#include <llvm/Analysis/VectorUtils.h>
#include <llvm/Config/llvm-config.h>
#include <llvm/ExecutionEngine/Orc/Core.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/IR/DiagnosticHandler.h>
#include <llvm/IR/DiagnosticInfo.h>
#include <llvm/IR/DiagnosticPrinter.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Instructions.h>
#include <llvm/IR/PatternMatch.h>
#include <llvm/IR/IntrinsicsX86.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>
#include <llvm/IRReader/IRReader.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Object/ObjectFile.h>
#include <llvm/Object/SymbolSize.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/SourceMgr.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/KnownBits.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/Target/TargetOptions.h>
#include <llvm/TargetParser/Host.h>
#include <llvm/Transforms/Utils/Local.h>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>

#include "cpu.hpp"
#include "tg/env.hpp"
#include "tg/error.hpp"

// libgcc's float16 conversions: LLVM calls them for `half` on x86 CPUs without F16C.
extern "C" void __extendhfsf2(void);
extern "C" void __truncsfhf2(void);

namespace tg::cpu {

namespace {

struct HostTarget {
  std::string triple, cpu, features;
  const llvm::Target* target = nullptr;
};

// cpu_target() (the host's CPU or TG_CPU's) and its LLVM target.
const HostTarget& host() {
  static const HostTarget h = [] {
    init_llvm();
    const CpuTarget& c = cpu_target();
    HostTarget t{c.triple, c.cpu, c.features, nullptr};
    std::string err;
    t.target = llvm::TargetRegistry::lookupTarget(t.triple, err);
    if (!t.target) throw Error("[llvm] no LLVM target for " + t.triple + ": " + err);
    return t;
  }();
  return h;
}

std::string llvm_message(llvm::Error e) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << e;
  return s;
}

// Sums of vector int32 adds (tg's lane accumulators: the integer terms factor_reduce_invariants sums per block).
bool is_int32_vector_add(llvm::Value* v) {
  auto* b = llvm::dyn_cast<llvm::BinaryOperator>(v);
  return b && b->getOpcode() == llvm::Instruction::Add && b->getType()->isVectorTy() &&
         b->getType()->getScalarType()->isIntegerTy(32);
}
// the adds of f not summed further by an add (in the same block) with only them as user, in program order
std::vector<llvm::BinaryOperator*> sum_roots(llvm::Function& f) {
  std::vector<llvm::BinaryOperator*> roots;
  for (llvm::BasicBlock& bb : f)
    for (llvm::Instruction& i : bb)
      if (is_int32_vector_add(&i) && !(i.hasOneUse() && is_int32_vector_add(i.user_back()) &&
                                       llvm::cast<llvm::Instruction>(i.user_back())->getParent() == &bb))
        roots.push_back(llvm::cast<llvm::BinaryOperator>(&i));
  return roots;
}
// the terms of the sum at root: its adds with one use in root's block, opened (LLVM's reassociation may have put
// related terms in different adds of the sum)
std::vector<llvm::Value*> sum_terms(llvm::BinaryOperator* root) {
  std::vector<llvm::Value*> terms, stack{root};
  while (!stack.empty()) {
    llvm::Value* v = stack.back();
    stack.pop_back();
    auto* b = llvm::dyn_cast<llvm::BinaryOperator>(v);
    if (is_int32_vector_add(v) && (v == root || (v->hasOneUse() && b->getParent() == root->getParent())))
      stack.insert(stack.end(), {b->getOperand(1), b->getOperand(0)});
    else
      terms.push_back(v);
  }
  return terms;
}

// The sum at root becomes `sums` (the rewritten terms) plus the terms no rewrite used; root goes to `dead`.
void replace_sum(llvm::IRBuilder<>& b, llvm::BinaryOperator* root, std::vector<llvm::Value*>& sums,
                 const std::vector<llvm::Value*>& terms, const std::vector<bool>& used,
                 std::vector<llvm::Instruction*>& dead) {
  for (size_t i = 0; i < terms.size(); i++)
    if (!used[i]) sums.push_back(terms[i]);
  llvm::Value* r = sums[0];
  for (size_t i = 1; i < sums.size(); i++) r = b.CreateAdd(r, sums[i]);
  root->replaceAllUsesWith(r);
  dead.push_back(root);
}

// Pair multiply-adds. tg's lane loops sum integer products in adjacent pairs (factor_reduce_invariants: lane l of a
// q8_0 block takes x[2l] w[2l] + x[2l+1] w[2l+1]). The loop vectoriser deinterleaves each pair's operands first
// (even and odd elements of one loaded vector, `strided.vec`) and multiplies the halves apart, which x86 selects as
// vpmovwb + vpmovsxbd + vpmulld. Written as the product of the whole vectors with its even and odd lanes added, the
// same sum is what the backends select as one multiply-add of 16-bit pairs (x86 vpmaddwd, vpdpwssd with an
// accumulator; other targets their widening multiply-adds, or the plain multiply and shuffles):
//   add(mul(E(even(A)), E'(even(B))), mul(E(odd(A)), E'(odd(B))))
//     -> add(even(m), odd(m)), m = mul(E(A), E'(B)),
// E, E' the same lane-wise casts and operations with splat constants on both halves (a sign extension; q4_0's
// nibble arithmetic). The values are the same lane for lane (integer adds and multiplies, no rounding).
class PairMulAdd {
 public:
  // Rewrites every such pair among the terms of each sum of vector integer adds in f (LLVM's reassociation may
  // have put a pair's two products in different adds of the sum); returns how many pairs.
  static int run(llvm::Function& f) {
    int n = 0;
    std::optional<PairMulAdd> p;  // one per block: the whole vectors a block's rows share (x's) are widened once
    std::vector<llvm::Instruction*> dead;
    for (llvm::BinaryOperator* root : sum_roots(f)) {
      std::vector<llvm::Value*> terms = sum_terms(root);
      auto is_mul = [](llvm::Value* v) {
        auto* b = llvm::dyn_cast<llvm::BinaryOperator>(v);
        return b && b->getOpcode() == llvm::Instruction::Mul;
      };
      const unsigned lanes = llvm::cast<llvm::FixedVectorType>(root->getType())->getNumElements();
      if (!p || p->block_ != root->getParent() || p->lanes_ != lanes) p.emplace(root, lanes);
      p->b_.SetInsertPoint(root);
      llvm::IRBuilder<>& b = p->b_;
      llvm::SmallVector<int, 64> even, odd;
      for (unsigned k = 0; k < lanes; k++) even.push_back(int(2 * k)), odd.push_back(int(2 * k + 1));
      std::vector<llvm::Value*> sums;
      std::vector<bool> used(terms.size(), false);
      for (size_t i = 0; i < terms.size(); i++)
        for (size_t j = i + 1; j < terms.size() && !used[i] && is_mul(terms[i]); j++) {
          if (used[j] || !is_mul(terms[j])) continue;
          llvm::Value* m = p->widen(terms[i], terms[j]);
          if (!m) m = p->widen(terms[j], terms[i]);
          if (!m) continue;
          used[i] = used[j] = true;
          sums.push_back(b.CreateAdd(b.CreateShuffleVector(m, even), b.CreateShuffleVector(m, odd)));
        }
      if (sums.empty()) continue;
      n += int(sums.size());
      replace_sum(b, root, sums, terms, used, dead);
    }
    for (llvm::Instruction* d : dead) llvm::RecursivelyDeleteTriviallyDeadInstructions(d);
    return n;
  }

  PairMulAdd(llvm::Instruction* at, unsigned lanes) : b_(at), block_(at->getParent()), lanes_(lanes) {}

  // the shuffle's source when s takes its even (parity 0) or odd (1) elements, each of a vector twice as long
  llvm::Value* half_of(llvm::Value* v, int parity) const {
    auto* s = llvm::dyn_cast<llvm::ShuffleVectorInst>(v);
    if (!s || !llvm::isa<llvm::PoisonValue, llvm::UndefValue>(s->getOperand(1))) return nullptr;
    auto* src = llvm::dyn_cast<llvm::FixedVectorType>(s->getOperand(0)->getType());
    if (!src || src->getNumElements() != 2 * lanes_ || s->getShuffleMask().size() != lanes_) return nullptr;
    for (unsigned k = 0; k < lanes_; k++)
      if (s->getShuffleMask()[k] != int(2 * k) + parity) return nullptr;
    return s->getOperand(0);
  }
  llvm::Type* twice(llvm::Type* t) const { return llvm::FixedVectorType::get(t->getScalarType(), 2 * lanes_); }

  // e over the whole vectors, given e over their even elements and o the same over their odd ones; null if o is not
  llvm::Value* widen(llvm::Value* e, llvm::Value* o) {
    auto [it, fresh] = memo_.try_emplace({e, o}, nullptr);
    if (fresh) it->second = widen_new(e, o);
    return it->second;
  }
  llvm::Value* widen_new(llvm::Value* e, llvm::Value* o) {
    if (llvm::Value* a = half_of(e, 0); a && a == half_of(o, 1)) return a;
    if (auto* c = llvm::dyn_cast<llvm::Constant>(e)) {
      llvm::Constant* s = c->getSplatValue();
      return s && e == o ? llvm::ConstantVector::getSplat(llvm::ElementCount::getFixed(2 * lanes_), s) : nullptr;
    }
    if (auto* ce = llvm::dyn_cast<llvm::CastInst>(e)) {
      auto* co = llvm::dyn_cast<llvm::CastInst>(o);
      if (!co || co->getOpcode() != ce->getOpcode() || co->getType() != ce->getType()) return nullptr;
      llvm::Value* w = widen(ce->getOperand(0), co->getOperand(0));
      return w ? b_.CreateCast(ce->getOpcode(), w, twice(ce->getType())) : nullptr;
    }
    auto* be = llvm::dyn_cast<llvm::BinaryOperator>(e);
    auto* bo = llvm::dyn_cast<llvm::BinaryOperator>(o);
    if (!be || !bo || be->getOpcode() != bo->getOpcode()) return nullptr;
    for (int swap = 0; swap < (be->isCommutative() ? 2 : 1); swap++) {
      llvm::Value* x = widen(be->getOperand(0), bo->getOperand(swap));
      llvm::Value* y = x ? widen(be->getOperand(1), bo->getOperand(1 - swap)) : nullptr;
      if (!y) continue;
      auto* r = llvm::cast<llvm::BinaryOperator>(b_.CreateBinOp(be->getOpcode(), x, y));
      r->copyIRFlags(be);
      r->andIRFlags(bo);
      return r;
    }
    return nullptr;
  }

  llvm::IRBuilder<> b_;
  llvm::BasicBlock* block_;
  unsigned lanes_;
  std::map<std::pair<llvm::Value*, llvm::Value*>, llvm::Value*> memo_;
};

// The x86 features a kernel is compiled for (its "target-features" attribute): has("avx2"), and whether vpdpbusd
// takes vectors of `bits` (AVX512-VNNI at 512; at 128 and 256 with AVX512-VL, or AVX-VNNI).
struct TargetFeatures {
  std::string feats;
  explicit TargetFeatures(const llvm::Function& f)
      : feats("," + f.getFnAttribute("target-features").getValueAsString().str() + ",") {}
  bool has(const char* x) const { return feats.find(std::string(",+") + x + ",") != std::string::npos; }
  bool vnni(unsigned bits) const {
    return (bits == 512 && has("avx512vnni")) ||
           ((bits == 128 || bits == 256) && ((has("avx512vnni") && has("avx512vl")) || has("avxvnni")));
  }
};

// Unsigned-by-signed byte multiply-adds (x86 pmaddubsw). q4_0's integer terms after factor_reduce_invariants: lane
// l sums (lo[l] - 8) x[l] + (hi[l] - 8) x[l + 16], lo and hi the nibbles of byte l, x the quantised activation's
// int8s, which x86 computed as int32 lanes (2 vpmovzxbd, 2 offset adds, 2 vpmulld a block and row). Each pair of
// such products in one sum, mul(E(u1) + c1, sext(s1)) + mul(E(u2) + c2, sext(s2)) with u1, u2 vectors of bytes
// known below 128 (E a zero extension), is
//   sext(pmaddubsw(interleave(u1, u2), interleave(s1, s2))) + (c1 sext(s1) + c2 sext(s2)),
// pmaddubsw summing the adjacent products of unsigned and signed bytes into 16-bit lanes: exact, as |u s| <= 127 * 128
// and two of them stay below 2^15 (no saturation). The second term reads only s (x, shared by a tile's rows: computed
// once per block). u1 = w & 15, u2 = w >> 4 (q4_0's two nibbles of the same bytes) interleave as one 16-bit operation:
// (zext(w) | zext(w) << 4) & 0x0F0F (low byte the low nibble). x86 with SSSE3 (16-byte operands), AVX2 (32) or
// AVX-512BW (64) only; several pairs of one sum add their 16-bit results while the sum's bound stays below 2^15 and
// widen once (AVX2's 8 lanes: two pairs a q4_0 block). With VNNI (AVX512-VNNI, AVX-VNNI) each pair is one vpdpbusd
// on the lane's 32 bits instead (the pair's two bytes and two zero bytes), accumulating into the offset or the sum's
// previous pair: no widening, no add. Where a sum has two such pairs of two byte vectors w1, w2 (lowering's quads on
// a machine with the 4-byte dot: lane l takes bytes 2l and 2l + 1, LLVM's even and odd bytes of one load), VNNI takes
// all four products in one vpdpbusd: the lane's bytes (w1 & 15, w1 >> 4, w2 & 15, w2 >> 4), from the load widened to
// 16 bits ((v | v << 4) & 0x0F0F0F0F), against x's four bytes; no byte of the lane is zero. Runs before PairMulAdd,
// which would otherwise widen the even and odd halves first. BYTE_MADD=0 turns it off.
class ByteMulAdd {
 public:
  static int run(llvm::Function& f) {
    const TargetFeatures tf(f);
    auto has = [&](const char* x) { return tf.has(x); };
    if (!has("ssse3")) return 0;
    const llvm::DataLayout& dl = f.getParent()->getDataLayout();
    int n = 0;
    std::optional<ByteMulAdd> p;
    std::vector<llvm::Instruction*> dead;
    for (llvm::BinaryOperator* root : sum_roots(f)) {
      auto* vt = llvm::cast<llvm::FixedVectorType>(root->getType());
      const unsigned lanes = vt->getNumElements(), bits = 16 * lanes;
      // VNNI: vpdpbusd on the lanes' 32 bits (each lane's pair of bytes and two zero bytes), else pmaddubsw
      const unsigned lane_bits = 32 * lanes;
      const bool vnni = tf.vnni(lane_bits);
      llvm::Intrinsic::ID id = llvm::Intrinsic::not_intrinsic;
      if (vnni) {
        id = lane_bits == 512 ? llvm::Intrinsic::x86_avx512_vpdpbusd_512
             : lane_bits == 256 ? llvm::Intrinsic::x86_avx512_vpdpbusd_256
                                : llvm::Intrinsic::x86_avx512_vpdpbusd_128;
      } else {
        if (bits == 128) id = llvm::Intrinsic::x86_ssse3_pmadd_ub_sw_128;
        if (bits == 256 && has("avx2")) id = llvm::Intrinsic::x86_avx2_pmadd_ub_sw;
        if (bits == 512 && has("avx512bw")) id = llvm::Intrinsic::x86_avx512_pmaddubs_w_512;
      }
      if (id == llvm::Intrinsic::not_intrinsic) continue;
      std::vector<llvm::Value*> terms = sum_terms(root);
      struct Prod {
        size_t term;
        llvm::Value *u, *s;
        int64_t c;
        uint64_t umax;  // u's largest value (known bits)
      };
      std::vector<Prod> prods;
      for (size_t i = 0; i < terms.size(); i++) {
        auto* m = llvm::dyn_cast<llvm::BinaryOperator>(terms[i]);
        if (!m || m->getOpcode() != llvm::Instruction::Mul) continue;
        for (int side = 0; side < 2; side++) {
          llvm::Value* u = nullptr;
          int64_t c = 0;
          llvm::Value* s = sext_byte(m->getOperand(1 - side));
          if (!s || !unsigned_byte(m->getOperand(side), u, c)) continue;
          const uint64_t umax = llvm::computeKnownBits(u, dl).getMaxValue().getZExtValue();
          if (umax > 127) continue;
          prods.push_back({i, u, s, c, umax});
          break;
        }
      }
      if (prods.size() < 2) continue;
      if (!p || p->block_ != root->getParent()) p.emplace(root);
      p->b_.SetInsertPoint(root);
      llvm::IRBuilder<>& b = p->b_;
      llvm::Function* madd = llvm::Intrinsic::getDeclaration(f.getParent(), id);
      std::vector<bool> used(terms.size(), false);
      std::vector<llvm::Value*> sums;
      llvm::Value* acc32 = nullptr;
      // without VNNI, quads are pmaddubsw over the lane's 4 bytes (two 16-bit sums of 2 products) and pmaddwd(., 1)
      llvm::Intrinsic::ID qubs = llvm::Intrinsic::not_intrinsic, qwd = qubs;
      if (!vnni && lane_bits == 128) qubs = llvm::Intrinsic::x86_ssse3_pmadd_ub_sw_128, qwd = llvm::Intrinsic::x86_sse2_pmadd_wd;
      if (!vnni && lane_bits == 256 && has("avx2")) qubs = llvm::Intrinsic::x86_avx2_pmadd_ub_sw, qwd = llvm::Intrinsic::x86_avx2_pmadd_wd;
      if (!vnni && lane_bits == 512 && has("avx512bw"))
        qubs = llvm::Intrinsic::x86_avx512_pmaddubs_w_512, qwd = llvm::Intrinsic::x86_avx512_pmaddw_d_512;
      // quads first: two bytes' nibble pairs a lane (4 products); the rest in pairs below
      if (vnni || qubs != llvm::Intrinsic::not_intrinsic) {
        std::vector<std::array<size_t, 2>> np;  // prods (lo, hi): the two nibbles of one byte vector
        std::vector<bool> paired(prods.size(), false);
        for (size_t i = 0; i < prods.size(); i++)
          for (size_t j = 0; j < prods.size() && !paired[i]; j++)
            if (j != i && !paired[j] && nibble_source(prods[i].u, prods[j].u)) {
              np.push_back({i, j});
              paired[i] = paired[j] = true;
            }
        std::vector<bool> in_quad(prods.size(), false);
        auto* bytes = llvm::FixedVectorType::get(b.getInt8Ty(), 4 * lanes);
        auto* halves = llvm::FixedVectorType::get(b.getInt16Ty(), 2 * lanes);
        llvm::Value* acc16q = nullptr;  // pmaddubsw's sums, widened by one pmaddwd while below 2^15
        uint64_t bound16q = 0;
        auto widen16 = [&] {
          if (acc16q)
            sums.push_back(b.CreateCall(llvm::Intrinsic::getDeclaration(f.getParent(), qwd),
                                        {acc16q, llvm::ConstantInt::get(halves, 1)}));
          acc16q = nullptr, bound16q = 0;
        };
        for (size_t q = 0; q + 1 < np.size(); q += 2) {
          const Prod &a = prods[np[q][0]], &c = prods[np[q][1]], &e = prods[np[q + 1][0]], &g = prods[np[q + 1][1]];
          llvm::Value* u = p->quad_nibbles(nibble_source(a.u, c.u), nibble_source(e.u, g.u), vt);
          llvm::Value* sq = p->interleave4(a.s, c.s, e.s, g.s, vt);
          llvm::Value* off = nullptr;
          if (a.c || c.c || e.c || g.c)
            off = b.CreateAdd(p->offset(a.s, a.c, c.s, c.c, vt), p->offset(e.s, e.c, g.s, g.c, vt));
          if (vnni) {
            llvm::Value* start = acc32 ? acc32 : off ? off : llvm::Constant::getNullValue(vt);
            if (acc32 && off) sums.push_back(off);
            acc32 = b.CreateCall(madd, {start, u, sq});
          } else {
            const uint64_t bound = 128 * std::max(a.umax + c.umax, e.umax + g.umax);
            if (acc16q && bound16q + bound > 32767) widen16();
            llvm::Value* r = b.CreateCall(llvm::Intrinsic::getDeclaration(f.getParent(), qubs),
                                          {b.CreateBitCast(u, bytes), b.CreateBitCast(sq, bytes)});
            acc16q = acc16q ? b.CreateAdd(acc16q, r) : r;
            bound16q += bound;
            if (off) sums.push_back(off);
          }
          for (size_t t : {np[q][0], np[q][1], np[q + 1][0], np[q + 1][1]}) used[prods[t].term] = in_quad[t] = true;
          n++;
        }
        widen16();
        std::vector<Prod> rest;
        for (size_t i = 0; i < prods.size(); i++)
          if (!in_quad[i]) rest.push_back(prods[i]);
        prods = std::move(rest);
      }
      // pmaddubsw's 16-bit results are summed as such while the sum's bound stays below 2^15 (q4_0 on AVX2: a
      // lane's two pairs a block), then widened once; vpdpbusd accumulates each pair into the last one's result
      llvm::Value* acc16 = nullptr;
      uint64_t bound16 = 0;
      auto flush16 = [&] {
        if (acc16) sums.push_back(b.CreateSExt(acc16, vt));
        acc16 = nullptr, bound16 = 0;
      };
      for (size_t k = 0; k + 1 < prods.size(); k += 2) {
        Prod a = prods[k], c = prods[k + 1];
        llvm::Type* ut = vnni ? vt : llvm::FixedVectorType::get(b.getInt8Ty(), 2 * lanes);
        llvm::Value* u = p->nibbles(a.u, c.u, ut);
        if (!u) {
          if ((u = p->nibbles(c.u, a.u, ut))) std::swap(a, c);
          else u = p->interleave(a.u, c.u, ut);
        }
        llvm::Value* s = p->interleave(a.s, c.s, ut);
        llvm::Value* off = a.c || c.c ? p->offset(a.s, a.c, c.s, c.c, vt) : nullptr;
        if (vnni) {  // the offset as the accumulator
          llvm::Value* start = acc32 ? acc32 : off ? off : llvm::Constant::getNullValue(vt);
          if (acc32 && off) sums.push_back(off);
          acc32 = b.CreateCall(madd, {start, u, s});
        } else {
          const uint64_t bound = 128 * (a.umax + c.umax);
          if (acc16 && bound16 + bound > 32767) flush16();
          llvm::Value* r = b.CreateCall(madd, {u, s});
          acc16 = acc16 ? b.CreateAdd(acc16, r) : r;
          bound16 += bound;
          if (off) sums.push_back(off);
        }
        used[a.term] = used[c.term] = true;
        n++;
      }
      flush16();
      if (acc32) sums.push_back(acc32);
      replace_sum(b, root, sums, terms, used, dead);
    }
    for (llvm::Instruction* d : dead) llvm::RecursivelyDeleteTriviallyDeadInstructions(d);
    return n;
  }

  explicit ByteMulAdd(llvm::Instruction* at) : b_(at), block_(at->getParent()) {}

  // s when v = sext(s), s a vector of bytes
  static llvm::Value* sext_byte(llvm::Value* v) {
    auto* c = llvm::dyn_cast<llvm::SExtInst>(v);
    return c && c->getOperand(0)->getType()->getScalarType()->isIntegerTy(8) ? c->getOperand(0) : nullptr;
  }
  // v = zext(u) + c, u a vector of bytes, c a splat constant (0 when absent)
  static bool unsigned_byte(llvm::Value* v, llvm::Value*& u, int64_t& c) {
    c = 0;
    if (auto* a = llvm::dyn_cast<llvm::BinaryOperator>(v); a && a->getOpcode() == llvm::Instruction::Add) {
      auto* k = llvm::dyn_cast<llvm::Constant>(a->getOperand(1));
      auto* s = k ? llvm::dyn_cast_or_null<llvm::ConstantInt>(k->getSplatValue()) : nullptr;
      if (!s) return false;
      c = s->getSExtValue();
      v = a->getOperand(0);
    }
    auto* z = llvm::dyn_cast<llvm::ZExtInst>(v);
    if (!z || !z->getOperand(0)->getType()->getScalarType()->isIntegerTy(8)) return false;
    u = z->getOperand(0);
    return true;
  }
  // The elements of vectors a and b (n each) alternating: a[0], b[0], a[1], b[1], ... (2n)
  llvm::Value* alternate(llvm::Value* a, llvm::Value* b) {
    const unsigned l = llvm::cast<llvm::FixedVectorType>(a->getType())->getNumElements();
    llvm::SmallVector<int, 64> mask;
    for (unsigned k = 0; k < l; k++) mask.push_back(int(k)), mask.push_back(int(l + k));
    return b_.CreateShuffleVector(a, b, mask);
  }
  // The elements of a and b alternating (a[0], b[0], a[1], ...) as bytes of type t: <2n x i8>, or <n x i32> with
  // each pair zero-extended to 32 bits (vpdpbusd's four bytes a lane, two of them zero).
  llvm::Value* interleave(llvm::Value* a, llvm::Value* c, llvm::Type* t) {
    auto [it, fresh] = memo_.try_emplace({{a, c}, t}, nullptr);
    if (fresh) {
      const unsigned l = llvm::cast<llvm::FixedVectorType>(a->getType())->getNumElements();
      llvm::Value* v = alternate(a, c);
      if (t != v->getType())
        v = b_.CreateZExt(b_.CreateBitCast(v, llvm::FixedVectorType::get(b_.getInt16Ty(), l)), t);
      it->second = v;
    }
    return it->second;
  }
  // w when lo = w & 15 and hi = w >> 4 (the two nibbles of the bytes w), else null
  static llvm::Value* nibble_source(llvm::Value* lo, llvm::Value* hi) {
    auto splat_is = [](llvm::Value* v, uint64_t k) {
      auto* c = llvm::dyn_cast<llvm::Constant>(v);
      auto* s = c ? llvm::dyn_cast_or_null<llvm::ConstantInt>(c->getSplatValue()) : nullptr;
      return s && s->getZExtValue() == k;
    };
    auto* a = llvm::dyn_cast<llvm::BinaryOperator>(lo);
    auto* h = llvm::dyn_cast<llvm::BinaryOperator>(hi);
    if (!a || !h || a->getOpcode() != llvm::Instruction::And || h->getOpcode() != llvm::Instruction::LShr ||
        a->getOperand(0) != h->getOperand(0) || !splat_is(a->getOperand(1), 15) || !splat_is(h->getOperand(1), 4))
      return nullptr;
    return a->getOperand(0);
  }
  // interleave(w & 15, w >> 4) computed on 16-bit (or 32-bit) lanes, or null when lo and hi are not those nibbles of
  // one w
  llvm::Value* nibbles(llvm::Value* lo, llvm::Value* hi, llvm::Type* t) {
    llvm::Value* src = nibble_source(lo, hi);
    if (!src) return nullptr;
    auto [it, fresh] = memo_.try_emplace({{lo, hi}, t}, nullptr);
    if (fresh) {
      auto* w = llvm::cast<llvm::FixedVectorType>(src->getType());
      auto* wide = t->getScalarType()->isIntegerTy(32) ? llvm::cast<llvm::FixedVectorType>(t)
                                                        : llvm::FixedVectorType::get(b_.getInt16Ty(), w->getNumElements());
      llvm::Value* z = b_.CreateZExt(src, wide);
      llvm::Value* v = b_.CreateAnd(b_.CreateOr(z, b_.CreateShl(z, 4)), llvm::ConstantInt::get(wide, 0x0F0F));
      it->second = b_.CreateBitCast(v, t);
    }
    return it->second;
  }
  // The nibbles of two byte vectors w1, w2 as the four bytes of each int32 lane of t: (w1 & 15, w1 >> 4, w2 & 15,
  // w2 >> 4). The bytes interleaved (w1[l], w2[l] adjacent: where w1 and w2 are the even and odd bytes of one load,
  // that load), widened to 16 bits (w1 in the lane's bits 0-7, w2 in 16-23), then (v | v << 4) & 0x0F0F0F0F.
  llvm::Value* quad_nibbles(llvm::Value* w1, llvm::Value* w2, llvm::Type* t) {
    auto [it, fresh] = quad_nibbles_.try_emplace({{w1, w2}, t}, nullptr);
    if (fresh) {
      const unsigned l = llvm::cast<llvm::FixedVectorType>(w1->getType())->getNumElements();
      llvm::Value* z = b_.CreateZExt(alternate(w1, w2), llvm::FixedVectorType::get(b_.getInt16Ty(), 2 * l));
      llvm::Value* v = b_.CreateBitCast(z, t);
      it->second = b_.CreateAnd(b_.CreateOr(v, b_.CreateShl(v, 4)), llvm::ConstantInt::get(t, 0x0F0F0F0F));
    }
    return it->second;
  }
  // The byte vectors s1..s4 as the four bytes of each int32 lane of t (s1[l], s2[l], s3[l], s4[l]).
  llvm::Value* interleave4(llvm::Value* s1, llvm::Value* s2, llvm::Value* s3, llvm::Value* s4, llvm::Type* t) {
    auto [it, fresh] = quads_.try_emplace({s1, s2, s3, s4}, nullptr);
    if (fresh) {
      const unsigned l = llvm::cast<llvm::FixedVectorType>(s1->getType())->getNumElements();
      auto* h = llvm::FixedVectorType::get(b_.getInt16Ty(), l);  // byte pairs as 16-bit elements
      llvm::Value *lo = b_.CreateBitCast(alternate(s1, s2), h), *hi = b_.CreateBitCast(alternate(s3, s4), h);
      it->second = b_.CreateBitCast(alternate(lo, hi), t);
    }
    return it->second;
  }
  // c1 sext(s1) + c2 sext(s2) in vt
  llvm::Value* offset(llvm::Value* s1, int64_t c1, llvm::Value* s2, int64_t c2, llvm::Type* vt) {
    auto [it, fresh] = offsets_.try_emplace({s1, c1, s2, c2}, nullptr);
    if (fresh) {
      auto term = [&](llvm::Value* s, int64_t c) {
        return b_.CreateMul(b_.CreateSExt(s, vt), llvm::ConstantInt::get(vt, uint64_t(c), true));
      };
      it->second = b_.CreateAdd(term(s1, c1), term(s2, c2));
    }
    return it->second;
  }

  llvm::IRBuilder<> b_;
  llvm::BasicBlock* block_;
  std::map<std::pair<std::pair<llvm::Value*, llvm::Value*>, llvm::Type*>, llvm::Value*> memo_;
  std::map<std::tuple<llvm::Value*, int64_t, llvm::Value*, int64_t>, llvm::Value*> offsets_;
  std::map<std::tuple<llvm::Value*, llvm::Value*, llvm::Value*, llvm::Value*>, llvm::Value*> quads_;
  std::map<std::pair<std::pair<llvm::Value*, llvm::Value*>, llvm::Type*>, llvm::Value*> quad_nibbles_;
};

// Four-byte dot products (x86 vpdpbusd). int_gemm (src/schedule/layout.cpp) sums, per int32 lane, the products of
// the four bytes of two int32 words, one side's bytes unsigned (optionally masked to a nibble), the other's signed:
//   sum over t < 4 of ((U >> 8t) & m) * sext(trunc(S >> 8t))
// which LLVM's combines write as and/lshr/ashr and ashr(shl(S, 24 - 8t), 24); U or S may be a splat of a scalar word
// (x's word, shared by the vector's lanes). The four terms of one sum with the same U, S and m are one
//   vpdpbusd(acc, U & (m * 0x01010101), S)
// (VNNI: AVX512-VNNI, AVX-VNNI), else, where each pair of products stays below 2^15 (m <= 127: q4_0's nibbles),
// pmaddwd(pmaddubsw(U & .., S), 1) (SSSE3/AVX2/AVX-512BW). Exact: the same integer sums. BYTE_MADD=0 turns it off
// with ByteMulAdd.
class QuadMulAdd {
 public:
  static int run(llvm::Function& f) {
    const TargetFeatures tf(f);
    auto has = [&](const char* x) { return tf.has(x); };
    if (!has("ssse3")) return 0;
    int n = 0;
    std::optional<QuadMulAdd> p;
    std::vector<llvm::Instruction*> dead;
    for (llvm::BinaryOperator* root : sum_roots(f)) {
      auto* vt = llvm::cast<llvm::FixedVectorType>(root->getType());
      const unsigned lanes = vt->getNumElements(), bits = 32 * lanes;
      const bool vnni = tf.vnni(bits);
      llvm::Intrinsic::ID dp = llvm::Intrinsic::not_intrinsic, ubs = dp, wd = dp;
      if (vnni) dp = bits == 512 ? llvm::Intrinsic::x86_avx512_vpdpbusd_512
                     : bits == 256 ? llvm::Intrinsic::x86_avx512_vpdpbusd_256
                                   : llvm::Intrinsic::x86_avx512_vpdpbusd_128;
      if (bits == 128) ubs = llvm::Intrinsic::x86_ssse3_pmadd_ub_sw_128, wd = llvm::Intrinsic::x86_sse2_pmadd_wd;
      if (bits == 256 && has("avx2")) ubs = llvm::Intrinsic::x86_avx2_pmadd_ub_sw, wd = llvm::Intrinsic::x86_avx2_pmadd_wd;
      if (bits == 512 && has("avx512bw"))
        ubs = llvm::Intrinsic::x86_avx512_pmaddubs_w_512, wd = llvm::Intrinsic::x86_avx512_pmaddw_d_512;
      if (!vnni && ubs == llvm::Intrinsic::not_intrinsic) continue;
      std::vector<llvm::Value*> terms = sum_terms(root);
      struct Quad {
        size_t term[4];
        unsigned seen = 0;
      };
      std::map<std::tuple<llvm::Value*, llvm::Value*, uint64_t>, Quad> quads;  // (U, S, m) -> its four products
      std::vector<std::tuple<llvm::Value*, llvm::Value*, uint64_t>> order;     // in the sum's order
      for (size_t i = 0; i < terms.size(); i++) {
        auto* mul = llvm::dyn_cast<llvm::BinaryOperator>(terms[i]);
        if (!mul || mul->getOpcode() != llvm::Instruction::Mul) continue;
        for (int side = 0; side < 2; side++) {
          Byte u, s;
          if (!unsigned_byte(mul->getOperand(side), u) || !signed_byte(mul->getOperand(1 - side), s) || u.t != s.t) continue;
          auto fits = [&](llvm::Value* w) { return !w->getType()->isVectorTy() || w->getType() == vt; };
          if (!fits(u.word) || !fits(s.word)) continue;
          auto [it, fresh] = quads.try_emplace({u.word, s.word, u.mask});
          if (fresh) order.push_back(it->first);
          Quad& q = it->second;
          if (q.seen >> u.t & 1) break;
          q.term[u.t] = i, q.seen |= 1u << u.t;
          break;
        }
      }
      if (!p || p->block_ != root->getParent()) p.emplace(root);
      p->b_.SetInsertPoint(root);
      llvm::IRBuilder<>& b = p->b_;
      std::vector<bool> used(terms.size(), false);
      std::vector<llvm::Value*> sums;
      llvm::Value* acc = nullptr;
      if (vnni) {  // the chain starts from a term no quad takes (int_gemm's offset correction) instead of zero
        std::vector<bool> in_quad(terms.size(), false);
        for (const auto& key : order)
          if (quads[key].seen == 15)
            for (size_t t : quads[key].term) in_quad[t] = true;
        for (size_t i = 0; i < terms.size() && !acc; i++)
          if (!in_quad[i] && terms[i]->getType() == vt && std::count(in_quad.begin(), in_quad.end(), true))
            acc = terms[i], used[i] = true;
      }
      for (const auto& key : order) {
        const Quad& q = quads[key];
        if (q.seen != 15) continue;
        auto [uw, sw, mask] = key;
        if (!vnni && 2 * 128 * mask > 32767) continue;  // pmaddubsw would saturate
        llvm::Value* u = p->vec(uw, vt);
        if (mask != 255) u = b.CreateAnd(u, llvm::ConstantInt::get(vt, mask * 0x01010101u));
        llvm::Value* sv = p->vec(sw, vt);
        if (vnni) {
          acc = b.CreateCall(llvm::Intrinsic::getDeclaration(f.getParent(), dp), {acc ? acc : llvm::Constant::getNullValue(vt), u, sv});
        } else {
          auto* bytes = llvm::FixedVectorType::get(b.getInt8Ty(), 4 * lanes);
          auto* words = llvm::FixedVectorType::get(b.getInt16Ty(), 2 * lanes);
          llvm::Value* r16 = b.CreateCall(llvm::Intrinsic::getDeclaration(f.getParent(), ubs),
                                          {b.CreateBitCast(u, bytes), b.CreateBitCast(sv, bytes)});
          sums.push_back(b.CreateCall(llvm::Intrinsic::getDeclaration(f.getParent(), wd),
                                      {r16, llvm::ConstantInt::get(words, 1)}));
        }
        for (size_t t : q.term) used[t] = true;
        n++;
      }
      if (acc) sums.push_back(acc);
      if (sums.empty()) continue;
      replace_sum(b, root, sums, terms, used, dead);
    }
    for (llvm::Instruction* d : dead) llvm::RecursivelyDeleteTriviallyDeadInstructions(d);
    return n;
  }

  explicit QuadMulAdd(llvm::Instruction* at) : b_(at), block_(at->getParent()) {}

  // byte t of word (a vector of i32, or a scalar i32 splat over the lanes: then word is the scalar), masked by mask
  struct Byte {
    llvm::Value* word = nullptr;
    int t = 0;
    uint64_t mask = 255;
  };
  static bool is_i32(llvm::Value* v) { return v->getType()->getScalarType()->isIntegerTy(32); }
  // v's scalar where v is a splat of one
  static llvm::Value* scalar(llvm::Value* v) {
    llvm::Value* s = v->getType()->isVectorTy() ? llvm::getSplatValue(v) : nullptr;
    return s && !llvm::isa<llvm::Constant>(s) ? s : v;
  }
  // v = word >> 8t (logical or arithmetic; t = 0: the word itself)
  static void shifted(llvm::Value* v, Byte& b) {
    using namespace llvm::PatternMatch;
    const llvm::APInt* c;
    llvm::Value* x;
    if ((match(v, m_LShr(m_Value(x), m_APInt(c))) || match(v, m_AShr(m_Value(x), m_APInt(c)))) && c->getZExtValue() % 8 == 0 &&
        c->getZExtValue() <= 24)
      b.word = x, b.t = int(c->getZExtValue() / 8);
    else
      b.word = v, b.t = 0;
  }
  // v = (word >> 8t) & mask, mask = 2^k - 1 <= 255; or zext(trunc(word >> 8t) to i8); or word >> 24 (logical)
  static bool unsigned_byte(llvm::Value* v, Byte& b) {
    using namespace llvm::PatternMatch;
    v = scalar(v);
    if (!is_i32(v)) return false;
    const llvm::APInt* c;
    llvm::Value* x;
    if (match(v, m_And(m_Value(x), m_APInt(c)))) {
      const uint64_t m = c->getZExtValue();
      if (m > 255 || (m & (m + 1))) return false;
      b.mask = m;
      shifted(x, b);
    } else if (match(v, m_ZExt(m_Trunc(m_Value(x)))) && llvm::cast<llvm::CastInst>(v)->getSrcTy()->getScalarType()->isIntegerTy(8)) {
      b.mask = 255;
      shifted(x, b);
    } else if (match(v, m_LShr(m_Value(x), m_SpecificInt(24)))) {
      b.word = x, b.t = 3, b.mask = 255;
    } else {
      return false;
    }
    b.word = scalar(b.word);
    return is_i32(b.word);
  }
  // v = sext(byte t of word): ashr(shl(word, 24 - 8t), 24), ashr(word, 24) (t = 3), or sext(trunc(word >> 8t) to i8)
  static bool signed_byte(llvm::Value* v, Byte& b) {
    using namespace llvm::PatternMatch;
    v = scalar(v);
    if (!is_i32(v)) return false;
    const llvm::APInt* c;
    llvm::Value* x;
    if (match(v, m_AShr(m_Shl(m_Value(x), m_APInt(c)), m_SpecificInt(24)))) {
      if (c->getZExtValue() % 8 || c->getZExtValue() > 24) return false;
      b.word = x, b.t = int(3 - c->getZExtValue() / 8);
    } else if (match(v, m_AShr(m_Value(x), m_SpecificInt(24)))) {
      b.word = x, b.t = 3;
    } else if (match(v, m_SExt(m_Trunc(m_Value(x)))) && llvm::cast<llvm::CastInst>(v)->getSrcTy()->getScalarType()->isIntegerTy(8)) {
      shifted(x, b);
    } else {
      return false;
    }
    b.word = scalar(b.word);
    return is_i32(b.word);
  }
  // w as a vector of vt (a scalar word splat once per block)
  llvm::Value* vec(llvm::Value* w, llvm::FixedVectorType* vt) {
    if (w->getType() == vt) return w;
    auto [it, fresh] = splats_.try_emplace({w, vt}, nullptr);
    if (fresh) it->second = b_.CreateVectorSplat(vt->getNumElements(), w);
    return it->second;
  }

  llvm::IRBuilder<> b_;
  llvm::BasicBlock* block_;
  std::map<std::pair<llvm::Value*, llvm::Type*>, llvm::Value*> splats_;
};

// The version of what PairMulAdd emits: part of the compiler's id, which keys the disk cache of binaries (with the
// kernel's source), so a binary an older rewrite made is not read back under the same source. Bump it with every
// change to the rewrite. (Work-in-progress builds of the first version cached binaries under "-pairmadd1" whose
// TG_CPU=haswell q8_0 matvec ran 0.85x the float product, against 1.33-1.38x compiled afresh: bench/qmatvec.)
constexpr int kPairMulAddVersion = 3, kByteMulAddVersion = 5, kQuadMulAddVersion = 1;

class LLVMCompiler : public Compiler {
 public:
  // The id names everything that changes the binary (cached on disk under it): LLVM, pipeline, host, tg's own
  // rewrites after the pipeline.
  LLVMCompiler() : id_("llvm-" LLVM_VERSION_STRING "-O2-slp-noalias-" + host_id()) {}
  std::string id() const override {
    return id_ + (getenv_int("PAIR_MADD", 1) ? "-pairmadd" + std::to_string(kPairMulAddVersion) : "") +
           (getenv_int("BYTE_MADD", 1) ? "-bytemadd" + std::to_string(kByteMulAddVersion) + "-quadmadd" +
                                                std::to_string(kQuadMulAddVersion)
                                          : "");
  }

  std::vector<uint8_t> compile(const std::string& src, const std::string& name) override {
    const HostTarget& h = host();
    auto fail = [&](const std::string& what, const std::string& msg) -> void {
      throw Error("[llvm] " + what + " of kernel " + name + " failed:\n" + msg + "\n--- source ---\n" + src);
    };
    llvm::LLVMContext ctx;
    // Optimisation remarks and warnings (a Lane loop LLVM declined to vectorise) go to stderr only with DEBUG>=4:
    // the kernel is still correct, only slower. Errors still fail the compile.
    struct Quiet : llvm::DiagnosticHandler {
      bool handleDiagnostics(const llvm::DiagnosticInfo& di) override {
        if (di.getSeverity() == llvm::DS_Error) return false;
        if (debug_level() >= 4) {
          llvm::DiagnosticPrinterRawOStream dp(llvm::errs());
          di.print(dp);
          llvm::errs() << "\n";
        }
        return true;
      }
    };
    ctx.setDiagnosticHandler(std::make_unique<Quiet>());
    llvm::SMDiagnostic diag;
    std::unique_ptr<llvm::Module> m = llvm::parseIR(llvm::MemoryBufferRef(src, name), diag, ctx);
    if (!m) {
      std::string msg;
      llvm::raw_string_ostream os(msg);
      diag.print(name.c_str(), os, false);
      fail("parsing", msg);
    }
    std::string verr;
    llvm::raw_string_ostream vos(verr);
    if (llvm::verifyModule(*m, &vos)) fail("verification", verr);

    llvm::TargetOptions opts;  // IEEE semantics: no fast-math, no contraction of separate fmul/fadd
    std::unique_ptr<llvm::TargetMachine> tm(h.target->createTargetMachine(
        h.triple, h.cpu, h.features, opts, llvm::Reloc::PIC_, llvm::CodeModel::Small, llvm::CodeGenOptLevel::Default));
    if (!tm) fail("target setup", "no target machine for " + h.triple);
    m->setTargetTriple(h.triple);
    m->setDataLayout(tm->createDataLayout());
    for (llvm::Function& f : *m)
      if (!f.isDeclaration()) {
        f.addFnAttr("target-cpu", h.cpu);
        f.addFnAttr("target-features", h.features);
      }

    llvm::LoopAnalysisManager lam;
    llvm::FunctionAnalysisManager fam;
    llvm::CGSCCAnalysisManager cgam;
    llvm::ModuleAnalysisManager mam;
    // The SLP vectoriser packs the expander's upcast copies into vector instructions. The loop vectoriser stays
    // off: it runs first and vectorises an upcast loop across its iterations, turning each unit-stride copy into a
    // gather with stride amt (the 2^24-float add ran at 10 GB/s with it, 46 GB/s without; matmul N=1024 0.30x
    // OpenBLAS with it, 0.55x without: bench/bandwidth, bench/matmul).
    llvm::PipelineTuningOptions pto;
    pto.LoopVectorization = false;
    pto.SLPVectorization = true;
    llvm::PassBuilder pb(tm.get(), pto);
    pb.registerModuleAnalyses(mam);
    pb.registerCGSCCAnalyses(cgam);
    pb.registerFunctionAnalyses(fam);
    pb.registerLoopAnalyses(lam);
    pb.crossRegisterProxies(lam, fam, cgam, mam);
    pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O2).run(*m, mam);
    if (getenv_int("BYTE_MADD", 1))
      for (llvm::Function& f : *m)
        if (!f.isDeclaration()) QuadMulAdd::run(f);
    // byte products before pairs: q4_0's quads read their nibbles' even and odd bytes, which PairMulAdd would widen
    if (getenv_int("BYTE_MADD", 1))
      for (llvm::Function& f : *m)
        if (!f.isDeclaration()) ByteMulAdd::run(f);
    if (getenv_int("PAIR_MADD", 1))
      for (llvm::Function& f : *m)
        if (!f.isDeclaration()) PairMulAdd::run(f);
    if (debug_level() >= 5) llvm::errs() << "; optimised IR of " << name << "\n" << *m << "\n";

    llvm::SmallVector<char, 0> obj;
    llvm::raw_svector_ostream os(obj);
    llvm::legacy::PassManager pm;
    if (tm->addPassesToEmitFile(pm, os, nullptr, llvm::CodeGenFileType::ObjectFile))
      fail("code generation", "the target cannot emit object files");
    pm.run(*m);
    return std::vector<uint8_t>(obj.begin(), obj.end());
  }

 private:
  std::string id_;
};

// Host functions compiled kernels may call: libm (transcendentals, and what LLVM's library-call
// simplification turns loops or calls into), memory intrinsics, libgcc's float16 helpers. Registered as
// absolute addresses: searching the whole process would bind into PoCL's LLVM (see PLATFORM.md).
std::vector<std::pair<const char*, void*>> runtime_symbols() {
  using F1 = float (*)(float);
  using D1 = double (*)(double);
  using F2 = float (*)(float, float);
  using D2 = double (*)(double, double);
  auto p = [](auto fn) { return reinterpret_cast<void*>(fn); };
  return {
#define TG_F1(n) {#n "f", p(static_cast<F1>(::n##f))}, {#n, p(static_cast<D1>(::n))}
#define TG_F2(n) {#n "f", p(static_cast<F2>(::n##f))}, {#n, p(static_cast<D2>(::n))}
      TG_F1(sin), TG_F1(cos), TG_F1(tan), TG_F1(exp), TG_F1(exp2), TG_F1(expm1), TG_F1(log), TG_F1(log2),
      TG_F1(log10), TG_F1(log1p), TG_F1(sqrt), TG_F1(trunc), TG_F1(floor), TG_F1(ceil), TG_F1(round),
      TG_F1(rint), TG_F1(nearbyint), TG_F1(fabs), TG_F1(tanh), TG_F2(pow), TG_F2(fmod), TG_F2(fmin),
      TG_F2(fmax), TG_F2(atan2),
#undef TG_F1
#undef TG_F2
      {"fmaf", p(static_cast<float (*)(float, float, float)>(::fmaf))},
      {"fma", p(static_cast<double (*)(double, double, double)>(::fma))},
      {"ldexpf", p(static_cast<float (*)(float, int)>(::ldexpf))},
      {"ldexp", p(static_cast<double (*)(double, int)>(::ldexp))},
      {"sincosf", p(static_cast<void (*)(float, float*, float*)>(::sincosf))},
      {"sincos", p(static_cast<void (*)(double, double*, double*)>(::sincos))},
      {"memset", p(static_cast<void* (*)(void*, int, size_t)>(::memset))},
      {"memcpy", p(static_cast<void* (*)(void*, const void*, size_t)>(::memcpy))},
      {"memmove", p(static_cast<void* (*)(void*, const void*, size_t)>(::memmove))},
      {"__extendhfsf2", p(&__extendhfsf2)},
      {"__truncsfhf2", p(&__truncsfhf2)},
  };
}

// The process-wide JIT. Never destroyed: programs held by static objects may outlive any destruction order.
class Jit {
 public:
  static Jit& get() {
    static Jit* j = new Jit;
    return *j;
  }
  llvm::orc::LLJIT& jit() { return *jit_; }
  llvm::orc::JITDylib& runtime() { return *runtime_; }
  std::string next_dylib_name() { return "tg_program_" + std::to_string(counter_++); }

 private:
  Jit() {
    init_llvm();
    auto j = llvm::orc::LLJITBuilder()
                 .setLinkProcessSymbolsByDefault(false)
                 .setPlatformSetUp(llvm::orc::setUpInactivePlatform)  // no static initialisers in kernels
                 .create();
    if (!j) throw Error("[llvm] cannot create the ORC JIT: " + llvm_message(j.takeError()));
    jit_ = std::move(*j);
    runtime_ = &jit_->getExecutionSession().createBareJITDylib("tg_runtime");
    llvm::orc::SymbolMap syms;
    for (auto& [n, addr] : runtime_symbols())
      syms[jit_->mangleAndIntern(n)] = {llvm::orc::ExecutorAddr::fromPtr(addr),
                                        llvm::JITSymbolFlags::Exported | llvm::JITSymbolFlags::Callable};
    if (auto e = runtime_->define(llvm::orc::absoluteSymbols(std::move(syms))))
      throw Error("[llvm] cannot define the runtime symbols: " + llvm_message(std::move(e)));
  }
  std::unique_ptr<llvm::orc::LLJIT> jit_;
  llvm::orc::JITDylib* runtime_ = nullptr;
  std::atomic<uint64_t> counter_{0};
};

class OrcProgram : public Program {
 public:
  OrcProgram(llvm::orc::JITDylib* jd, KernelFn fn) : jd_(jd), fn_(fn) {}
  ~OrcProgram() override {
    // Releases the program's code and data memory.
    if (auto e = Jit::get().jit().getExecutionSession().removeJITDylib(*jd_)) llvm::consumeError(std::move(e));
  }
  void run(void* const* bufs, const int64_t* vars, const LaunchDims& dims) override { run_kernel(fn_, bufs, vars, dims); }

 private:
  llvm::orc::JITDylib* jd_;
  KernelFn fn_;
};

}  // namespace

std::unique_ptr<Compiler> make_llvm_compiler() { return std::make_unique<LLVMCompiler>(); }

// PERF_MAP=1: each loaded kernel's address range goes to /tmp/perf-PID.map, so `perf report` names JIT code.
void perf_map(const std::vector<uint8_t>& object, const std::string& name, uint64_t addr) {
  static std::mutex mu;
  uint64_t size = 0;
  auto obj = llvm::object::ObjectFile::createObjectFile(
      llvm::MemoryBufferRef(llvm::StringRef(reinterpret_cast<const char*>(object.data()), object.size()), name));
  if (!obj) {
    llvm::consumeError(obj.takeError());
    return;
  }
  for (const auto& [s, sz] : llvm::object::computeSymbolSizes(**obj)) {
    auto n = s.getName();
    if (n && *n == name) size = sz;
    else if (!n) llvm::consumeError(n.takeError());
  }
  std::lock_guard lk(mu);
  if (FILE* f = std::fopen(("/tmp/perf-" + std::to_string(getpid()) + ".map").c_str(), "a")) {
    std::fprintf(f, "%llx %llx %s\n", (unsigned long long)addr, (unsigned long long)std::max<uint64_t>(size, 1),
                 name.c_str());
    std::fclose(f);
  }
}

std::unique_ptr<Program> load_llvm_object(const std::vector<uint8_t>& object, const std::string& name) {
  Jit& J = Jit::get();
  auto& es = J.jit().getExecutionSession();
  llvm::orc::JITDylib& jd = es.createBareJITDylib(J.next_dylib_name());
  jd.addToLinkOrder(J.runtime());
  auto drop = [&](llvm::Error e, const std::string& what) -> std::unique_ptr<Program> {
    std::string msg = llvm_message(std::move(e));
    if (auto e2 = es.removeJITDylib(jd)) llvm::consumeError(std::move(e2));
    throw Error("[llvm] cannot load kernel " + name + ": " + what + ": " + msg);
  };
  auto buf = llvm::MemoryBuffer::getMemBufferCopy(
      llvm::StringRef(reinterpret_cast<const char*>(object.data()), object.size()), name);
  if (auto e = J.jit().addObjectFile(jd, std::move(buf))) return drop(std::move(e), "adding the object");
  auto sym = J.jit().lookup(jd, name);
  if (!sym) return drop(sym.takeError(), "linking");
  if (getenv_int("PERF_MAP", 0)) perf_map(object, name, sym->getValue());
  return std::make_unique<OrcProgram>(&jd, sym->toPtr<KernelFn>());
}

const std::string& host_id() {
  static const std::string id = [] {
    const HostTarget& h = host();
    char buf[24];
    std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)XXH3_64bits(h.features.data(), h.features.size()));
    return h.cpu + "-" + buf;
  }();
  return id;
}

}  // namespace tg::cpu
