"""Models of a user's own, written as TF1 Estimator code: what `--model=package.module:function` runs."""
