"""One module per technique, each declaring ``CONTRACT`` (a :class:`inference_conformance.conformance.registry.Contract`).

Adding a technique adds a module here; nothing else in the suite lists techniques.
"""
