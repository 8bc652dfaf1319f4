"""The healthy runs of the scenario suite: ordinary ``fit`` calls of different shapes (a warm-up
into a cosine decay, mixed precision, a GAN, a fine-tune unfrozen midway, ...), each of which
must raise no warning or critical alert. Their outcomes are read as the failures' are
(:mod:`harness.outcomes`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.outcomes import Outcome, outcome
from harness.processes import ServerProcess


def _digits_flat() -> tuple[Any, Any]:
    from trainvitals.demo.scenarios import digits

    (x, y), _ = digits()
    return x.reshape(len(x), -1), y


@dataclass(frozen=True)
class Trial:
    """One healthy run to train: where it streams, its run name, its seed (the weights'
    initialisation, the batches' order and, where a shape draws them, its data) and a
    scratch folder."""

    server: ServerProcess
    name: str
    seed: int
    tmp: Path


def _fit(
    trial: Trial,
    model: Any,
    x: Any,
    y: Any,
    callbacks_before: list[Any] | None = None,
    **fit: Any,
) -> None:
    import trainvitals

    vitals = trainvitals.VitalsCallback(
        server=trial.server.url, project="healthy", run_name=trial.name
    )
    model.fit(x, y, callbacks=[*(callbacks_before or []), vitals], verbose=0, **fit)


def warmup_cosine_mlp(trial: Trial) -> None:
    """An MLP, SGD with Nesterov momentum, a linear warm-up into a cosine decay."""
    import keras

    x, y = _digits_flat()
    schedule = keras.optimizers.schedules.CosineDecay(
        1e-3, decay_steps=1600, warmup_target=0.05, warmup_steps=300
    )
    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])  # fmt: skip
    model.compile(
        keras.optimizers.SGD(schedule, momentum=0.9, nesterov=True),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    _fit(trial, model, x, y, batch_size=32, epochs=40)


def tiny_noisy_batches(trial: Trial) -> None:
    """Batches of four with heavy dropout under RMSprop: a loss that jumps every step."""
    import keras

    x, y = _digits_flat()
    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dropout(0.5),
        keras.layers.Dense(10, activation="softmax"),
    ])  # fmt: skip
    model.compile(keras.optimizers.RMSprop(5e-4), "sparse_categorical_crossentropy")
    _fit(trial, model, x, y, batch_size=4, epochs=6)


def batchnorm_cnn(trial: Trial) -> None:
    """A CNN with batch normalisation, AdamW and an exponential decay, four steps per
    execution."""
    import keras

    from trainvitals.demo.scenarios import digits

    (x, y), _ = digits()
    schedule = keras.optimizers.schedules.ExponentialDecay(3e-3, 400, 0.7)
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same", use_bias=False),
        keras.layers.BatchNormalization(),
        keras.layers.ReLU(),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10, activation="softmax"),
    ])  # fmt: skip
    model.compile(
        keras.optimizers.AdamW(schedule, weight_decay=1e-4),
        "sparse_categorical_crossentropy",
        steps_per_execution=4,
    )
    _fit(trial, model, x, y, batch_size=32, epochs=40)


def gru_regression(trial: Trial) -> None:
    """A GRU reading the image's rows, regressing the digit's value (MSE) with Adam and a
    stepwise decay."""
    import keras

    from trainvitals.demo.scenarios import digits

    (x, y), _ = digits()
    schedule = keras.optimizers.schedules.PiecewiseConstantDecay([600, 1200], [3e-3, 1e-3, 3e-4])
    model = keras.Sequential([
        keras.Input((8, 8)),
        keras.layers.GRU(32),
        keras.layers.Dense(1),
    ])  # fmt: skip
    model.compile(keras.optimizers.Adam(schedule), "mse")
    _fit(trial, model, x[..., 0], y.astype("float32"), batch_size=32, epochs=40)


def mixed_float16(trial: Trial) -> None:
    """An MLP under the ``mixed_float16`` policy whose ``LossScaleOptimizer`` starts at a scale
    of 2^30: its first steps overflow and are skipped while the scale comes down, and it
    overflows again now and then as the scale grows back. Skips are normal, not NaNs."""
    import keras

    x, y = _digits_flat()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = keras.Sequential([
            keras.Input((64,)),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
            keras.layers.Activation("linear", dtype="float32"),  # logits in float32
        ])  # fmt: skip
        optimizer = keras.optimizers.LossScaleOptimizer(
            keras.optimizers.Adam(1e-3), initial_scale=2.0**30
        )
        model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        _fit(trial, model, x, y, batch_size=32, epochs=15)
    finally:
        keras.mixed_precision.set_global_policy("float32")


def _classifier(optimizer: Any) -> Any:
    """A one-hidden-layer MLP classifying the flattened digits, compiled with ``optimizer``."""
    import keras

    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])  # fmt: skip
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def reduce_on_plateau(trial: Trial) -> None:
    """An MLP, SGD with momentum at a high rate that ``ReduceLROnPlateau`` cuts by 0.3 each
    time the validation loss stalls for two epochs."""
    import keras

    from trainvitals.demo.scenarios import digits

    (x, y), (vx, vy) = digits()
    model = _classifier(keras.optimizers.SGD(0.05, momentum=0.9))
    cut = keras.callbacks.ReduceLROnPlateau("val_loss", factor=0.3, patience=2, min_lr=1e-5)
    flat, vflat = x.reshape(len(x), -1), vx.reshape(len(vx), -1)
    _fit(trial, model, flat, y, batch_size=32, epochs=40, validation_data=(vflat, vy),
         callbacks_before=[cut])  # fmt: skip


def imbalanced_noisy_labels(trial: Trial) -> None:
    """Two classes make most of the data and a fifth of the labels are wrong: a loss that
    stays high and noisy."""
    import keras

    x, y = _digits_flat()
    rng = np.random.default_rng(trial.seed)
    keep = (y < 2) | (rng.random(len(y)) < 0.1)
    x, y = x[keep], y[keep].copy()
    wrong = rng.random(len(y)) < 0.2
    y[wrong] = rng.integers(0, 10, int(wrong.sum()))
    model = _classifier(keras.optimizers.Adam(1e-3))
    _fit(trial, model, x, y, batch_size=32, epochs=40)


def transformer_warmup_adamw(trial: Trial) -> None:
    """A one-block Transformer encoder reading the image's rows as eight tokens, AdamW with
    a linear warm-up from 0 into a cosine decay."""
    import keras

    from trainvitals.demo.scenarios import digits

    (x, y), _ = digits()
    tokens = keras.Input((8, 8))
    h = keras.layers.Dense(32)(tokens)
    h = keras.layers.LayerNormalization()(h + keras.layers.MultiHeadAttention(4, 8)(h, h))
    feed = keras.layers.Dense(32)(keras.layers.Dense(64, activation="gelu")(h))
    h = keras.layers.LayerNormalization()(h + feed)
    logits = keras.layers.Dense(10)(keras.layers.GlobalAveragePooling1D()(h))
    schedule = keras.optimizers.schedules.CosineDecay(
        0.0, decay_steps=2000, warmup_target=1e-3, warmup_steps=300
    )
    model = keras.Model(tokens, logits)
    model.compile(
        keras.optimizers.AdamW(schedule, weight_decay=1e-2),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    _fit(trial, model, x[..., 0], y, batch_size=32, epochs=40)


#: ``finetune-unfrozen``: the step its backbone is unfrozen, and its last step.
UNFREEZE = 300
FINETUNE_STEPS = 700


def finetune_unfrozen(trial: Trial) -> None:
    """Fine-tuning as the Keras guide does it, in a custom loop (``Monitor``): a backbone of
    eight batch-normalised convolutions pre-trained on the digits 0-4; a new head for the
    digits 5-9 trained alone on its frozen features (their batch normalisation stays in
    inference mode throughout); from step ``UNFREEZE`` the whole network at a tenth of the
    rate. The head alone reaches a plateau; unfrozen, the loss falls again, and the gradient
    norm, now over the backbone's variables too, is at once ten times what it was and more,
    and each step does more work."""
    import keras
    import tensorflow as tf

    import trainvitals
    from trainvitals.demo.scenarios import digits

    (x, y), _ = digits()
    layers: list[Any] = [keras.Input((8, 8, 1))]
    for i in range(8):
        layers += [
            keras.layers.Conv2D(16, 3, padding="same", use_bias=False, name=f"conv_{i}"),
            keras.layers.BatchNormalization(name=f"norm_{i}"),
            keras.layers.ReLU(),
        ]
    backbone = keras.Sequential([*layers, keras.layers.GlobalAveragePooling2D()], name="backbone")
    lossfn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    pretrain = keras.Sequential([backbone, keras.layers.Dense(5)])
    pretrain.compile(keras.optimizers.Adam(1e-3), lossfn)
    pretrain.fit(x[y < 5], y[y < 5], batch_size=32, epochs=10, verbose=0)  # the first task
    x, y = x[y >= 5], y[y >= 5] - 5  # the new task
    images = keras.Input((8, 8, 1))
    logits = keras.layers.Dense(5, name="head")(backbone(images, training=False))
    model = keras.Model(images, logits)

    def compiled(optimizer: Any) -> Any:
        """One training step over the variables trainable now, compiled (as Keras does
        again after a recompile): it returns the loss and the gradients."""

        def train_step(xb: Any, yb: Any) -> Any:
            variables = model.trainable_variables
            with tf.GradientTape() as tape:
                loss = lossfn(yb, model(xb, training=True))
            grads = tape.gradient(loss, variables)
            optimizer.apply_gradients(zip(grads, variables, strict=True))
            return loss, grads

        return tf.function(train_step)

    rng = np.random.default_rng(trial.seed)
    # The unfrozen step is traced before training starts: its trace takes about a second here,
    # but once took over 30 s on a CI machine loaded with other tests, and 30 s without a step
    # is a stall by the agent's rule. What the scenario shows is the step's work and norms
    # after the unfreeze, not how long a trace takes on a starved machine.
    batch = (tf.TensorSpec((32, *x.shape[1:]), tf.float32), tf.TensorSpec((32,), tf.int32))
    unfrozen_step = compiled(keras.optimizers.Adam(1e-4))
    unfrozen_step.get_concrete_function(*batch)
    backbone.trainable = False
    train_step = compiled(keras.optimizers.Adam(1e-3))
    with trainvitals.Monitor(
        server=trial.server.url,
        project="healthy",
        run_name=trial.name,
        model=model,
        system_metrics=False,
    ) as mon:
        for step in range(1, FINETUNE_STEPS + 1):
            if step == UNFREEZE:
                backbone.trainable = True
                train_step = unfrozen_step
            pick = rng.integers(0, len(x), 32)
            xb = tf.constant(x[pick])
            loss, grads = train_step(xb, tf.constant(y[pick]))
            mon.log(step, loss=loss, grads=grads, inputs=xb)


def gan(trial: Trial) -> None:
    """A small GAN on the digits in a custom loop (``Monitor``): the discriminator's gradients
    judged, both losses recorded as metrics, since neither player's loss is meant to fall (the
    discriminator's climbs back as the generator learns; as ``loss`` it would read as
    divergence)."""
    import keras
    import tensorflow as tf

    import trainvitals
    from trainvitals.demo.scenarios import digits

    (x, _), _ = digits()
    real = (x.reshape(len(x), -1) / 8.0 - 1.0).astype("float32")
    gen = keras.Sequential([
        keras.Input((16,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(64, activation="tanh"),
    ])  # fmt: skip
    disc = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(64),
        keras.layers.LeakyReLU(0.2),
        keras.layers.Dense(1),
    ])  # fmt: skip
    g_opt, d_opt = (keras.optimizers.Adam(2e-4, beta_1=0.5) for _ in range(2))
    bce = keras.losses.BinaryCrossentropy(from_logits=True)
    rng = np.random.default_rng(trial.seed)
    with trainvitals.Monitor(
        server=trial.server.url, project="healthy", run_name=trial.name, model=disc,
        optimizer=d_opt, system_metrics=False,
    ) as mon:  # fmt: skip

        @tf.function  # type: ignore[untyped-decorator]
        def players(batch: tf.Tensor) -> tuple[Any, Any, list[Any]]:
            with tf.GradientTape() as d_tape, tf.GradientTape() as g_tape:
                fake = gen(tf.random.normal((32, 16)), training=True)
                d_real, d_fake = disc(batch, training=True), disc(fake, training=True)
                d_loss = bce(tf.ones_like(d_real), d_real) + bce(tf.zeros_like(d_fake), d_fake)
                g_loss = bce(tf.ones_like(d_fake), d_fake)
            d_grads = d_tape.gradient(d_loss, disc.trainable_variables)
            g_grads = g_tape.gradient(g_loss, gen.trainable_variables)
            d_opt.apply_gradients(zip(d_grads, disc.trainable_variables, strict=True))
            g_opt.apply_gradients(zip(g_grads, gen.trainable_variables, strict=True))
            return d_loss, g_loss, d_grads

        for step in range(1, 1001):  # one compiled step: the suite pays seconds, not a minute
            batch = tf.constant(real[rng.integers(0, len(real), 32)])
            d_loss, g_loss, d_grads = players(batch)
            mon.log(step, grads=d_grads, inputs=batch, metrics={"d_loss": d_loss, "g_loss": g_loss})


def resumed_from_checkpoint(trial: Trial) -> None:
    """The demo's CNN trained for a while, saved, and a new run that loads the checkpoint
    and carries on from its epoch at three times the learning rate (its loss starts low: no
    baseline to lean on)."""
    import keras

    from trainvitals.demo.scenarios import build_model, digits

    (x, y), validation = digits()
    first = build_model()
    before = Trial(trial.server, f"{trial.name}-before", trial.seed, trial.tmp)
    _fit(before, first, x, y, batch_size=32, epochs=10)
    checkpoint = trial.tmp / "resume.keras"
    first.save(checkpoint)  # weights and the optimizer's state
    second = keras.models.load_model(checkpoint)
    second.optimizer.learning_rate = 3e-3  # resumed at another rate than it was saved with
    _fit(
        trial,
        second,
        x,
        y,
        batch_size=32,
        epochs=40,
        initial_epoch=10,
        validation_data=validation,
    )


HEALTHY: dict[str, Callable[[Trial], None]] = {
    "warmup-cosine-mlp": warmup_cosine_mlp,
    "tiny-noisy-batches": tiny_noisy_batches,
    "batchnorm-cnn": batchnorm_cnn,
    "gru-regression": gru_regression,
    "mixed-float16": mixed_float16,
    "reduce-on-plateau": reduce_on_plateau,
    "imbalanced-noisy-labels": imbalanced_noisy_labels,
    "transformer-warmup-adamw": transformer_warmup_adamw,
    "finetune-unfrozen": finetune_unfrozen,
    "gan": gan,
    "resumed-from-checkpoint": resumed_from_checkpoint,
}


def run_healthy(server: ServerProcess, shape: str, tmp: Path, seed: int = 0) -> list[Outcome]:
    """Train one healthy shape with one seed; the outcomes of its runs (the resumed one has
    two). Seed 0's run is named after the shape, another's ``<shape>-seed<N>``."""
    import keras

    name = f"{shape}-seed{seed}" if seed else shape
    keras.utils.set_random_seed(seed)
    HEALTHY[shape](Trial(server, name, seed, tmp))
    names = [f"{name}-before", name] if shape == "resumed-from-checkpoint" else [name]
    return [outcome(server, "healthy", n) for n in names]
