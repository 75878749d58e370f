"""Similarity: what a task says and computes (score), the reference benchmark it is
compared with (reference), and the accept rule against the reference and between samples
(decontaminate)."""
