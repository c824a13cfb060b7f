"""The cluster: its spec (jobs, tasks, roles, addresses), TF_CONFIG, and probes of its tasks. No TensorFlow."""
