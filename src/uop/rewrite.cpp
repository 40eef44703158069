// graph_rewrite: an iterative, memoised fixed-point rewrite of a UOp graph by a PatternMatcher.
#include <cstdio>
#include <unordered_map>
#include <unordered_set>

#include "tg/env.hpp"
#include "tg/error.hpp"
#include "tg/pattern.hpp"
#include "tg/viz.hpp"

namespace tg {

UOpRef PatternMatcher::rewrite(const UOp* n, void* ctx, const pat::RuleEntry** which) const {
  for (const pat::RuleEntry& e : by_op_[size_t(n->op)]) {
    if (UOpRef r = e.fn(n, ctx)) {
      if (which) *which = &e;
      return r;
    }
  }
  return {};
}

PatternMatcher PatternMatcher::operator+(const PatternMatcher& o) const {
  PatternMatcher r = *this;
  for (int i = 0; i < kNumOps; i++) r.by_op_[size_t(i)].insert(r.by_op_[size_t(i)].end(), o.by_op_[size_t(i)].begin(),
                                                               o.by_op_[size_t(i)].end());
  r.count_ += o.count_;
  return r;
}

namespace {

struct Rewriter {
  const PatternMatcher& pm;
  const RewriteOptions& opts;
  bool print;
  std::unordered_map<const UOp*, UOpRef> replace;
  std::vector<UOpRef> keep;  // nodes made during the rewrite stay alive until it ends

  UOpRef apply(const UOp* n) {
    const pat::RuleEntry* which = nullptr;
    UOpRef r = pm.rewrite(n, opts.ctx, &which);
    if (r && r.get() != n && (opts.trace || print)) {
      std::string where = std::string(which->file) + ":" + std::to_string(which->line);
      if (print)
        std::fprintf(stderr, "rewrite %s %s: %s -> %s\n", opts.name, where.c_str(), render_expr(n).c_str(),
                     render_expr(r.get()).c_str());
      if (opts.trace) opts.trace->push_back({where, UOpRef(n), r});
    }
    if (r.get() == n) return {};  // a rule that returns its input changes nothing
    return r;
  }

  // Rewrite n until no rule applies (bottom-up mode); detects cycles.
  UOpRef fixed_point(const UOp* n) {
    UOpRef cur(n);
    std::unordered_set<const UOp*> seen;
    while (true) {
      if (!seen.insert(cur.get()).second)
        throw Error(std::string("[graph_rewrite ") + opts.name + "] rules loop forever on " + render_expr(cur.get()));
      UOpRef nx = apply(cur.get());
      if (!nx) return cur;
      keep.push_back(cur);
      cur = std::move(nx);
    }
  }

  UOpRef run(const UOpRef& root) {
    struct Item {
      const UOp* n;
      int stage;
      UOpRef new_n;
    };
    std::vector<Item> stack{{root.get(), 0, root}};
    std::unordered_set<const UOp*> on_stack{root.get()};
    std::unordered_map<const UOp*, std::vector<Item>> waitlist;
    auto done = [&](const UOp* n, UOpRef v) {
      replace.emplace(n, std::move(v));
      if (auto it = waitlist.find(n); it != waitlist.end()) {
        for (auto& w : it->second) stack.push_back(std::move(w));
        waitlist.erase(it);
      }
    };
    while (!stack.empty()) {
      if (stack.size() > 5000000) throw Error(std::string("[graph_rewrite ") + opts.name + "] stack too big: rules loop");
      Item it = std::move(stack.back());
      stack.pop_back();
      if (replace.count(it.n)) continue;
      if (it.stage == 0) {
        UOpRef nn = opts.bottom_up ? fixed_point(it.n) : UOpRef(it.n);
        const UOp* nnp = nn.get();
        stack.push_back({it.n, 1, std::move(nn)});
        for (size_t i = nnp->nsrc(); i-- > 0;) {
          const UOp* s = nnp->src(i);
          if (!on_stack.insert(s).second) continue;
          stack.push_back({s, 0, UOpRef(s)});
        }
      } else if (it.stage == 1) {
        std::vector<UOpRef> srcs;
        srcs.reserve(it.new_n->nsrc());
        bool ready = true, changed = false;
        for (auto& s : it.new_n->src()) {
          auto f = replace.find(s.get());
          if (f == replace.end()) {
            waitlist[s.get()].push_back({it.n, 1, it.new_n});
            ready = false;
            break;
          }
          changed |= f->second.get() != s.get();
          srcs.push_back(f->second);
        }
        if (!ready) continue;
        UOpRef next;
        if (!changed) {
          if (opts.bottom_up || !(next = apply(it.new_n.get()))) {
            done(it.n, it.new_n);
            continue;
          }
        } else {
          next = it.new_n->replace_src(srcs);
        }
        keep.push_back(next);
        const UOp* np = next.get();
        stack.push_back({it.n, 2, next});
        stack.push_back({np, 0, next});
      } else {
        auto f = replace.find(it.new_n.get());
        if (f == replace.end()) {
          const UOp* key = it.new_n.get();
          waitlist[key].push_back(std::move(it));
        } else {
          done(it.n, f->second);
        }
      }
    }
    return replace.at(root.get());
  }
};

}  // namespace

void graph_visit(std::span<const UOp* const> nodes, const PatternMatcher& pm, void* ctx, const char* name) {
  for (const UOp* n : nodes)
    if (pm.rewrite(n, ctx))
      throw Error(std::string("[graph_visit ") + name + "] internal: a rule returned a node; a visit's rules only mark");
}

// VIZ: the same rewrite with a trace, handed to the recorder.
[[gnu::noinline]] static UOpRef recorded_rewrite(const UOpRef& root, const PatternMatcher& pm, const RewriteOptions& opts) {
  std::vector<RewriteStep> steps;
  RewriteOptions o = opts;
  o.trace = &steps;
  Rewriter rw{pm, o, debug_level() >= 6, {}, {}};
  UOpRef out = rw.run(root);
  if (opts.trace) opts.trace->insert(opts.trace->end(), steps.begin(), steps.end());
  viz::record_rewrite(*opts.name ? opts.name : "graph_rewrite", root, std::move(steps), out);
  return out;
}

UOpRef graph_rewrite(const UOpRef& root, const PatternMatcher& pm, const RewriteOptions& opts) {
  if (viz::enabled()) [[unlikely]] return recorded_rewrite(root, pm, opts);
  Rewriter rw{pm, opts, debug_level() >= 6, {}, {}};
  return rw.run(root);
}

}  // namespace tg
