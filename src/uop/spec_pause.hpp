#pragma once
// SPEC=1 checks each UOp as it is built. A stage that retypes a graph node by node (the index dtype lowering:
// index -> int32/int64) rebuilds a parent with retyped sources just before its own rule retypes it; those
// transient nodes are not part of any result. While a SpecPause lives (per thread) the per-node check is off;
// the stage checks its whole result with spec_check instead.
namespace tg {

class SpecPause {
 public:
  SpecPause();
  ~SpecPause();
  SpecPause(const SpecPause&) = delete;
  SpecPause& operator=(const SpecPause&) = delete;
  static bool active();

 private:
  bool prev_;
};

}  // namespace tg
