"""The hooks' `due()` contract, in one process: `loop.StepRunner` sends a step through the
hooks only when one of them is due, so each must say so exactly when it needs a step."""

import time

import pytest
import tensorflow as tf

from lowlevel import errors
from lowlevel.runtime import hooks, loop, progress

v1 = tf.compat.v1


class _Run:
    """A minimal `run_context`/`run_values` stand-in for calling hooks directly."""

    def __init__(self, session=None, results=None):
        self.session, self.results = session, results


def _until(predicate, timeout_secs):
    deadline = time.monotonic() + timeout_secs
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


@pytest.fixture
def graph():
    with tf.Graph().as_default() as g:
        step = v1.train.get_or_create_global_step()
        w = v1.get_variable("w", initializer=tf.constant(1.0))
        loss = tf.square(w)
        v1.summary.scalar("loss", loss)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            yield g, sess, step, loss


def test_progress_is_due_at_the_first_step_then_every_interval(graph):
    _, sess, step, loss = graph
    state = hooks.LoopState()
    hook = progress.ProgressHook(step, loss, 64, 100, every_secs=0.3, state=state)
    hook.after_create_session(sess, None)
    assert hook.due()  # the first step always logs
    state.in_step = True
    assert hook.before_run(_Run()) is not None
    hook.after_run(_Run(), _Run(results={"step": 0, "loss": 1.0}))
    assert not hook.due()
    state.in_step = False
    assert hook.before_run(_Run()) is None  # not a training step: fetches nothing
    assert _until(hook.due, 2.0)
    assert hook.first_step == 1


def test_checkpoint_is_due_every_save_steps(graph, tmp_path):
    g, sess, step, _ = graph
    state = hooks.LoopState()
    with g.as_default():
        hook = hooks.CheckpointHook(v1.train.Saver(), str(tmp_path), state, save_steps=10)
        hook.begin()
    hook.after_create_session(sess, None)  # saves the state it starts from, at step 0
    assert (tmp_path / "model.ckpt-0.index").exists()
    for value, due in ((0, False), (9, False), (10, True)):
        state.value = value
        assert hook.due() is due, value
    hook.before_run(_Run(session=sess))  # saves, and is not due again until step 20
    assert not hook.due()
    state.value = 20
    assert hook.due()


def test_a_state_above_a_gib_is_not_saved_at_session_start_but_with_the_cadence(graph,
                                                                                tmp_path):
    """100 M rows: 13.6 GB restored or deterministic; its save at step 0 took longer than
    the 60 s to the first step (issue 27). The cadence and the final save still save."""
    g, sess, step, _ = graph
    state = hooks.LoopState()
    with g.as_default():
        hook = hooks.CheckpointHook(v1.train.Saver(), str(tmp_path), state, save_steps=10,
                                    state_bytes=hooks.INITIAL_SAVE_MAX_BYTES + 1)
        hook.begin()
    hook.after_create_session(sess, None)
    assert not list(tmp_path.glob("model.ckpt-*"))
    state.value = 10
    assert hook.due()
    hook.before_run(_Run(session=sess))
    assert (tmp_path / "model.ckpt-0.index").exists()  # the global step is still 0 here
    assert hooks.save_timeout_secs(60.0, 13_600_000_000) == 60.0 + 680.0


def test_summary_is_due_once_per_interval(graph, tmp_path):
    g, _, _, _ = graph
    state = hooks.LoopState()
    with g.as_default():
        hook = hooks.SummaryHook(str(tmp_path), 0.3, state)
        hook.begin()
    assert hook.due()
    state.in_step = True
    assert hook.before_run(_Run()) is not None
    assert not hook.due()
    assert _until(hook.due, 2.0)


def _fetched(args) -> list:
    return sorted(args.fetches) if isinstance(args.fetches, dict) else [str(args.fetches)]


def test_a_hooked_step_fetches_the_same_whichever_hook_is_due(graph, tmp_path, caplog):
    """Each distinct set of fetches is a new executor on every task (0.16-0.66 s the first
    time, benchmarks/NOTES.md 2026-11-29): progress and summaries fetch in every step run
    through the hooks, and only the one that is due logs or writes."""
    g, sess, step, loss = graph
    state = hooks.LoopState()
    with g.as_default():
        summary = hooks.SummaryHook(str(tmp_path), 3600.0, state)
        summary.begin()
    prog = progress.ProgressHook(step, loss, 64, 100, every_secs=3600.0, state=state)
    prog.after_create_session(sess, None)
    state.in_step = True
    first = [_fetched(h.before_run(_Run())) for h in (prog, summary)]  # both due
    prog.after_run(_Run(), _Run(results={"step": 0, "loss": 1.0}))
    summary.after_run(_Run(), _Run(results={"summary": sess.run(summary._summary),
                                            "step": 0}))
    assert not prog.due() and not summary.due()
    caplog.clear()
    with caplog.at_level("INFO"):
        later = [_fetched(h.before_run(_Run())) for h in (prog, summary)]  # neither due
        prog.after_run(_Run(), _Run(results={"step": 5, "loss": 1.0}))
        summary.after_run(_Run(), _Run(results={"summary": sess.run(summary._summary),
                                                "step": 5}))
    assert later == first
    assert not [r for r in caplog.records if "step 6/100" in r.getMessage()]
    assert prog.first_step == 1  # the rate was not taken again
    v1.summary.FileWriterCache.get(str(tmp_path)).flush()
    written = [e.step for f in tmp_path.glob("events.out.tfevents.*")
               for e in v1.train.summary_iterator(str(f)) if e.HasField("summary")]
    assert written == [0], written  # the due step's summary only


class _Probe(v1.train.SessionRunHook):
    def __init__(self):
        self.runs, self.is_due = 0, False

    def due(self):
        return self.is_due

    def before_run(self, run_context):
        self.runs += 1


class _Graph:
    def __init__(self, hook_list, steps):
        self.hooks, self.steps = hook_list, steps
        self.progress = self

    def record(self, start, seconds, steps=1):
        pass


def test_step_runner_goes_through_the_hooks_only_when_one_is_due(graph):
    g, _, step, _ = graph
    with g.as_default():
        inc = step.assign_add(1)
        probe = _Probe()
        with v1.train.MonitoredSession(hooks=[probe]) as sess:
            runner = loop.StepRunner(sess, _Graph([probe], hooks.LoopState()))
            for _ in range(5):
                runner(inc)
            assert probe.runs == 0  # past the hooks: nothing due
            probe.is_due = True
            runner(inc)
            assert probe.runs == 1
            assert int(sess.run(step)) == 6  # every step ran, once


def test_a_hook_that_acts_per_step_without_due_is_refused(graph):
    class Undue(v1.train.SessionRunHook):
        def after_run(self, run_context, run_values):
            pass

    class EndOnly(v1.train.SessionRunHook):
        def end(self, session):
            pass

    with pytest.raises(TypeError, match="Undue: acts in before_run/after_run but has no due"):
        loop.StepRunner(None, _Graph([EndOnly(), Undue()], hooks.LoopState()))
    loop.StepRunner(None, _Graph([EndOnly(), _Probe()], hooks.LoopState()))  # accepted


def test_only_lost_session_errors_are_retried():
    assert errors.lost_session(tf.errors.UnavailableError(None, None, "ps gone"))
    assert errors.lost_session(RuntimeError("Attempted to use a closed Session."))
    assert errors.lost_session(errors.NoLiveSession("being recreated"))
    assert not errors.lost_session(RuntimeError("a bug"))
    assert not errors.lost_session(ValueError("a bug"))
