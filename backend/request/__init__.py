"""A request from the edge to the scheduler: its sampling parameters, each field's type, range
and names defined once (sampling_params.py); the limits on constraint sizes (limits.py); the checks
every request passes, naming the field (checks.py); stop strings and regexes
(stop_conditions.py); one running sequence (req.py); and the typed messages between processes
(messages.py)."""
