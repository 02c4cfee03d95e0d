// The launch shape symmoe/launch_shape.py decides (LaunchShape.kernel_args()), as a Context
// receives it: the bindings launch with these numbers and never size a grid from the config or
// the GPU themselves. A shape that launch_shape.py could not have made is refused here.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace symmoe {

struct LaunchGeometry {
  int sms;       // the GPU's SMs (the residency check of grid-wide phases counts them)
  int route;     // most blocks of a routing launch
  int dispatch;  // blocks of the data kernels (pull, push, unpack, republish)
  int combine;   // blocks of the combine's send kernel
  int reduce;    // SMs the combine's reduction spreads over
  int alone;     // blocks of the world-size-1 kernels (kernels/alone.cuh)
  int tail;      // most blocks of num_worst_tokens' tail kernel
};
constexpr int kGeometryArgs = 7;  // LaunchShape.KERNEL_FIELDS, in this order

// `v` as a LaunchGeometry for a GPU of `device_sms` SMs: every count in 1..sms, and sms the
// device's, or std::invalid_argument naming the field and its value.
inline LaunchGeometry launch_geometry(const std::vector<int64_t>& v, int device_sms) {
  static const char* const names[kGeometryArgs] = {"sms", "route", "dispatch", "combine", "reduce", "alone", "tail"};
  if (v.size() != size_t(kGeometryArgs))
    throw std::invalid_argument("launch shape: expected " + std::to_string(kGeometryArgs) +
                                " values (LaunchShape.kernel_args()), got " + std::to_string(v.size()));
  if (v[0] != device_sms)
    throw std::invalid_argument("launch shape: sms=" + std::to_string(v[0]) + ", but this GPU has " +
                                std::to_string(device_sms) + " SMs (a shape made for another device)");
  for (int i = 1; i < kGeometryArgs; ++i)
    if (v[size_t(i)] < 1 || v[size_t(i)] > v[0])
      throw std::invalid_argument("launch shape: " + std::string(names[i]) + "=" + std::to_string(v[size_t(i)]) +
                                  " blocks, outside 1.." + std::to_string(v[0]) +
                                  " (the GPU's SMs); symmoe/launch_shape.py decides it");
  return LaunchGeometry{int(v[0]), int(v[1]), int(v[2]), int(v[3]), int(v[4]), int(v[5]), int(v[6])};
}

}  // namespace symmoe
