"""Speculative decoding by prompt lookup: the n-gram index of a sequence and a request's drafts
(ngram.py), and the scheduler's part, drafting before a step and verifying after it (step.py)."""
