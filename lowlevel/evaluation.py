"""Evaluating the model on a whole split: loss and accuracy.

The evaluation graph reuses the training model's variables (the `model/`
scope is built with AUTO_REUSE), so on a worker it reads them from the ps
tasks; the final evaluation is run by the chief after its last step.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from lowlevel import data as data_lib
from lowlevel import models

v1 = tf.compat.v1


@dataclasses.dataclass
class EvalOps:
    """Ops of one evaluation pass over a split, built into the current graph."""

    initializer: object
    feed: dict
    sum_loss: object   # float32 scalar: summed cross-entropy of the batch
    num_correct: object  # int64 scalar
    num_examples: object  # int32 scalar


def build(split: data_lib.Split, max_value: float, model: str, num_classes: int,
          hidden_units, seed: int = 0) -> EvalOps:
    """Builds the evaluation of `model` on `split` (batches of 1,000 images)."""
    initializer, feed, (images, labels) = data_lib.eval_input(split, max_value)
    with tf.name_scope("eval"):
        logits = models.build(model, images, num_classes, hidden_units, seed)
        losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        correct = tf.equal(tf.argmax(logits, axis=1), labels)
        return EvalOps(initializer, feed, tf.reduce_sum(losses),
                       tf.reduce_sum(tf.cast(correct, tf.int64)), tf.shape(labels)[0])


def evaluate(sess, ops: EvalOps) -> dict:
    """Runs one pass; returns {"loss": mean cross-entropy, "accuracy": fraction, "num_examples"}."""
    sess.run(ops.initializer, ops.feed)
    total_loss, correct, n = 0.0, 0, 0
    while True:
        try:
            loss, c, b = sess.run([ops.sum_loss, ops.num_correct, ops.num_examples])
        except tf.errors.OutOfRangeError:
            break
        total_loss, correct, n = total_loss + float(loss), correct + int(c), n + int(b)
    return {"loss": total_loss / max(n, 1), "accuracy": correct / max(n, 1), "num_examples": n}


class FinalEvalHook(v1.train.SessionRunHook):
    """Evaluates once, when the monitored session ends normally; result in `.result`."""

    def __init__(self, ops: EvalOps):
        self._ops = ops
        self.result = None

    def end(self, session):
        self.result = evaluate(session, self._ops)
