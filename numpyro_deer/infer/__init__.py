"""The NumPyro layer: the kernel, its state and block buffer, warmup, the block
driver, model checks and the memory checks. Imports run one way: the core
(:mod:`numpyro_deer.core`) <- the kernel <- the driver. The public names are
exported by :mod:`numpyro_deer`."""
