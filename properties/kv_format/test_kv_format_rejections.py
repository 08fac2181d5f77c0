"""QT-12's laws reject every known-bad KV-cache format (``properties/kv_format/zoo.py``) by their own
comparison: a scale shared by a token's heads, KIVI keys per token, KIVI's residual window dropped,
int4 nibbles read in the other order, FP8 with no scale and KIVI's group scales read per token by
the value law (float64); the shared scale and the swapped nibbles by the attention law too; codes
held in float32 by the bytes law."""
from __future__ import annotations

import pytest

from inference_conformance.properties.kv_format.cases import QT12_ATTENTION, QT12_BYTES, QT12_VALUES

pytestmark = pytest.mark.usefixtures("one_torch_thread")

(test_qt12_value_zoo_rejected,) = QT12_VALUES.make_zoo_tests("test_qt12_value_zoo_rejected")
(test_qt12_attention_zoo_rejected,) = QT12_ATTENTION.make_zoo_tests("test_qt12_attention_zoo_rejected")
(test_qt12_bytes_zoo_rejected,) = QT12_BYTES.make_zoo_tests("test_qt12_bytes_zoo_rejected")
