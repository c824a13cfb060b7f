"""`WarmStartSettings`, `VocabInfo` and warm-starting (tf.estimator's names for them).

The settings and their application live in the models layer
(`lowlevel.models.warm_start`) so that lowlevel's runtime applies them in
the graphs it builds; this module is the entry point's view of them.
"""

from __future__ import annotations

import tensorflow as tf

from lowlevel.models.warm_start import WarmStartSettings, default_settings, warm_start

VocabInfo = tf.compat.v1.train.VocabInfo

__all__ = ["WarmStartSettings", "VocabInfo", "default_settings", "warm_start"]
