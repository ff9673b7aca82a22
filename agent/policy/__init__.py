"""The trading policy: the observation row the model sees, Philox draws, Thompson action choice,
exact Kelly sizing and the volatility regime with its learned floor (NumPy; the CPU path and the
references of the CUDA kernels)."""
