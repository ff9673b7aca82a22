"""The trading policy: Philox draws, Thompson action choice and exact Kelly sizing (NumPy; the
CPU path and the references of the CUDA kernels)."""
