"""Reference trainers and (soon) the throughput benchmark; run modules with `python -m benchmarks.<name>`."""
