// The pybind11 binding of a Context and its module-level helpers. Each extension module
// instantiates it with its transport (it gives the constructor: it knows how to make that
// transport); the Python protocol (symmoe/protocol/cuda.py) calls the same methods whatever the backend.
#pragma once
#include <cuda_runtime.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <vector>

#include "ctx_combine.cuh"
#include "ctx_dispatch.cuh"
#include "ctx_dispatch_call.cuh"
#include "ctx_route.cuh"
#include "ctx_state.cuh"
#include "host_mapped.h"
#include "host_wait.h"
#include "launch_geometry.h"

namespace symmoe {

template <class Transport, class Init>
void bind_context(pybind11::module_& m, Init init) {
  namespace py = pybind11;
  using C = Ctx<Transport>;
  m.attr("LAYOUT_ARGS") = kLayoutArgs;
  m.attr("SUMMARY_HEAD") = kSummaryHead;
  m.attr("STAMP_WARPS") = kStampWarps;  // per block of a timeline; its marks: symmoe.bench.timeline.MARKS
  m.attr("STAGES") = py::dict(py::arg("dispatch.counts") = int(kStageDispatchCounts),
                              py::arg("dispatch.data") = int(kStageDispatchData),
                              py::arg("dispatch.done") = int(kStageDispatchDone),
                              py::arg("combine.data") = int(kStageCombineData),
                              py::arg("combine.done") = int(kStageCombineDone),
                              py::arg("barrier") = int(kStageMemoryBarrier),
                              py::arg("bulk copy") = int(kStageBulkCopy),
                              py::arg("dispatch.phase") = int(kStageFanPhase),
                              py::arg("dispatch.route") = int(kStageRouteChunk));
  m.attr("MOVE_MODES") = py::dict(py::arg("pull") = int(kMovePull), py::arg("push") = int(kMovePush),
                                  py::arg("push_stream") = int(kMovePushStream));
  m.attr("DEFERRED") = py::dict(py::arg("capacity") = int(kDeferredCapacity), py::arg("bad_ids") = int(kDeferredBadIds));
  bind_counts_wait(m);
  bind_host_mapped(m);
  m.def("check_launch_shape", [](const std::vector<int64_t>& shape, int device_sms) { launch_geometry(shape, device_sms); },
        py::arg("shape"), py::arg("device_sms"),
        "The check a Context makes of LaunchShape.kernel_args() on a GPU of device_sms SMs: ValueError naming the "
        "field when launch_shape.py could not have made the shape.");
  py::class_<C>(m, "Context")
      .def(py::init(init))
      .def_property_readonly("max_smem", [](const C& c) { return c.smem.max; })
      .def("layout_scratch_bytes", &layout_scratch_bytes<Transport>)
      .def("set_copy_bytes", &C::set_copy_bytes, py::arg("max_piece"))
      .def("set_copy_depth", &C::set_copy_depth, py::arg("depth"))
      .def("set_fan_phases", &C::set_fan_phases, py::arg("mode"))
      .def("set_input_check", &C::set_input_check, py::arg("flag"), py::arg("info"))
      .def("set_stamps", &C::set_stamps, py::arg("stamps"), py::arg("words") = 0)
      .def("layout", &ctx_layout<Transport>, py::arg("idx"), py::arg("idx64"), py::arg("w"), py::arg("tokens"),
           py::arg("scratch"), py::arg("in_rank"), py::arg("per_rank"), py::arg("per_expert"), py::arg("publish"),
           py::arg("epoch"), py::arg("stream"))
      .def("move", &ctx_move<Transport>, py::arg("x"), py::arg("out"), py::arg("expert_major"), py::arg("alignment"),
           py::arg("counts"), py::arg("after_route"), py::arg("mode"), py::arg("senders"), py::arg("receivers"),
           py::arg("epoch"), py::arg("stream"), py::arg("row_bytes") = 0)
      .def("dispatch", &ctx_dispatch<Transport>, py::arg("host"), py::arg("counts"), py::arg("routing"),
           py::arg("ready"), py::arg("summary"), py::arg("idx"), py::arg("idx64"), py::arg("w"), py::arg("tokens"),
           py::arg("scratch"), py::arg("in_rank"), py::arg("route_epoch"), py::arg("x"), py::arg("out"),
           py::arg("expert_major"), py::arg("alignment"), py::arg("mode"), py::arg("senders"), py::arg("receivers"),
           py::arg("data_epoch"), py::arg("stream"), py::arg("row_bytes") = 0)
      .def("recv_tail", &ctx_recv_tail<Transport>, py::arg("counts"), py::arg("out"), py::arg("worst"),
           py::arg("expert_major"), py::arg("alignment"), py::arg("per_expert"), py::arg("deferred"), py::arg("epoch"),
           py::arg("stream"), py::arg("row_bytes") = 0)
      .def("combine", &ctx_combine<Transport>, py::arg("elem_size"), py::arg("is_bf16"), py::arg("y"), py::arg("rw"),
           py::arg("src_rank"), py::arg("src_token"), py::arg("src_slot"), py::arg("rows"), py::arg("in_rank"),
           py::arg("topk_idx"), py::arg("topk_w"), py::arg("tokens"), py::arg("selfmap"), py::arg("out"),
           py::arg("out_w"), py::arg("expert_major"), py::arg("epoch"), py::arg("stream"))
      .def("republish", &ctx_republish<Transport>, py::arg("routing"), py::arg("nbytes"), py::arg("counts"),
           py::arg("epoch"), py::arg("stream"))
      .def("barrier", &ctx_barrier<Transport>, py::arg("flags_offset"), py::arg("epoch"), py::arg("stage"),
           py::arg("stream"));
}

}  // namespace symmoe
