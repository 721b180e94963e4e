"""Reporters: each turns a summary (and, for figures, the kernels table) into one output format.

Reporters never read traces or compute analysis numbers; they format what the summary holds.
"""
