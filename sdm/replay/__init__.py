"""Running traces against hierarchies.

* :mod:`sdm.replay.live`: :func:`replay`, every request of a trace through a live store.
* :mod:`sdm.replay.sweep`: the control plane alone over policies x cache sizes x devices.
* :mod:`sdm.replay.planner`: placement from a trace profile (``sdm place``).
* :mod:`sdm.replay.requests`: requests of a trace, and its key stream.
* :mod:`sdm.replay.queueing`: latency percentiles and QPS under an SLA.
* :mod:`sdm.replay.render`: text, Markdown and PNG of results.
* :mod:`sdm.replay.demo`: ``sdm run``'s comparison of the presets.
"""
