"""Fast implementations: one file per Triton kernel (kernel + host wrapper, validation first),
vectorized PyTorch backends, and the engines. Kernels are defined at import; the device (and
``TRITON_INTERPRET`` on CPU) is chosen before by :func:`inference_conformance.conformance.device.select_device`.
"""
