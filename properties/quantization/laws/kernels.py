"""QT-9's law on both launches of the Triton weight-only kernels (claim QT-9): decode (M <= 16,
split-K) and tiled, on pinned cases of each (the zoo test of the decode launch is in
``test_quant_kernels.py``; the W8A8 product's laws in ``w8a8.py``)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from inference_conformance.conformance.laws import Kills
from inference_conformance.properties.quantization.cases import QCase, pinned
from inference_conformance.properties.quantization.laws.integer import QT9

TECH = "quantization"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ------------------------------------------------------------ weight-only: decode and tiled launches
#: Pinned QT-9 cases on both launches: (case, seed).
DECODE_EXAMPLES = (
    (QCase(5, 192, 4, 32, ("normal", "outlier", "zero"), M=1), 1),     # decode, one token, 3 K splits
    (QCase(7, 192, 4, 64, ("normal", "pos"), M=16), 2),                # decode, all 16 rows
    (QCase(67, 128, 8, "channel", ("normal",), M=5), 3),               # decode, two column blocks
    (QCase(5, 160, 3, 32, ("neg", "normal"), M=17), 4),                # tiled from M = 17
)


#: QT-9's law (``integer.py``: ``QT9``) on DECODE_EXAMPLES only (its zoo test, over the kill
#: below, is ``test_quant_kernels.py``'s).
QT9_BOTH_LAUNCHES = dataclasses.replace(
    QT9.with_examples(pinned(DECODE_EXAMPLES)), dtypes=(torch.float32, torch.bfloat16),
    kills=(Kills(("decode_rows_read_first_token",), (torch.float32,)),),
    test="test_qt9_decode_and_tiled_launches", zoo_tests=())
#: M = 1 and M = 17 only: the cases a decode-launch bug in rows 2..16 passes.
QT9_ONE_ROW_AND_TILED = QT9.with_examples(pinned((DECODE_EXAMPLES[0], DECODE_EXAMPLES[3])))
