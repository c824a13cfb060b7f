"""lowlevel: between-graph replication for TensorFlow's tf.compat.v1 API (ps/worker clusters).

Entry points: `trainer` (one task), `launch` (a localhost cluster), `predict` (score an
export), `tf_configs` (TF_CONFIG and Kubernetes manifests), `python -m lowlevel SCRIPT.py`
(your own TF1 program or Estimator script, unmodified); `train` is `tf.compat.v1.train`
on lowlevel's runtime, as a library. The layout: README.md.
"""
