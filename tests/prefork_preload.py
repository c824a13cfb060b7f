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

from absl import app

from lowlevel.tf_import import import_quietly

import_quietly()
# `import tensorflow` registers an absl init callback (tensorflow/python/distribute/
# combinations.py: `_set_total_phsyical_gpus`) that lists the GPUs, which calls cuInit,
# when the process's `absl.app.run` starts. A cold trainer or launcher imports TensorFlow
# after that point, so it never runs there; dropped here for the same reason (it would
# also initialise CUDA in a launcher about to fork its tasks).
app._init_callbacks.clear()

import lowlevel.estimator  # noqa: E402,F401
import lowlevel.ops.supervisor  # noqa: E402,F401
import lowlevel.runtime.schedules  # noqa: E402,F401
