"""CUDA kernels (``*.cu``), their one loader and, per kernel, a wrapper ``x()`` with its NumPy
reference ``x_ref()``; tests/gpu checks each pair for parity."""
