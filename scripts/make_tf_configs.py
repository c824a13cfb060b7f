#!/usr/bin/env python3
"""Prints TF_CONFIG and trainer flags for every task of a cluster (see lowlevel/tf_configs.py).

    scripts/make_tf_configs.py --chief=h0:2222 --workers=h1:2222,h2:2222 --ps=h3:2222 --sync

Installed as `lowlevel-make-tf-configs`; this file runs it from a clone.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lowlevel import tf_configs  # noqa: E402

if __name__ == "__main__":
    tf_configs.run()
