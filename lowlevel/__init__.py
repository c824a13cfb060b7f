"""lowlevel: between-graph replication for TensorFlow's tf.compat.v1 API (ps/worker clusters).

Entry points: `trainer` (one task), `launch` (a localhost cluster), `predict` (score an
export), `tf_configs` (TF_CONFIG and Kubernetes manifests). The layout: README.md.
"""
