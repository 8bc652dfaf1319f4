"""One worker of a real two-process ``MultiWorkerMirroredStrategy`` job on the CPU, with a
custom training loop watched by ``trainvitals.Monitor`` (Keras 3's ``fit`` does not run under
this strategy: keras-team/keras#20585).

Usage: ``python -m tests.e2e.multi_worker INDEX PORT0,PORT1 SERVER_URL``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def main(index: int, ports: list[str], server: str) -> None:
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": [f"127.0.0.1:{port}" for port in ports]},
        "task": {"type": "worker", "index": index},
    })  # fmt: skip
    import keras
    import numpy as np
    import tensorflow as tf

    import trainvitals

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((8,)), keras.layers.Dense(16, activation="relu", name="hidden"),
            keras.layers.Dense(1, name="out"),
        ])  # fmt: skip
        optimizer = keras.optimizers.SGD(0.01)
    rng = np.random.default_rng(index)
    x = rng.random((256, 8), dtype=np.float32)
    y = x.sum(axis=1, keepdims=True)
    batches = iter(
        strategy.experimental_distribute_dataset(
            tf.data.Dataset.from_tensor_slices((x, y)).batch(32).repeat()
        )
    )

    @tf.function  # type: ignore[untyped-decorator]
    def train_step(batch: Any) -> Any:
        def step(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, list[tf.Tensor], tf.Tensor]:
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss, grads, x

        return strategy.run(step, args=batch)

    def local(value: Any) -> Any:
        return tf.nest.map_structure(lambda v: strategy.experimental_local_results(v)[0], value)

    with trainvitals.Monitor(
        server=server, project="multi", run_name=f"mw-{index}", model=model, system_metrics=False
    ) as monitor:
        for step in range(1, 21):
            loss, grads, inputs = local(train_step(next(batches)))
            monitor.log(step, loss=loss, grads=grads, inputs=inputs)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2].split(","), sys.argv[3])
