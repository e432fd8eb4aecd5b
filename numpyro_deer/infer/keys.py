r"""The chains' keys, split on the host.

NumPyro's ``MCMC.run`` splits its key into one key per chain with
``jax.random.split`` before it traces anything: an eager program, compiled
at the start of a process's first run with several chains, on the critical
path (0.15-0.2 s on an H100, 0.1 s on a 2-core CPU). :func:`chain_keys`
computes the same keys with NumPy where the key is a raw Threefry key split
the way JAX splits it by default (``jax_threefry_partitionable``): the
Threefry-2x32 hash of 20 rounds (Salmon, Moraes, Dror and Shaw, 2011,
"Parallel random numbers: as easy as 1, 2, 3") of the 64-bit counts
``0 .. n - 1``, high words in the first lane,

.. math::

    \text{key}_i = \text{threefry}_{2 \times 32}(k, (0, i)),
    \qquad i = 0, \dots, n - 1 .

Any other key (typed, of another PRNG implementation, traced, or split the
other way) is split by JAX.
"""

from __future__ import annotations

import jax
import numpy as np

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)


def threefry2x32(key: np.ndarray, x1: np.ndarray, x2: np.ndarray) -> list:
    """Threefry-2x32 of the word pairs ``(x1, x2)`` (``uint32`` arrays) under
    ``key`` (two ``uint32``): JAX's ``threefry_2x32`` unrolled, in NumPy
    (``uint32`` arithmetic wraps around, as the hash needs)."""
    k1, k2 = (np.asarray(k, np.uint32).reshape(1) for k in key)
    ks = (k1, k2, k1 ^ k2 ^ _PARITY)
    x = [x1 + ks[0], x2 + ks[1]]
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x[0] = x[0] + x[1]
            x[1] = (x[1] << np.uint32(r)) | (x[1] >> np.uint32(32 - r))
            x[1] = x[0] ^ x[1]
        x[0] = x[0] + ks[(i + 1) % 3]
        x[1] = x[1] + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x


def host_split(key, num: int) -> np.ndarray | None:
    """``jax.random.split(key, num)`` computed with NumPy, or ``None`` where
    ``key`` is not a raw Threefry key that JAX splits by its default rule."""
    if (
        isinstance(key, jax.core.Tracer)
        or not isinstance(key, np.ndarray | jax.Array)
        or key.dtype != np.uint32
        or key.shape != (2,)
        or getattr(jax.config, "jax_default_prng_impl", None) != "threefry2x32"
        or not getattr(jax.config, "jax_threefry_partitionable", False)
        or not 0 < num < 2**32
    ):
        return None
    high = np.zeros(num, np.uint32)
    low = np.arange(num, dtype=np.uint32)
    bits = threefry2x32(np.asarray(key), high, low)
    return np.stack(bits, axis=-1)


def chain_keys(key, num_chains: int):
    """One key per chain, as ``numpyro.infer.MCMC.run`` splits ``key``
    (``jax.random.split``), on the host where :func:`host_split` can; ``key``
    as it is where it already holds one key per chain, or for one chain."""
    if num_chains < 2 or np.ndim(key) != 1:
        return key
    keys = host_split(key, num_chains)
    return jax.random.split(key, num_chains) if keys is None else keys
