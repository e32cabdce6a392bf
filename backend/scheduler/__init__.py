"""The scheduler: which requests run in each step and what happens around the forward. Admission,
batching, retirement and retraction (scheduler.py), the cache-aware order (policy.py), a step's
per-request work on the logits (step_results.py, sampler.py), what each step reports
(output_builder.py), the loop shared by thread and process (loop.py) and step profiles
(profiler.py)."""
