"""The host model: the QPS one serving host sustains within a latency SLA (``sdm host``).

* :mod:`sdm.host.spec`: hosts (cores, DRAM, SCM devices per tier) as presets and TOML.
* :mod:`sdm.host.profile`: request profiles from a warm replay, CPU costs measured here.
* :mod:`sdm.host.simulate`: the discrete-event simulation over a profile, the SLA search.
* :mod:`sdm.host.predict`: :func:`predict`, profile and simulation together.
* :mod:`sdm.host.replay`: :func:`replay_on_host`, a replay whose QPS at the SLA is the host's.
* :mod:`sdm.host.render`: Markdown and the latency-load PNG.
"""

from sdm.host.predict import HostResult, predict
from sdm.host.profile import RequestProfile, build_profile
from sdm.host.replay import attach_host, replay_on_host
from sdm.host.simulate import HostSimulation
from sdm.host.spec import HOST_PRESETS, HostSpec, ScmSlot, resolve_host, this_machine

__all__ = ["predict", "HostResult", "build_profile", "RequestProfile", "HostSimulation", "HostSpec",
           "replay_on_host", "attach_host",
           "ScmSlot", "HOST_PRESETS", "resolve_host", "this_machine"]
