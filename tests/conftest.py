import os

from hypothesis import HealthCheck, settings

# CI runs a smaller profile; `HYPOTHESIS_PROFILE=dev` (the default) explores more.
settings.register_profile("ci", max_examples=40, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=100, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
