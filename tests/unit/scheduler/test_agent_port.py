"""A local Ray's node parameters (Ray's own parameters object, no Ray started): the dashboard
agent takes any free port (with Ray's fixed 52365, a second Ray on the machine made every
start-up wait ~3.3 s) and no autoscaler monitor is started."""

from __future__ import annotations

from ray._private import parameter, ray_constants

from rltrain.scheduler.cluster import _local_node_params


def test_ray_init_parameters_get_any_agent_port_and_only_within():
    default = ray_constants.DEFAULT_DASHBOARD_AGENT_LISTEN_PORT
    assert parameter.RayParams().dashboard_agent_listen_port == default
    assert parameter.RayParams().no_monitor is False
    with _local_node_params():
        params = parameter.RayParams(num_cpus=1)  # as ray.init builds it
        assert params.dashboard_agent_listen_port == 0  # Ray's "pick a free port"
        assert params.no_monitor is True  # `ray start --no-monitor`
        assert params.num_cpus == 1
        assert parameter.RayParams(dashboard_agent_listen_port=5).dashboard_agent_listen_port == 5
    assert parameter.RayParams().dashboard_agent_listen_port == default
    assert parameter.RayParams().no_monitor is False
