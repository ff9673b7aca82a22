"""Array backend (NumPy or CuPy), pinned host I/O, CUDA graphs and the batched inference engine.

Modules: :mod:`agent.gpu.backend` (device selection), :mod:`agent.gpu.engine`
(:class:`~agent.gpu.engine.InferenceEngine`), :mod:`agent.gpu.pinned` (mapped host buffers),
:mod:`agent.gpu.errors`. Nothing here imports CuPy until a CUDA device is asked for.
"""
