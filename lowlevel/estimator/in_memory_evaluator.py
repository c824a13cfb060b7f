"""`InMemoryEvaluatorHook`: evaluation inside the training process, without a checkpoint
(tf.estimator.experimental.InMemoryEvaluatorHook, as tensorflow_estimator 2.15's
hooks/hooks.py).

At `begin` the hook builds the Estimator's EVAL graph once, in a graph of its own,
with the pieces `Estimator.evaluate` uses (`lowlevel.runtime.evaluation.
build_eval_graph`). It evaluates right after the training session is created,
after every `every_n_iter`-th `session.run` of training (counted from that
session's start, not by global step), and at `end`: each time it copies every
global variable the two graphs share (by name) from the training session into a
fresh evaluation session, runs the metric updates `steps` times or until
`input_fn`'s data ends, and writes the results as scalar summaries to
`<model_dir>/eval` (or `eval_<name>`) at the training global step, as `evaluate`
does (no `checkpoint_path` summary: there is no checkpoint). Nothing is returned;
the results are in the summaries. A training run of N steps thus evaluates at
steps 0, n, 2n, ... and again at N (twice at N when n divides N, as 2.15).

Limits (2.15's, same ValueErrors): single machine only; no custom Saver or
init_fn in the model's Scaffold; no SAVEABLE_OBJECTS other than variables.
"""

from __future__ import annotations

import tensorflow as tf

from lowlevel.estimator.estimator import _check_hooks_type
from lowlevel.runtime import evaluation

v1 = tf.compat.v1


class InMemoryEvaluatorHook(v1.train.SessionRunHook):
    """Runs `estimator`'s evaluation on `input_fn` during its training (see the module).

    Args (as `Estimator.evaluate`'s): estimator (a lowlevel `Estimator`);
    input_fn; steps (int > 0 or None: until the data ends); hooks
    (SessionRunHooks of the evaluation); name (results in `eval_<name>`);
    every_n_iter (int > 0: training iterations between evaluations).

    Raises at construction (2.15's messages): ValueError "invalid
    every_n_iter=<n>." for None or <= 0; ValueError "InMemoryEvaluator supports
    only single machine (aka Local) setting." when the config has ps tasks or
    more than one worker; TypeError for a hook that is not a SessionRunHook;
    ValueError "Must specify steps > 0, given: <steps>". At `begin`: ValueError
    for a custom saver or init_fn in the model's Scaffold; after the training
    session is created: ValueError for SAVEABLE_OBJECTS in the training graph.
    """

    def __init__(self, estimator, input_fn, steps=None, hooks=None, name=None,
                 every_n_iter=100):
        if every_n_iter is None or every_n_iter <= 0:
            raise ValueError(f"invalid every_n_iter={every_n_iter}.")
        config = estimator.config
        if config.num_ps_replicas > 0 or config.num_worker_replicas > 1:
            raise ValueError("InMemoryEvaluator supports only single machine (aka Local) "
                             "setting.")
        self._estimator, self._input_fn, self._name = estimator, input_fn, name
        self._every_n_iter = every_n_iter
        self._eval_dir = evaluation.eval_dir(estimator.model_dir, name)
        self._hooks = _check_hooks_type(hooks)
        if steps is not None and steps <= 0:
            raise ValueError(f"Must specify steps > 0, given: {steps}")
        self._steps = steps
        self._graph = None
        self._timer = v1.train.SecondOrStepTimer(every_steps=every_n_iter)

    def begin(self):
        """Builds the evaluation graph (once per training run) and a placeholder per variable."""
        self._timer.reset()
        self._iter_count = 0
        self._graph = tf.Graph()
        with self._graph.as_default():
            model = self._estimator._model()  # noqa: SLF001 (the Estimator's ModelFnModel)
            (self._scaffold, self._update_op, self._eval_dict,
             self._all_hooks) = evaluation.build_eval_graph(
                model, self._input_fn, self._hooks, checkpoint_path=None)
            if self._scaffold.saver is not None:
                raise ValueError("InMemoryEvaluator does not support custom saver")
            if self._scaffold.init_fn is not None:
                raise ValueError("InMemoryEvaluator does not support custom init_fn")
            variables = v1.get_collection(v1.GraphKeys.GLOBAL_VARIABLES)
            self._eval_vars = {v.name: v for v in variables}
            self._placeholders = {v.name: v1.placeholder(v.dtype.base_dtype) for v in variables}

    def after_create_session(self, session, coord):
        """Pairs the training graph's variables with the evaluation graph's; evaluates."""
        del coord
        if v1.get_collection(v1.GraphKeys.SAVEABLE_OBJECTS):
            raise ValueError("InMemoryEvaluator does not support saveables other than global "
                             "variables.")
        train_vars = {v.name: v for v in v1.get_collection(v1.GraphKeys.GLOBAL_VARIABLES)}
        shared = sorted(set(self._placeholders) & set(train_vars))
        self._train_vars = {name: train_vars[name] for name in shared}
        with self._graph.as_default():
            self._feed_op = tf.group([v1.assign(self._eval_vars[name], self._placeholders[name])
                                      for name in shared])
        self._evaluate(session)

    def _evaluate(self, train_session):
        values = train_session.run(self._train_vars)
        feed = {self._placeholders[name]: value for name, value in values.items()}

        def feed_variables(scaffold, session):
            del scaffold
            session.run(self._feed_op, feed_dict=feed)

        scaffold = v1.train.Scaffold(init_fn=feed_variables, copy_from_scaffold=self._scaffold)
        config = self._estimator.config
        with self._graph.as_default():
            results = evaluation._evaluate_once(  # noqa: SLF001 (evaluate's own loop)
                None, config, scaffold, self._update_op, self._eval_dict, self._all_hooks,
                self._steps)
            evaluation.write_dict_to_summary(self._eval_dir, results,
                                                   results[v1.GraphKeys.GLOBAL_STEP])
        self._timer.update_last_triggered_step(self._iter_count)

    def after_run(self, run_context, run_values):
        """Evaluates after every `every_n_iter`-th training iteration."""
        del run_values
        self._iter_count += 1
        if self._timer.should_trigger_for_step(self._iter_count):
            self._evaluate(run_context.session)

    def end(self, session):
        """Evaluates the final model."""
        self._evaluate(session)
