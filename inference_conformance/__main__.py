"""``python -m inference_conformance``: the ``inference-conformance`` command (:mod:`inference_conformance.cli`)."""
import sys

from inference_conformance.cli import main

sys.exit(main())
