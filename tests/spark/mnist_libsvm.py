"""A small stand-in for the LIBSVM ``mnist.bz2`` that Horovod's Spark MNIST examples read from ``--data-dir``.

The real file is 60,000 rows of ``label idx:value ...`` (1-based indices, 784 pixel features of 0-255, zero pixels
left out), bzip2-compressed. This one is scikit-learn's 8x8 digits in that format: each image scaled up 3x to 24x24,
padded to 28x28, its 0-16 levels stretched to 0-255. The examples only download when the file is missing, so with
this one in ``--data-dir`` they run offline.
"""

import bz2
import os

import numpy as np

SIDE = 28


def mnist_like(rows: int = 1797, seed: int = 0):
    """``(images, labels)``: ``rows`` digits (repeated, in a seeded order, past the 1,797 scikit-learn has) as
    ``rows x 784`` integers 0-255 and their labels."""
    from sklearn.datasets import load_digits
    digits = load_digits()
    order = np.random.default_rng(seed).permutation(np.resize(np.arange(len(digits.target)), rows))
    images = np.kron(digits.images[order], np.ones((3, 3)))              # 8x8 -> 24x24
    pad = (SIDE - images.shape[1]) // 2
    images = np.pad(images, ((0, 0), (pad, pad), (pad, pad)))            # -> 28x28
    pixels = np.rint(images.reshape(rows, SIDE * SIDE) * (255.0 / 16.0)).astype(np.int64)
    return pixels, digits.target[order]


def write_mnist_bz2(folder: str, rows: int = 1797, seed: int = 0) -> str:
    """Write ``folder/mnist.bz2`` (LIBSVM format, bzip2) with :func:`mnist_like`'s rows; returns its path."""
    pixels, labels = mnist_like(rows, seed)
    lines = []
    for row, label in zip(pixels, labels):
        nonzero = np.flatnonzero(row)
        lines.append(" ".join([str(int(label))] + [f"{i + 1}:{row[i]}" for i in nonzero]))
    path = os.path.join(folder, "mnist.bz2")
    with bz2.open(path, "wt", encoding="ascii") as handle:
        handle.write("\n".join(lines) + "\n")
    return path
