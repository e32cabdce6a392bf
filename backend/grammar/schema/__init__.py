"""JSON Schema before compilation: equivalent rewrites xgrammar enforces (`rewrite`), the
keywords it cannot enforce (`warnings`), and the helpers both use (`utils`)."""
