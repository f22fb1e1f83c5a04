"""The contract every tfsparse layer test runs: one helper, called per layer."""

import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import tensorflow as tf

from tfsparse._keras import keras

_SERVE_WITHOUT_TFSPARSE = textwrap.dedent(
    """
    import sys
    sys.modules["tfsparse"] = None  # importing tfsparse now fails
    import numpy as np, tensorflow as tf
    loaded = tf.saved_model.load(sys.argv[1])
    serve = loaded.signatures["serving_default"]
    (name,) = serve.structured_input_signature[1]
    x = np.load(sys.argv[2])
    (out,) = serve(**{name: tf.constant(x)}).values()
    np.save(sys.argv[3], out.numpy())
    """
)


def serve_in_fresh_process(saved_model_dir, x, tmp_path):
    """Serves a SavedModel in a new Python process where tfsparse can't import."""
    tmp_path = pathlib.Path(tmp_path)
    np.save(tmp_path / "x.npy", x)
    script = tmp_path / "serve.py"
    script.write_text(_SERVE_WITHOUT_TFSPARSE)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH="")
    subprocess.run(
        [sys.executable, str(script), str(saved_model_dir), str(tmp_path / "x.npy"),
         str(tmp_path / "y.npy")],
        check=True, env=env, cwd=str(tmp_path), timeout=300,
    )
    return np.load(tmp_path / "y.npy")


def check_layer_contract(make_layer, input_dim, tmp_path, batch=6, terms=None):
    """Build, call, config round trip, saving, SavedModel and a training step.

    Round trips are checked by behaviour (outputs), not by comparing configs.
    ``input_dim`` is an int, or the shape of one example (a tuple). ``terms``
    is the length of the layer's longest sum (default ``input_dim``).
    """
    rng = np.random.default_rng(0)
    example_shape = tuple(int(d) for d in np.atleast_1d(input_dim))
    x = rng.standard_normal((batch, *example_shape)).astype(np.float32)

    def model_of(layer):
        inputs = keras.Input(example_shape)
        return keras.Model(inputs, keras.layers.Dense(3)(layer(inputs)))

    layer = make_layer()
    model = model_of(layer)
    expected = model.predict(x, verbose=0)
    assert expected.shape[0] == batch and expected.shape[-1] == 3

    # get_config / from_config + weights rebuild an equal layer.
    clone = layer.__class__.from_config(layer.get_config())
    clone_model = model_of(clone)
    clone_model.set_weights(model.get_weights())
    np.testing.assert_array_equal(clone_model.predict(x, verbose=0), expected)

    # Keras format.
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), expected)

    # SavedModel: tf.saved_model.load here and, in a fresh process, without
    # tfsparse. It computes with TensorFlow's own ops where the model may run
    # tfsparse's compiled kernels: the same sums in another order, so each
    # output may differ by float32 rounding of its two chained sums (at most
    # input_dim + hidden terms): n * eps times the sums of the terms'
    # magnitudes, which the model with |weights| computes on |x| (its layers
    # are linear maps and monotone activations).
    saved = tmp_path / "saved_model"
    tf.saved_model.save(model, str(saved))
    restored = tf.saved_model.load(str(saved))
    magnitudes = model_of(layer.__class__.from_config(layer.get_config()))
    magnitudes.set_weights([np.abs(w) if w.dtype.kind == "f" else w for w in model.get_weights()])
    terms = (input_dim if terms is None else terms) + int(
        layer.compute_output_shape((None, *example_shape))[-1]) + 2
    bound = terms * np.finfo(np.float32).eps * magnitudes.predict(np.abs(x), verbose=0)
    for served in (restored(tf.constant(x)).numpy(), serve_in_fresh_process(saved, x, tmp_path)):
        assert np.all(np.abs(served - expected) <= bound)

    # A training step moves the layer's weights and lowers the loss.
    model.compile(keras.optimizers.SGD(0.05), "mse")
    target = rng.standard_normal(expected.shape).astype(np.float32)
    before = [w.copy() for w in layer.get_weights()]
    losses = model.fit(x, target, epochs=5, batch_size=batch, verbose=0).history["loss"]
    assert losses[-1] < losses[0]
    changed = [not np.array_equal(a, b) for a, b in zip(before, layer.get_weights())]
    trainable = [w.trainable for w in layer.weights]
    assert changed == trainable
    return model
