"""plait serve: the HTTP server (OpenAI-compatible and SGLang-native APIs) around an Engine."""
