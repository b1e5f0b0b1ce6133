"""A local Ray's dashboard agent takes any free port (Ray's own parameters object, no Ray
started): with Ray's fixed 52365, a second Ray on the machine made every start-up wait ~3.3 s."""

from __future__ import annotations

from ray._private import parameter, ray_constants

from rltrain.scheduler.cluster import _any_agent_port


def test_ray_init_parameters_get_any_agent_port_and_only_within():
    default = ray_constants.DEFAULT_DASHBOARD_AGENT_LISTEN_PORT
    assert parameter.RayParams().dashboard_agent_listen_port == default
    with _any_agent_port():
        params = parameter.RayParams(num_cpus=1)  # as ray.init builds it
        assert params.dashboard_agent_listen_port == 0  # Ray's "pick a free port"
        assert params.num_cpus == 1
        assert parameter.RayParams(dashboard_agent_listen_port=5).dashboard_agent_listen_port == 5
    assert parameter.RayParams().dashboard_agent_listen_port == default
