"""Run inside a fresh venv holding only the tfsparse wheel (test_wheel.py).

Trains a SparseDense model a step on the compiled kernels, exports a
SavedModel, and checks that a second fresh process serves it identically.
"""

import json
import os
import pathlib
import subprocess
import sys

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
os.environ["TFSPARSE_REQUIRE_KERNELS"] = "1"

import numpy as np  # noqa: E402

import tfsparse  # noqa: E402
from tfsparse import keras  # noqa: E402
from tfsparse.ops import kernels  # noqa: E402

out = pathlib.Path(sys.argv[1])
rng = np.random.default_rng(0)
x = rng.standard_normal((64, 30)).astype("float32")
y = rng.integers(0, 4, 64)
model = keras.Sequential([keras.Input((30,)), tfsparse.SparseDense(16, density=0.2, activation="relu", seed=1),
                          keras.layers.Dense(4)])
model.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
before = [w.numpy() for w in model.trainable_weights]
model.fit(x, y, batch_size=64, epochs=1, verbose=0)
changed = [not np.array_equal(a, w.numpy()) for a, w in zip(before, model.trainable_weights)]
model.save(str(out / "saved_model"))
np.save(out / "inputs.npy", x)
np.save(out / "expected.npy", model.predict(x, verbose=0))
serve = ("import numpy as np, tensorflow as tf, sys; d = sys.argv[1]; m = tf.saved_model.load(d + '/saved_model'); "
         "f = m.signatures['serving_default']; r = list(f(tf.constant(np.load(d + '/inputs.npy'))).values())[0]; "
         "print(float(np.abs(r.numpy() - np.load(d + '/expected.npy')).max()))")
served = subprocess.run([sys.executable, "-c", serve, str(out)], capture_output=True, text=True, check=True)
print(json.dumps({
    "tfsparse_file": tfsparse.__file__,
    "isa": kernels.isa(),
    "supported": list(kernels.supported_isas()),
    "weights_changed": changed,
    "served_max_difference": float(served.stdout.strip().splitlines()[-1]),
    "largest_output": float(np.abs(np.load(out / "expected.npy")).max()),
}))
