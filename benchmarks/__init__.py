"""The throughput benchmark and its reference trainers: `python -m benchmarks.<name>`."""
