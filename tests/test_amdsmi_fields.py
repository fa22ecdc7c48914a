"""AMD SMI's power reading, in the fields each release documents: the dict ``amdsmi_get_power_info`` returns has
the keys of ROCm/amdsmi's ``py-interface/amdsmi_interface.py`` at tags rocm-5.7.0 and rocm-6.0.0 to 6.2.x
(whose Python layer writes 0xFFFF as "N/A"), and from ROCm 7.0 the ``socket_power`` field of
``amdsmi_power_info_t`` (rocm.docs.amd.com, amdsmi docs-7.0.0 and 7.1.x; in docs-6.4.1 a VM host's field, in
microwatts). No amdsmi runs on this machine: the numbers are of the kind an MI250X GCD and an MI300X show."""

import pytest

from course_utils.observe.monitor.backends import amd_power

UINT32_MAX, UINT64_MAX = 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF


@pytest.mark.parametrize(("release", "power", "expected"), [
    ("5.7, MI250X", {"average_socket_power": 287, "gfx_voltage": 818, "soc_voltage": 918, "mem_voltage": 1250,
                     "power_limit": 560}, (287.0, 560.0)),
    ("6.0, MI250X: no current power on MI200", {"current_socket_power": UINT32_MAX, "average_socket_power": 301,
                                                 "gfx_voltage": 818, "soc_voltage": 918, "mem_voltage": 1250,
                                                 "power_limit": 560}, (301.0, 560.0)),
    ("6.2, MI250X, N/A written out", {"current_socket_power": "N/A", "average_socket_power": 296,
                                      "gfx_voltage": 818, "soc_voltage": 918, "mem_voltage": 1250,
                                      "power_limit": 560}, (296.0, 560.0)),
    ("6.2, MI300X", {"current_socket_power": 612, "average_socket_power": "N/A", "gfx_voltage": "N/A",
                     "soc_voltage": "N/A", "mem_voltage": "N/A", "power_limit": 750}, (612.0, 750.0)),
    ("6.4 on bare metal: socket_power is a VM host's", {"socket_power": UINT64_MAX, "current_socket_power": 598,
                                                        "average_socket_power": "N/A", "power_limit": 750},
     (598.0, 750.0)),
    ("7.x, MI300X: socket_power", {"socket_power": 640, "current_socket_power": UINT32_MAX,
                                   "average_socket_power": UINT32_MAX, "gfx_voltage": UINT64_MAX,
                                   "power_limit": 750}, (640.0, 750.0)),
    ("7.x, MI250X: socket_power, limit in microwatts", {"socket_power": 305, "current_socket_power": UINT32_MAX,
                                                        "average_socket_power": 305, "power_limit": 560_000_000},
     (305.0, 560.0)),
    ("a VM host: socket_power in microwatts", {"socket_power": 455_000_000, "power_limit": 750}, (455.0, 750.0)),
    ("no power at all", {}, (None, None)),
])
def test_the_power_drawn_is_read_from_the_fields_each_release_fills(release, power, expected):
    assert amd_power(power) == expected, release
