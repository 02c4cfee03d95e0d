"""What checks a Buffer against ``symmoe.reference``: the per-rank checks of ``symmoe check``
and of the test suites (``checks``), the fault scenarios of the fault tests (``faults``), and
the bitwise comparison both they and ``symmoe ab`` rely on (``compare``).

The checks' public names are importable from here (``from symmoe.testing import
check_dispatch_combine``).
"""
from __future__ import annotations

from .checks import (CHECK_ROUTINGS, assert_bitwise, check_cached_dispatch, check_counts_summary,
                     check_dispatch_combine, check_fp8_dispatch, check_num_worst_tokens, first_difference)

__all__ = ["CHECK_ROUTINGS", "assert_bitwise", "check_cached_dispatch", "check_counts_summary", "check_dispatch_combine",
           "check_fp8_dispatch", "check_num_worst_tokens", "first_difference"]
