"""Evaluation: MGSM and GSM-Symbolic items, lm-eval's prompt words and answer filters, task
records and their scorer, side-by-side scoring, and the bridge to lm-eval's own harness
(generation itself is ``inference``)."""
