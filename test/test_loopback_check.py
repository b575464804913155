"""The check behind the ros2_env fixture refuses every setting that would let DDS leave the machine
(support.check_loopback_only)."""

from __future__ import annotations

import pytest
from support import check_loopback_only

PROFILE = """<?xml version="1.0" encoding="UTF-8"?>
<dds xmlns="http://www.eprosima.com/XMLSchemas/fastRTPS_Profiles"><profiles>
  <transport_descriptors><transport_descriptor><transport_id>udp</transport_id><type>UDPv4</type>
    {whitelist}</transport_descriptor></transport_descriptors>
  <participant profile_name="p" is_default_profile="true"><rtps>
    <useBuiltinTransports>{builtin}</useBuiltinTransports>
    <builtin><initialPeersList><locator><udpv4><address>{peer}</address></udpv4></locator></initialPeersList>
    {multicast}</builtin>
  </rtps></participant>
</profiles></dds>"""
LOOPBACK = dict(whitelist="<interfaceWhiteList><address>127.0.0.1</address></interfaceWhiteList>", builtin="false",
                peer="127.0.0.1", multicast="")


def env_with(tmp_path, **changes) -> dict:
    fields = {**LOOPBACK, **{k: v for k, v in changes.items() if k in LOOPBACK}}
    profile = tmp_path / "profile.xml"
    profile.write_text(PROFILE.format(**fields))
    env = {"ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST", "FASTRTPS_DEFAULT_PROFILES_FILE": str(profile),
           "RMW_IMPLEMENTATION": "rmw_fastrtps_cpp"}
    env.update({k: v for k, v in changes.items() if k not in LOOPBACK})
    return env


def test_a_loopback_profile_passes(tmp_path):
    check_loopback_only(env_with(tmp_path))


@pytest.mark.parametrize("changes, reason", [
    ({"ROS_AUTOMATIC_DISCOVERY_RANGE": "SUBNET"}, "not LOCALHOST"),
    ({"RMW_IMPLEMENTATION": "rmw_cyclonedds_cpp"}, "the loopback profile is Fast DDS's"),
    ({"ROS_STATIC_PEERS": "192.168.1.7"}, "names other hosts"),
    ({"FASTRTPS_DEFAULT_PROFILES_FILE": "/no/such/profile.xml"}, "is not a file"),
    ({"peer": "10.0.0.5"}, "an address other than 127.0.0.1"),
    ({"builtin": "true"}, "builtin transports are not off"),
    ({"whitelist": ""}, "without an interface whitelist"),
    ({"multicast": "<metatrafficMulticastLocatorList/>"}, "a multicast setting"),
])
def test_anything_off_loopback_is_refused(tmp_path, changes, reason):
    with pytest.raises(pytest.fail.Exception, match=reason):
        check_loopback_only(env_with(tmp_path, **changes))
