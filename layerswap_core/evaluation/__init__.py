"""Evaluation: MGSM and GSM-Symbolic items, lm-eval's prompt words and answer filters, batched
greedy generation and chat, side-by-side scoring, and the bridge to lm-eval's own harness."""
