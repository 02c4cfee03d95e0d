"""Benchmarking symmoe: nothing here is needed to dispatch or combine.

* ``gpu``: the GPU benchmark (``symmoe bench``, ``python -m symmoe.bench``): dispatch and
  combine against the copy roofline and plain torch measured in the same run;
* ``baselines``: the multi-GPU ceilings and plain-torch baselines (``python -m
  symmoe.bench.baselines``): P2P copy bandwidth, NCCL all-to-all, ``all_to_all_single``;
* ``targets``: the goal table of a multi-GPU run from those JSONs (``python -m symmoe.bench.targets``);
* ``compare``: bench JSONs side by side (``python -m symmoe.bench.compare BASE.json OTHER.json``);
* ``timeline``: the stamped kernels' per-warp marks turned into phases (``scripts/timeline_probe.py``);
* ``timing``: the timers (CUDA events behind a sleep, host clock) that ``symmoe ab`` uses too;
* ``ops``: the ops a benchmark times and how tables name them.
"""
