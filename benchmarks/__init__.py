"""plait's benchmarks: `make bench` (or `python -m benchmarks.<name>`)."""
