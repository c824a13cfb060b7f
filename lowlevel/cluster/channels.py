"""The gRPC channels between a cluster's tasks: keepalive and reconnection, set before TensorFlow.

TensorFlow reads channel arguments from the environment variable
`TF_GRPC_DEFAULT_OPTIONS` when it makes its first channel, so `use_channel_options`
must run before the task's server or first session.
"""

from __future__ import annotations

import os
from typing import MutableMapping, Optional

# gRPC keepalive on the channels between tasks (a value the user sets wins). After a
# partition longer than ~30 s, a connection whose other end has given up is
# otherwise found dead only at the next TCP retransmission, which Linux's
# exponential backoff can put a minute or more after the heal: every run times
# out meanwhile. A ping unanswered for 5 s (sent while a call waits, at most
# every 10 s) closes it, and gRPC reconnects at once. A channel that cannot
# connect retries with exponential backoff (1 s x 1.6 per attempt, up to 120 s):
# after a 60 s partition its next attempt could come 20 s after the heal (a test
# measured 22 s); capped at 5 s, training resumes within seconds. And each attempt
# waits at least gRPC's minimum connect timeout (20 s, grpc/doc/connection-backoff.md)
# for its SYN to be answered: one begun during the partition could hold the channel
# until 20 s after the heal (a test measured 22.3 s with the cap); 5 s here too.
GRPC_KEEPALIVE = ("grpc.keepalive_time_ms=10000,grpc.keepalive_timeout_ms=5000,"
                  "grpc.max_reconnect_backoff_ms=5000,grpc.min_reconnect_backoff_ms=5000")


def use_channel_options(env: Optional[MutableMapping[str, str]] = None) -> None:
    """Sets `TF_GRPC_DEFAULT_OPTIONS` to `GRPC_KEEPALIVE` in `env` (default `os.environ`)
    unless the user has set it. Effective only before TensorFlow makes its first channel."""
    env = os.environ if env is None else env
    env.setdefault("TF_GRPC_DEFAULT_OPTIONS", GRPC_KEEPALIVE)
