"""A/B comparison runs (``symmoe ab SPEC.yaml``): one seeded workload through two or more
backend configs in one job, outputs checked bitwise identical, dispatch and combine timed.

``spec`` reads and validates spec files, ``runner`` is what every rank runs, ``report``
holds the statistics and the outputs, ``driver`` ties them together, ``cli`` is the
command. Specs live in ``configs/ab/``.
"""
