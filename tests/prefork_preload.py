"""Imported once by the tests' fork server (`prefork`) before it forks any process:
TensorFlow, imported as a task imports it (Keras skipped, no start-up noise) but left as
a plain `import tensorflow` leaves it (eager, its logger untouched), since each process
sets its own mode as a cold one would (the trainer graph mode, an Estimator script the
mode it chooses); then the modules the entry points import, so that a forked process
starts past them. The entry points themselves (`lowlevel.trainer`, `lowlevel.launch`,
`lowlevel.predict`, `lowlevel.estimator.__main__`) are not imported here: each is run as
`__main__` in its process. Importing these starts no thread, session or server.

Also touched: absl's pending init callbacks (below).
"""

import os

from absl import app

from lowlevel.tf_import import _quiet_stderr, import_quietly

tf = import_quietly()
# `import tensorflow` registers an absl init callback (tensorflow/python/distribute/
# combinations.py: `_set_total_phsyical_gpus`) that lists the GPUs, which calls cuInit,
# when the process's `absl.app.run` starts. A cold trainer or launcher imports TensorFlow
# after that point, so it never runs there; dropped here for the same reason (it would
# also initialise CUDA in a launcher about to fork its tasks).
app._init_callbacks.clear()
# A cold `python -m lowlevel.predict` (or launch) prints no "failed call to cuInit" line on a
# machine without a GPU; a process forked from here printed one at its first session, in
# the middle of the output some tests read line by line. Without an NVIDIA device the
# look for CUDA can only fail, and the failure is remembered: it is made here, quietly,
# once. (With one, CUDA must not be initialised before a fork: each process looks itself.)
if not os.path.exists("/dev/nvidiactl"):
    with _quiet_stderr():
        tf.config.list_physical_devices("GPU")

import lowlevel.estimator  # noqa: E402,F401
import lowlevel.ops.supervisor  # noqa: E402,F401
import lowlevel.runtime.schedules  # noqa: E402,F401
# and what a trainer's task imports after them, as the launcher preloads it
from lowlevel.ops.forking import TRAINER_MODULES  # noqa: E402

for _name in TRAINER_MODULES:
    __import__(_name)
# last: what is loaded by now stays out of every forked process's collections
from lowlevel.ops.forking import freeze_heap  # noqa: E402

freeze_heap()
