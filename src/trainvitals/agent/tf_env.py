"""What TensorFlow says about the build, the devices and a ``fit``'s data, for the run's
``hello``. Imports TensorFlow: load it lazily."""

from __future__ import annotations

import functools
import os
from typing import Any, TypedDict

import numpy as np
import tensorflow as tf

from trainvitals.agent import environment
from trainvitals.protocol import LOSS_AT_CHANCE, VARIABLE_ORDER


def input_kinds(structure: Any) -> dict[str, list[str]]:
    """What a ``fit``'s data holds, for the run's environment: ``{"kinds": [...]}`` (ragged,
    sparse, string, the dtypes) and, when there are some, ``"not_counted"``: the kinds whose
    NaN/Inf the in-step count cannot read. A ``tf.data.Dataset`` is read from its element
    spec; a generator or a ``PyDataset`` yields nothing before training, so says nothing."""
    if isinstance(structure, tf.data.Dataset):
        leaves = tf.nest.flatten(structure.element_spec)
    else:
        leaves = tf.nest.flatten(structure)
    kinds, not_counted = set(), set()
    for leaf in leaves:
        if leaf is None:
            continue
        kind = _kind(leaf)
        if kind is None:
            not_counted.add(type(leaf).__name__)
        else:
            kinds.add(kind)
    described: dict[str, list[str]] = {"kinds": sorted(kinds)}
    if not_counted:
        described["not_counted"] = sorted(not_counted)
    return described


def _kind(leaf: Any) -> str | None:
    """``leaf``'s kind, as the NaN/Inf count reads it ("ragged float32", "string", ...), or
    None for a kind it cannot read."""
    prefix = ""
    if isinstance(leaf, (tf.RaggedTensor, tf.RaggedTensorSpec)):
        prefix = "ragged "
    elif isinstance(leaf, (tf.SparseTensor, tf.SparseTensorSpec)):
        prefix = "sparse "
    elif isinstance(leaf, np.ndarray):  # read its dtype, never a copy of the data
        return "string" if leaf.dtype.kind in "USO" else _dtype_name(leaf.dtype)
    elif not isinstance(leaf, (tf.Tensor, tf.Variable, tf.TensorSpec)):
        try:
            leaf = tf.convert_to_tensor(leaf)
        except (TypeError, ValueError):
            return None
    dtype = getattr(leaf, "dtype", None)
    if not isinstance(dtype, tf.dtypes.DType):
        return None
    return prefix + str(dtype.name)


def _dtype_name(dtype: Any) -> str | None:
    try:
        return str(tf.as_dtype(dtype).name)
    except TypeError:
        return None


class Worker(TypedDict):
    """This process's task in ``TF_CONFIG``: ``{"type": "worker", "index": 1}``."""

    type: str
    index: int


class ChanceLoss(TypedDict):
    """The loss a classifier gives when every class is as likely: where a fresh model's loss
    starts, give or take, and what a loss that starts far above it says about the weights."""

    loss: str
    classes: int
    value: float


class TensorflowEnv(TypedDict, total=False):
    """What :func:`describe` tells the run's ``hello``; a key it cannot learn is left out."""

    tensorflow: str
    #: ``cuda_version``, ``cudnn_version``, ``is_cuda_build``, as the build reports them.
    tf_build: dict[str, str | bool]
    tf_gpus: list[str]
    #: Each GPU's memory-growth setting (None where TensorFlow would not say).
    memory_growth: dict[str, bool | None]
    mixed_precision_policy: str
    worker: Worker
    distribution_strategy: str
    replicas: int
    #: What the ``fit``'s data holds (:func:`input_kinds`).
    inputs: dict[str, list[str]]
    jit_compile: bool
    #: The model's trainable variables' paths in model order, as the per-variable gradient
    #: norms (``grad/norm/<path>``) name them: the detector's model order on a replay too.
    variable_order: list[str]
    #: A classifier's loss at chance (:func:`loss_at_chance`).
    loss_at_chance: ChanceLoss
    #: Why :func:`describe` itself failed, instead of the rest.
    tensorflow_describe_error: str


def describe(model: Any = None, data: Any = None) -> TensorflowEnv:
    """What TensorFlow says about the build and the devices, and what ``data`` (the ``fit``'s
    ``x``) holds, for the run's ``hello``; never raises (what failed is said under
    ``tensorflow_describe_error``)."""
    try:
        env = _describe(model)
        if data is not None:
            env["inputs"] = input_kinds(data)
        return env
    except Exception as exc:  # facts for the dashboard, never a reason to fail
        return {"tensorflow_describe_error": f"{type(exc).__name__}: {exc}"}


def _describe(model: Any) -> TensorflowEnv:
    env: TensorflowEnv = {"tensorflow": tf.__version__}
    try:
        build = tf.sysconfig.get_build_info()
        env["tf_build"] = {
            k: build[k] for k in ("cuda_version", "cudnn_version", "is_cuda_build") if k in build
        }
    except Exception:  # very old or exotic builds
        pass
    gpus = tf.config.list_physical_devices("GPU")
    env["tf_gpus"] = [gpu.name for gpu in gpus]
    growth: dict[str, bool | None] = {}
    for gpu in gpus:
        try:
            growth[gpu.name] = bool(tf.config.experimental.get_memory_growth(gpu))
        except Exception:
            growth[gpu.name] = None
    env["memory_growth"] = growth
    try:
        import keras

        env["mixed_precision_policy"] = keras.config.dtype_policy().name
    except Exception:
        pass
    _, task = environment.tf_config(os.environ.get("TF_CONFIG"))
    if task:
        env["worker"] = {"type": task[0], "index": task[1]}
    if model is not None:
        strategy = getattr(model, "distribute_strategy", None)
        if strategy is not None:
            env["distribution_strategy"] = type(strategy).__name__
            env["replicas"] = int(getattr(strategy, "num_replicas_in_sync", 1))
        env["jit_compile"] = bool(getattr(model, "jit_compile", False))
        variables = list(getattr(model, "trainable_variables", None) or [])
        if variables:  # an unbuilt model has none yet: the detector falls back to first seen
            env[VARIABLE_ORDER] = [variable_name(v, i) for i, v in enumerate(variables)]
        chance = loss_at_chance(model)
        if chance is not None:
            env[LOSS_AT_CHANCE] = chance
    return env


#: Keras's cross-entropies by the names ``compile`` takes (string, class or function), and
#: whether the loss is a mean over classes of two-way choices (binary) or one K-way choice.
CROSS_ENTROPIES = {
    "sparse_categorical_crossentropy": False, "sparsecategoricalcrossentropy": False,
    "categorical_crossentropy": False, "categoricalcrossentropy": False,
    "binary_crossentropy": True, "binarycrossentropy": True,
}  # fmt: skip


#: Keras's regression losses by the names ``compile`` takes: those whose loss at chance
#: (:func:`chance_of_regression`) the train step measures on each batch's targets.
REGRESSION_LOSSES = frozenset(
    ("mse", "mean_squared_error", "mae", "mean_absolute_error", "huber", "log_cosh")
)


def _single_loss(model: Any, unknown_outputs: bool = False) -> tuple[str, Any] | None:
    """``(name, loss)`` of a model with one output and one loss, averaged over the batch and
    not weighted; None otherwise, or while its outputs are not known (unless
    ``unknown_outputs``: a subclassed model never says them)."""
    loss = getattr(model, "loss", None)
    # Keras 3 keeps compile's loss_weights only on its private CompileLoss; a weight scales
    # the loss away from the level.
    weights = getattr(model, "loss_weights", None) or getattr(
        getattr(model, "_compile_loss", None), "_user_loss_weights", None
    )
    if loss is None or isinstance(loss, (list, tuple, dict)):
        return None
    if weights not in (None, 1, 1.0, [1], [1.0]):
        return None
    reduction = getattr(loss, "reduction", None)
    if reduction not in (None, "sum_over_batch_size", "mean", "auto"):
        return None  # a sum grows with the batch: no level to compare with
    outputs = getattr(model, "outputs", None)
    if len(outputs or []) != 1 and not (unknown_outputs and outputs is None):
        return None
    name = loss if isinstance(loss, str) else getattr(loss, "__name__", type(loss).__name__)
    return str(name), loss


def loss_at_chance(model: Any) -> ChanceLoss | None:
    """A single-output classifier's loss when it gives every class the same probability: ln K
    for a K-way cross-entropy, ln 2 for a binary one; None for any other loss, several outputs
    or losses, a loss summed rather than averaged, or a model whose output is not known yet."""
    single = _single_loss(model)
    binary = CROSS_ENTROPIES.get(single[0].lower()) if single else None
    if single is None or binary is None:
        return None
    units = model.outputs[0].shape[-1] if len(model.outputs[0].shape) else None
    classes = 2 if binary else units
    if not isinstance(classes, int) or classes < 2:
        return None
    return {"loss": single[0], "classes": classes, "value": float(np.log(classes))}


def regression_loss(model: Any) -> Any:
    """The loss of a single-output model compiled with one of Keras's own regression losses
    (:data:`REGRESSION_LOSSES`, by name, function or class), as a callable of ``(y_true,
    y_pred)`` that returns the batch's mean; None for any other model or loss. Keras's own
    only, by identity: the train step calls it, and a custom loss of the same name may do
    anything (read labels as indices, fail at run time)."""
    # Several targets, should a subclassed model have several outputs, are told by the batch.
    single = _single_loss(model, unknown_outputs=True)
    if single is None:
        return None
    import keras

    loss = single[1]
    classes = (keras.losses.MeanSquaredError, keras.losses.MeanAbsoluteError,
               keras.losses.Huber, keras.losses.LogCosh)  # fmt: skip
    if type(loss) in classes:
        return loss  # its own settings (Huber's delta), averaged as checked above
    functions = {name: keras.losses.get(name) for name in REGRESSION_LOSSES}
    if isinstance(loss, str):
        function = functions.get(loss.lower())
    else:
        function = loss if any(loss is f for f in functions.values()) else None
    return None if function is None else lambda y, p: tf.reduce_mean(function(y, p))


def chance_of_regression(loss: Any, data: Any) -> tf.Tensor | None:
    """A regression's loss at chance on one batch (``data`` as the train step gets it): the
    loss of predictions of a fresh model's scale, 1 and -1 in turn, around zero; for the mean
    squared error, the targets' mean square plus one. A fresh model on inputs of unit scale
    starts near it; one whose weights were drawn far too wide starts orders of magnitude
    above. None where the batch has no single dense target."""
    import keras

    _, y, _ = keras.utils.unpack_x_y_sample_weight(data)
    targets = tf.nest.flatten(y)
    if len(targets) != 1 or not isinstance(targets[0], tf.Tensor):
        return None  # no target, several, or a ragged or sparse one
    target = targets[0]
    if not (target.dtype.is_floating or target.dtype.is_integer):
        return None
    target = tf.cast(target, tf.float32)
    one = tf.ones_like(target)
    both = [tf.cast(loss(target, sign * one), tf.float32) for sign in (1.0, -1.0)]
    return (both[0] + both[1]) / 2


def variable_name(variable: Any, index: int) -> str:
    """A variable's name in the per-variable series (``grad/norm/<name>``): its path."""
    return str(getattr(variable, "path", None) or getattr(variable, "name", None) or index)


@functools.cache
def has_gpu() -> bool:
    """Whether TensorFlow sees a GPU (asked once: the answer does not change in a process)."""
    return bool(tf.config.list_physical_devices("GPU"))
