"""Real data shipped with tfsparse, and loaders for the full data sets (no downloads).

``load_mnist_sample`` returns 5,000 real MNIST digits kept in the repository
(CC BY-SA 3.0, see ``MNIST-LICENSE.md``); ``load_mnist`` reads the full set
from the standard IDX files or Keras' ``mnist.npz``.

Example:
  >>> from tfsparse.data import load_mnist_sample
  >>> (x_train, y_train), (x_test, y_test) = load_mnist_sample()
  >>> len(x_train) + len(x_test), sorted(set(y_test.tolist()))
  (5000, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
"""

from tfsparse.data.mnist import load_mnist
from tfsparse.data.mnist import load_mnist_sample

__all__ = [
    "load_mnist",
    "load_mnist_sample",
]
