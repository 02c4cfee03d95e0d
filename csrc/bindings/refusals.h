// The words of the device headers' host-side refusals: those headers return a code (GridFit, a
// mover of 0 warps) and hold no strings; the bindings throw these messages, naming what to change.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

#include "../common/mover.cuh"
#include "../common/phases.cuh"

namespace symmoe {

// Grid-wide phases on `grid` blocks of a GPU of `sms` SMs that phase_grid_fit says do not fit.
inline void refuse_phase_grid(const GridFit& f, int grid, int sms) {
  if (f.fits) return;
  if (f.per_sm < 0) throw std::invalid_argument("fan_phases=grid: the occupancy query failed");
  throw std::invalid_argument("fan_phases=grid: the dispatch kernel's " + std::to_string(grid) +
                              " blocks are not all resident at once (" + std::to_string(f.per_sm) + " per SM x " +
                              std::to_string(sms) + " SMs); lower kernel.num_sms or use fan_phases=block");
}

// A mover (fit_mover, row_mover) that fit not one slot beside `plan` bytes of tables.
inline MoveCfg refuse_unfit(const MoveCfg& m, int64_t plan) {
  if (m.warps < 1)
    throw std::invalid_argument("shared memory: plan tables of " + std::to_string(plan) +
                                " bytes leave no room for a bulk-copy slot (fewer experts per rank needed)");
  return m;
}

}  // namespace symmoe
