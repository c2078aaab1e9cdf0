"""pipesearch: exact search for pipeline-parallel training plans.

Give it a model's layer costs, a cluster and a job; get back a ranked list of
plans (stage splits, device mapping, micro-batching, schedule) with predicted
iteration time and memory. See README.md.
"""

__version__ = "0.1.0"
