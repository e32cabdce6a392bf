"""The engine: `Engine` (engine.py), the facade that programs, the server and the benchmarks
use, and what it runs on. The tokenizer manager turns requests into token ids and results
(tokenizer_manager.py); the runtime runs the scheduler and the detokenizer either on threads of
this process (inprocess.py) or as child processes over ZMQ (multiprocess.py, processes.py)."""
