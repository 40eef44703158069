#pragma once
// tg::dist: data-parallel training across processes and hosts over MPI (Debian's OpenMPI). Every rank runs the same
// program on its share of each batch; the gradients are summed over the ranks by MPI_Allreduce on host buffers
// (one call for all of them), so every rank applies the same update and keeps the same weights.
//
// Built with MPI when meson finds it (libopenmpi-dev); otherwise, or when the program was not started by mpirun,
// there is one rank and every call here is a no-op. Run: `mpirun -np 2 build/examples/beautiful_mnist`
// (as root add --allow-run-as-root; more ranks than cores: --oversubscribe; several hosts: --hostfile FILE).
#include <string>
#include <vector>

#include "tg/nn/nn.hpp"
#include "tg/tensor.hpp"

namespace tg::dist {

/** Start MPI when this process was launched by mpirun (OMPI_COMM_WORLD_SIZE / PMI_SIZE set) and tg was built with
 *  MPI; later calls do nothing. Called by rank() and world_size() on first use; MPI is finalised at exit. */
void init();
/** This process's rank (0 without MPI) and the number of ranks (1 without MPI). */
int rank();
/// the number of ranks (1 without MPI)
int world_size();
/** Whether tg was built with MPI. */
bool available();

/// The reduction of allreduce_: the sum or the maximum over the ranks.
enum class Op { Sum, Max };
/** Reduce `t`'s values over all ranks (every rank gets the result) in place: realised, copied to the host,
 *  MPI_Allreduce, written back. With one rank: nothing. */
void allreduce_(Tensor& t, Op op = Op::Sum);
/** The mean over the ranks of each tensor's gradient (tensors that have one), in place, as one MPI_Allreduce of
 *  their values packed into one float32 host buffer. Returns the bytes reduced (0 with one rank). */
size_t allreduce_grads(const std::vector<Tensor>& params);
/** The sum of `t` over the ranks, every rank getting it, as a lazy, differentiable op (float32; other dtypes are
 *  cast): the value is copied to the DIST device, whose copy-in is an MPI_Allreduce, and back, so the collective
 *  runs in the schedule between the kernels that produce and use it (no host round trip of the graph, and a TinyJit
 *  replays it). Its gradient is the same sum of the ranks' gradients (torch's all_reduce in autograd). Every rank
 *  must build the same graph: the collectives run in schedule order. One rank: `t` itself. */
Tensor allreduce(const Tensor& t);
/** torch's SyncBatchNorm for MPI ranks: every BatchNorm under `m` (nn::Module::apply) normalises in training with
 *  the statistics of the global batch (the ranks' equal shares together: per-channel sums and sums of squared
 *  deviations reduced by allreduce above, and their gradients likewise), so every rank keeps the same running
 *  statistics and the training equals one process with the whole batch. One rank: nothing changes. */
void sync_batchnorm(nn::Module& m);
/** Seconds spent in MPI_Allreduce by DIST copies and allreduce_grads (this process, since start): a bench figure. */
double collective_seconds();
/** Rows [rank * n / world, (rank + 1) * n / world) of t's first axis: this rank's share of a batch (n must split). */
Tensor rank_share(const Tensor& t);
/** A 64-bit hash of the tensors' bytes, gathered from every rank: true when all ranks hold the same bits. */
bool replicas_equal(const std::vector<Tensor>& ts);
/** Wait for every rank. */
void barrier();

}  // namespace tg::dist
