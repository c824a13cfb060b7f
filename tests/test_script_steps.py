"""`modes.script_steps`: a script's `minimize(global_step=...)` as the counted step, its
limit closed when the session is made (in-process: one graph, one local session)."""

import pytest
import tensorflow as tf

from lowlevel.modes import script_steps

v1 = tf.compat.v1


@pytest.fixture(autouse=True)
def installed():
    """The patch for this test only: the other tests of the process get stock TensorFlow."""
    script_steps.install()
    yield
    script_steps.uninstall()


@pytest.mark.parametrize("resource", [False, True], ids=["ref_variable", "resource_variable"])
def test_a_minimize_with_a_global_step_stops_at_the_closed_limit(resource):
    with tf.Graph().as_default() as graph:
        global_step = v1.get_variable("global_step", [], v1.int64, v1.zeros_initializer(),
                                      trainable=False, use_resource=resource)
        w = v1.get_variable("w", [], initializer=v1.constant_initializer(1.0),
                            use_resource=resource)
        train_op = v1.train.GradientDescentOptimizer(0.25).minimize(
            tf.square(w), global_step=global_step)
        assert isinstance(train_op, tf.Operation)
        assert script_steps.close_limit(graph, 3) == 1
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            seen = [sess.run([train_op, global_step]) for _ in range(5)]
            # Past the last step the run returns its other fetches, the step's own None,
            # and applies nothing: w halves 3 times, not 5.
            assert [step for _, step in seen[3:]] == [3, 3] and seen[4][0] is None
            assert sess.run(global_step) == 3
            assert sess.run(w) == pytest.approx(0.5 ** 3)


class _FetchesTheStep(v1.train.SessionRunHook):
    """Asks for the global step on every run, as `StepCounterHook` does: the session's run
    is then a dict keyed by "caller" and the hooks."""

    def before_run(self, run_context):
        return v1.train.SessionRunArgs(v1.train.get_global_step())


def test_past_the_limit_a_monitored_sessions_run_with_hook_fetches_returns_them():
    with tf.Graph().as_default() as graph:
        global_step = v1.train.get_or_create_global_step()
        w = v1.Variable(1.0)
        train_op = v1.train.GradientDescentOptimizer(0.5).minimize(tf.square(w),
                                                                   global_step=global_step)
        script_steps.close_limit(graph, 2)
        Pair = __import__("collections").namedtuple("Pair", "step value")
        with v1.train.MonitoredSession(hooks=[_FetchesTheStep()]) as sess:
            seen = [sess.run(Pair(train_op, global_step)) for _ in range(4)]
        assert seen[-1] == Pair(None, 2) and isinstance(seen[-1], Pair), seen


def test_the_limit_stays_open_until_closed_and_other_applies_are_stock():
    with tf.Graph().as_default() as graph:
        global_step = v1.Variable(0, name="global_step", trainable=False)  # int32, TF1 style
        w = v1.Variable(2.0)
        counted = v1.train.AdagradOptimizer(0.1).minimize(tf.square(w), global_step=global_step)
        plain = v1.train.AdagradOptimizer(0.1).minimize(tf.square(w))  # no global step
        assert len(graph.get_collection(script_steps.COUNTED_STEPS)) == 1
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            for _ in range(5):
                sess.run(counted)  # open: int32's max
            sess.run(plain)
            assert sess.run(global_step) == 5


def test_the_environment_gives_the_limit_of_a_loop_of_the_scripts_own(monkeypatch):
    """`LOWLEVEL_LAST_STEP`: the runs of a loop `until step >= N` (mnist_replica.py's) see
    N and no more; a step reached only through another op still raises at the end."""
    monkeypatch.setenv(script_steps.LAST_STEP_ENV, "4")
    with tf.Graph().as_default() as graph:
        global_step = v1.Variable(0, name="global_step", trainable=False)
        w = v1.Variable(2.0)
        step_op = v1.train.GradientDescentOptimizer(0.1).minimize(tf.square(w),
                                                                  global_step=global_step)
        grouped = tf.group(step_op)
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            steps = [sess.run([step_op, global_step])[1] for _ in range(6)]
            # (a run's read of the step and its count-up are not ordered: 3 or 4 in run 4)
            assert steps[-2:] == [4, 4] and max(steps) == 4, steps  # `until >= 4`: at 4
            with pytest.raises(tf.errors.OutOfRangeError):
                sess.run(grouped)
    monkeypatch.setenv(script_steps.LAST_STEP_ENV, "ten")
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match="LOWLEVEL_LAST_STEP='ten': expected a positive"):
            v1.train.GradientDescentOptimizer(0.1).minimize(
                tf.square(v1.Variable(1.0)), global_step=v1.train.get_or_create_global_step())


def test_a_sync_optimizers_inner_apply_is_left_alone_and_its_hook_is_deferred():
    with tf.Graph().as_default() as graph:
        global_step = v1.train.get_or_create_global_step()
        w = v1.Variable(2.0)
        opt = v1.train.SyncReplicasOptimizer(v1.train.AdagradOptimizer(0.1),
                                             replicas_to_aggregate=2, total_num_replicas=2)
        opt.minimize(tf.square(w), global_step=global_step)
        assert graph.get_collection(script_steps.COUNTED_STEPS) == []
        hook = opt.make_session_run_hook(True)
        assert isinstance(hook, script_steps.DeferredSyncHook)
        assert hook.global_step is global_step and hook.is_chief and hook.num_tokens == -1
        assert type(hook.stock).__name__ == "_SyncReplicasOptimizerHook"
        opt.ready_for_local_init_op.mark_used()  # (no session here: TF would warn at exit)


def test_a_sync_chiefs_own_queue_runner_stops_at_the_environments_last_step(monkeypatch):
    """`LOWLEVEL_LAST_STEP=3`: the chief's queue runner (a Supervisor script starts it
    itself) applies up to global step 3, leaves one more token per worker for each one's
    last run, and its thread ends; a loop `until step >= 3` ends at exactly 3."""
    monkeypatch.setenv(script_steps.LAST_STEP_ENV, "3")
    with tf.Graph().as_default():
        global_step = v1.train.get_or_create_global_step()
        w = v1.Variable(1.0)
        opt = v1.train.SyncReplicasOptimizer(v1.train.GradientDescentOptimizer(0.5),
                                             replicas_to_aggregate=1, total_num_replicas=1)
        train_op = opt.minimize(tf.square(w), global_step=global_step)
        runner = opt.get_chief_queue_runner()
        assert isinstance(runner, script_steps.CountedChiefQueueRunner)
        init_tokens = opt.get_init_tokens_op()
        with v1.Session() as sess:
            sess.run([v1.global_variables_initializer(), v1.local_variables_initializer()])
            sess.run(opt.chief_init_op)
            sess.run(init_tokens)
            coord = v1.train.Coordinator()
            threads = runner.create_threads(sess, coord=coord, daemon=True, start=True)
            step = 0
            while step < 3:
                _, step = sess.run([train_op, global_step])
            loop = threads[0]  # (the other waits for the coordinator to close the queue)
            loop.join(10)
            assert not loop.is_alive()  # the runner's loop ended by itself
            assert sess.run(global_step) == 3
            coord.request_stop()
            coord.join(threads, stop_grace_period_secs=5)


def test_no_gradient_at_all_is_refused_as_stock_minimize_refuses_it():
    with tf.Graph().as_default():
        global_step = v1.train.get_or_create_global_step()
        w = v1.Variable(2.0)
        with pytest.raises(ValueError, match="No gradients provided"):
            v1.train.GradientDescentOptimizer(0.1).apply_gradients(
                [(None, w)], global_step=global_step)


def test_a_scripts_limit_comes_from_the_environment_or_is_the_trainers_default(monkeypatch):
    from lowlevel import train
    from lowlevel.errors import UsageError
    monkeypatch.delenv("LOWLEVEL_STEP_TIMEOUT_SECS", raising=False)
    assert train.limit("step_timeout_secs") == 60.0 == train.STEP_TIMEOUT_SECS
    assert train.limit("fault_timeout_secs") == 90.0
    monkeypatch.setenv("LOWLEVEL_STEP_TIMEOUT_SECS", " 2.5 ")
    assert train.limit("step_timeout_secs") == 2.5
    train.check_limits()
    for bad in ("0", "-1", "soon", "inf", "nan"):
        monkeypatch.setenv("LOWLEVEL_STEP_TIMEOUT_SECS", bad)
        with pytest.raises(UsageError, match=r"LOWLEVEL_STEP_TIMEOUT_SECS=.*: expected a "
                           r"positive number of seconds \(the trainer's --step_timeout_secs; "
                           r"default 60\)"):
            train.check_limits()


def _placed(setter_fn, cluster):
    """{variable name: its device} of an MLP's variables built under `setter_fn(cluster)`."""
    with tf.Graph().as_default():
        with tf.compat.v1.device(setter_fn(cluster=cluster)):
            for name, shape in (("w1", [784, 512]), ("b1", [512]), ("w2", [512, 10]),
                                ("b2", [10]), ("global_step", [])):
                tf.compat.v1.get_variable(name, shape, dtype=tf.int64 if not shape
                                          else tf.float32)
            return {v.op.name: v.device for v in tf.compat.v1.global_variables()}


def test_replica_device_setter_balances_bytes_over_the_ps_and_pins_their_cpu():
    """Two ps: each variable to the ps with the fewest bytes so far (w1, 1.6 MB, alone on
    ps0; the rest on ps1), where stock round-robin puts w1 and w2 together on ps0; one ps:
    the stock placement, on its CPU."""
    from lowlevel import train
    two = {"ps": ["a:1", "b:1"], "worker": ["c:1"]}
    ours, stock = _placed(train.replica_device_setter, two), \
        _placed(tf.compat.v1.train.replica_device_setter, two)
    assert ours == {"w1": "/job:ps/task:0/device:CPU:0", "b1": "/job:ps/task:1/device:CPU:0",
                    "w2": "/job:ps/task:1/device:CPU:0", "b2": "/job:ps/task:1/device:CPU:0",
                    "global_step": "/job:ps/task:1/device:CPU:0"}, ours
    assert stock["w1"] == stock["w2"] == "/job:ps/task:0", stock  # round-robin
    one = _placed(train.replica_device_setter, {"ps": ["a:1"], "worker": ["c:1"]})
    assert set(one.values()) == {"/job:ps/task:0/device:CPU:0"}, one
