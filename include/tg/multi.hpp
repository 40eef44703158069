#pragma once
// Multi-device tensors: one logical tensor split (sharded along an axis) or replicated across devices.
//
// In the graph a multi-device value is MULTI(part_0, ..., part_{n-1}, DEVICE("CPU,CPU:1")) with arg = the sharded
// axis (int64, -1 when every device holds the whole tensor): part i lives on device i and has the shard's shape.
// The logical graph above MULTI nodes is ordinary (shapes are the logical ones, autograd is unchanged); the
// scheduler's first stage (src/schedule/multi.cpp) rewrites it into per-device graphs joined by COPY and ALLREDUCE,
// and lowers each ALLREDUCE into copies and ALU ops (ring or naive). MSELECT(x, DEVICE) arg {i, axis, n} is part i
// of x sharded on `axis` (autograd's way back from a logical gradient to one MULTI part).
#include <string>
#include <vector>

#include "tg/uop.hpp"

namespace tg {

using Shape = std::vector<int64_t>;

/** The devices of a device name: "CPU,CPU:1" -> {"CPU", "CPU:1"}; a single device gives one entry. */
std::vector<std::string> split_devices(const std::string& device);
/** Whether a tensor's device names several devices (a multi-device tensor). */
inline bool is_multi_device(const std::string& device) { return device.find(',') != std::string::npos; }
/// the multi-device name of these devices: {"CPU", "CPU:1"} -> "CPU,CPU:1" (the inverse of split_devices)
std::string join_devices(const std::vector<std::string>& devices);

/** Shapes of MULTI and MSELECT (infer_shape calls this). */
Shape multi_shape(Ops op, const std::vector<const Shape*>& in, const Arg& arg);

/** How an ALLREDUCE is carried out: ALLREDUCE=ring|naive, else ring from 256k elements on more than two devices
 *  (as tinygrad's RING_ALLREDUCE_THRESHOLD). Both sum in one fixed order, so every device gets the same bits. */
enum class AllreduceAlgo { Naive, Ring };
/// the algorithm for an ALLREDUCE of numel elements over ndev devices (see AllreduceAlgo)
AllreduceAlgo allreduce_algo(int64_t numel, size_t ndev);

class Tensor;
namespace detail {  // hooks of the Tensor front end (src/tensor/multi.cpp)
UOpRef multi_realize_root(const Tensor& t);
bool multi_realized(const UOp* u);
UOpRef multi_assign_uop(Tensor& t, const Tensor& x);
Tensor multi_to(const Tensor& t, const std::string& dev);
}  // namespace detail

/** ALLREDUCE groups the multi stage has lowered (one per reduction across the sharded axis): for tests. */
size_t allreduces_lowered();

}  // namespace tg
