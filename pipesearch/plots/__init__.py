"""Plots of pipesearch results (matplotlib, imported lazily inside each function)."""
