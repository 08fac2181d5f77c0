"""QT-11's laws reject every known-bad FP8 cast (``properties/fp8_cast/zoo.py``) by their own exact
comparison with the float64 reference: double rounding through float16 or bfloat16, subnormals
flushed to zero, truncation, ties away from zero and E5M2's grid for E4M3fn by the grid law in
float32; double rounding through float32 by the grid law in float64; a cast that never saturates
or always saturates by the range law."""
from __future__ import annotations

import pytest

from inference_conformance.properties.fp8_cast.cases import QT11_GRID, QT11_RANGE

pytestmark = pytest.mark.usefixtures("one_torch_thread")

test_qt11_cast_grid_zoo_rejected, test_qt11_cast_grid_zoo_rejected_float64 = QT11_GRID.make_zoo_tests(
    "test_qt11_cast_grid_zoo_rejected", "test_qt11_cast_grid_zoo_rejected_float64")
(test_qt11_cast_range_zoo_rejected,) = QT11_RANGE.make_zoo_tests("test_qt11_cast_range_zoo_rejected")
