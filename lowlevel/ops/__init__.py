"""Operating a cluster: the launcher's supervisor, forked tasks, network isolation, task lifetime, Kubernetes manifests. No TensorFlow."""
