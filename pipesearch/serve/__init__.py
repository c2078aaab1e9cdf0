"""Serving plans: tensor- and pipeline-parallel LLM inference.

``dtypes`` (weight and KV-cache element sizes), ``engine`` (what an inference
engine reserves and how it splits layers by default), ``costs`` (per-stage
weights, KV capacity, prefill / decode step times), ``split`` (the exact
layer split that maximises throughput under the KV pool), ``search``
(tp x pp x replicas, ranked plans), ``simulate`` (a discrete-event
simulation of requests with continuous batching), ``export`` (vLLM and SGLang
command lines). Formulas and their sources: ``docs/serving_costs.md``.
"""
