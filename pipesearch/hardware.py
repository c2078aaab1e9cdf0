"""Load device and cluster specs from the hardware catalog (TOML files).

The file format is described in ``hardware/README.md`` and ``docs/formats.md``.
Files carry their units in their key names (``memory_GiB``, ``bandwidth_GBps``,
``latency_us``); everything returned here is SI: bytes, FLOP/s, bytes/s,
seconds.

Every malformed input raises :class:`~pipesearch.errors.InputError` (an unknown
catalog name :class:`~pipesearch.errors.CatalogError`, a subclass) with a
one-line message that names the file, the key, the value and what was expected.
"""

from __future__ import annotations

import datetime
import difflib
import math
import tomllib
from pathlib import Path
from typing import Any

from . import catalog, limits
from .errors import CatalogError, InputError
from .input_files import non_regular_kind, parse_failure, read_input_bytes
from .output import short_path
from .types import Cluster, DeviceGroup, DeviceSpec, HostSpec, Link

GIB = 2**30
GB = 1e9
TERA = 1e12
MICROS_PER_S = 1e6  # us -> s by division, so 5 us is exactly 5e-06 s

#: device key -> (required, description of the expected value)
_DEVICE_KEYS = {
    "name": (True, "a string"),
    "description": (False, "a string"),
    "memory_GiB": (False, "a positive number of GiB (2**30 bytes)"),
    "memory_GB": (False, "a positive number of GB (1e9 bytes)"),
    "peak_fp16_TFLOPS": (True, "a positive number of TFLOP/s"),
    "peak_fp32_TFLOPS": (True, "a positive number of TFLOP/s"),
    "hbm_bandwidth_GBps": (True, "a positive number of GB/s"),
    "achieved_fraction": (False, "a number in [0.01, 1]"),
    "gemm_half_efficiency_size": (False, "a number >= 0 (a GEMM dimension)"),
    "peak_fp8_TFLOPS": (False, "a positive number of TFLOP/s (dense FP8 tensor peak)"),
    "tensor_accumulate": (False, '"fp16" or "fp32" (the accumulate type of peak_fp16_TFLOPS)'),
    "nvlink": (False, "true or false (whether the device has NVLink to its peers)"),
    "compute_capability": (False, "a CUDA compute capability, e.g. 8.0 (major.minor)"),
}
_CLUSTER_KEYS = ("name", "description", "nodes", "devices_per_node", "device",
                 "groups", "intra_node", "inter_node", "inter_group", "host")
#: [host] key -> description of the expected value (all required)
_HOST_KEYS = {
    "memory_GB": "a positive number of GB (1e9 bytes) of host memory per node",
    "pcie_generation": "3, 4 or 5",
    "pcie_lanes_per_gpu": "one of 1, 2, 4, 8, 16",
    "host_to_device_GBps": "a positive number of GB/s (pinned copies, one GPU alone)",
    "switch_uplink_GBps": "a positive number of GB/s (one PCIe switch's uplink)",
    "pcie_switches": "an array of arrays of node-local GPU indices that partition 0 .. devices_per_node - 1",
    "cpu_adam_params_per_s": "a positive number of parameters per second",
}
_GROUP_KEYS = ("nodes", "devices_per_node", "device")
_LINK_KEYS = ("bandwidth_GBps", "latency_us")
#: the keys of the link inside a node
_INTRA_LINK_KEYS = _LINK_KEYS + ("nvswitch",)
#: the keys of the links between nodes (``inter_node``, ``inter_group``)
_NODE_LINK_KEYS = _LINK_KEYS + ("nics_per_node",)


# --------------------------------------------------------------------------- #
# small validation helpers; `where` is the file, `key` a dotted key path


def _show(value: Any) -> str:
    """A value as it reads in TOML where that differs from Python (booleans;
    dates and times, as TOML writes them: ``1979-05-27``, not
    ``datetime.date(1979, 5, 27)``)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (datetime.date, datetime.time)):  # datetime.datetime is a date
        return value.isoformat()
    return repr(value)


def _fail(where: Path, key: str, value: Any, expected: str) -> InputError:
    return InputError(f"{where}: key '{key}' = {_show(value)}: expected {expected}")


def _read_toml(path: Path) -> dict[str, Any]:
    """Parse a TOML file; InputError on unreadable file or syntax error."""
    data = read_input_bytes(path, "TOML file")
    try:
        return tomllib.loads(data.decode("utf-8-sig"))  # a byte-order mark (some editors write one) is no statement
    except tomllib.TOMLDecodeError as e:
        kind = {".csv": "a layer profile (CSV)", ".json": "a JSON file", ".txt": "a text file (a PipeDream graph?)"}.get(
            path.suffix.lower())
        if kind:  # a model or plan file given as a cluster or device
            raise InputError(f"{path}: {kind}, not a TOML file (a cluster or device description, "
                             "hardware/README.md)") from None
        raise InputError(f"{path}: TOML syntax error: {e}") from None
    except UnicodeDecodeError:
        from .input_files import not_utf8

        raise InputError(not_utf8(path, "TOML file", data)) from None
    except (ValueError, RecursionError) as e:  # an integer of over 4300 digits, arrays nested too deeply
        raise InputError(f"{path}: cannot read TOML: {parse_failure(e)}") from None


def _check_keys(where: Path, table: dict, allowed, prefix: str = "") -> None:
    """Reject keys not in ``allowed`` (typo protection)."""
    for key in table:
        if key not in allowed:
            close = difflib.get_close_matches(key, list(allowed), n=1)
            hint = f"did you mean '{prefix}{close[0]}'? " if close else ""
            raise InputError(
                f"{where}: unknown key '{prefix}{key}' ({hint}allowed keys: "
                f"{', '.join(prefix + k for k in allowed)})"
            )


_EXPECTED = {
    "name": "a string", "nodes": "a positive integer", "devices_per_node": "a positive integer",
    "device": "a catalog device name or a path relative to this file",
    "intra_node": "a table with bandwidth_GBps and latency_us",
    "inter_node": "a table with bandwidth_GBps and latency_us",
    "bandwidth_GBps": "a positive number of GB/s", "latency_us": "a number of microseconds >= 0",
}


def _get(where: Path, table: dict, key: str, prefix: str = "") -> Any:
    if key not in table:
        raise InputError(f"{where}: missing key '{prefix}{key}' (expected {_EXPECTED[key]})")
    return table[key]


#: key (last part) -> (low, high, low inclusive, unit): the accepted range of every number
_RANGES = {
    "memory_GiB": (limits.MIN_DEVICE_MEMORY_BYTES / GIB, limits.MAX_BYTES / GIB, True, "GiB"),
    "memory_GB": (limits.MIN_DEVICE_MEMORY_BYTES / GB, limits.MAX_BYTES / GB, True, "GB"),
    "peak_fp16_TFLOPS": (limits.MIN_TFLOPS, limits.MAX_TFLOPS, True, "TFLOP/s"),
    "peak_fp32_TFLOPS": (limits.MIN_TFLOPS, limits.MAX_TFLOPS, True, "TFLOP/s"),
    "peak_fp8_TFLOPS": (limits.MIN_TFLOPS, limits.MAX_TFLOPS, True, "TFLOP/s"),
    "compute_capability": (1.0, 20.0, True, ""),
    "hbm_bandwidth_GBps": (limits.MIN_BANDWIDTH_GBPS, limits.MAX_BANDWIDTH_GBPS, True, "GB/s"),
    "bandwidth_GBps": (limits.MIN_BANDWIDTH_GBPS, limits.MAX_BANDWIDTH_GBPS, True, "GB/s"),
    "latency_us": (0.0, limits.MAX_LATENCY_US, True, "us"),
    "gemm_half_efficiency_size": (0.0, float(limits.MAX_COUNT), True, ""),
    "host_to_device_GBps": (limits.MIN_BANDWIDTH_GBPS, limits.MAX_BANDWIDTH_GBPS, True, "GB/s"),
    "switch_uplink_GBps": (limits.MIN_BANDWIDTH_GBPS, limits.MAX_BANDWIDTH_GBPS, True, "GB/s"),
    "cpu_adam_params_per_s": (limits.MIN_PARAMS_PER_S, limits.MAX_PARAMS_PER_S, True, "parameters/s"),
}


def _number(where: Path, key: str, value: Any, *, positive: bool = True) -> float:
    """A finite int or float in the key's range (:data:`_RANGES`, by the
    key's last part); without a listed range > 0 when ``positive``, else >= 0."""
    low, high, inclusive, unit = _RANGES.get(key.rsplit(".", 1)[-1], (0.0, math.inf, not positive, ""))
    if high == math.inf:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or (value <= 0 if positive else value < 0):
            raise _fail(where, key, value, "a finite positive number" if positive else "a finite number >= 0")
        return float(value)
    if limits.out_of_range(value, low, high, low_inclusive=inclusive):
        raise _fail(where, key, value, limits.range_text(low, high, low_inclusive=inclusive, unit=unit))
    return float(value)


def _count(where: Path, key: str, value: Any, high: int = limits.MAX_DEVICES) -> int:
    """A positive integer (not a float, not a bool) up to ``high``."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= high:
        raise _fail(where, key, value, f"a positive integer <= {high}")
    return value


def _string(where: Path, key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise _fail(where, key, value, "a string")
    return value


def _named(where: Path, value: Any) -> str:
    """A device's or cluster's ``name``: a non-empty one-line string (the
    table's heading and the plan file name them by it)."""
    name = _string(where, "name", value)
    if not name.strip() or not name.isprintable():
        raise _fail(where, "name", value, 'a non-empty one-line name, e.g. "2x8-a100-80gb"')
    return name


def _table(where: Path, key: str, value: Any) -> dict:
    if not isinstance(value, dict):
        raise _fail(where, key, value, f"a table [{key}]")
    return value


# --------------------------------------------------------------------------- #
# devices


def load_device(name_or_path: str | Path) -> DeviceSpec:
    """Load one device spec.

    Args:
        name_or_path: catalog name (``"a100-80gb"``) or path of a device TOML.

    Returns:
        A :class:`DeviceSpec` in SI units: ``memory_bytes`` (``memory_GiB`` x
        2**30 or ``memory_GB`` x 1e9), ``peak_fp16_flops`` and
        ``peak_fp32_flops`` (TFLOPS x 1e12), ``hbm_bandwidth_bytes_per_s``
        (GBps x 1e9), ``achieved_fraction`` (default 0.5), ``peak_fp8_flops``
        (``peak_fp8_TFLOPS`` x 1e12; 0 when the key is absent),
        ``compute_capability`` (None when absent).

    Raises:
        CatalogError: neither a file nor a catalog name (close names suggested).
        InputError: syntax error, missing/unknown key, wrong type, value out of
            range, or both/neither of ``memory_GiB`` and ``memory_GB``.
    """
    path = catalog.resolve("device", str(name_or_path))
    data = _read_toml(path)
    _check_keys(path, data, _DEVICE_KEYS)
    for key, (required, expected) in _DEVICE_KEYS.items():
        if required and key not in data:
            raise InputError(f"{path}: missing key '{key}' (expected {expected})")

    mem_keys = [k for k in ("memory_GiB", "memory_GB") if k in data]
    if len(mem_keys) != 1:
        got = "both" if mem_keys else "neither"
        raise InputError(
            f"{path}: give exactly one of 'memory_GiB' (2**30 bytes) and "
            f"'memory_GB' (1e9 bytes); got {got}"
        )
    mem_key = mem_keys[0]
    memory = _number(path, mem_key, data[mem_key]) * (GIB if mem_key == "memory_GiB" else GB)

    fraction = data.get("achieved_fraction", 0.5)
    if limits.out_of_range(fraction, limits.MIN_ACHIEVED_FRACTION, 1.0):
        raise _fail(path, "achieved_fraction", fraction, f"a number in [{limits.MIN_ACHIEVED_FRACTION:g}, 1] "
                    "(the share of the fp16 peak large GEMMs reach: 0.3 to 0.8 on data-centre GPUs)")

    accumulate = data.get("tensor_accumulate", "fp32")
    if accumulate not in ("fp16", "fp32"):
        raise _fail(path, "tensor_accumulate", accumulate, _DEVICE_KEYS["tensor_accumulate"][1])
    nvlink = data.get("nvlink")
    if nvlink is not None and not isinstance(nvlink, bool):
        raise _fail(path, "nvlink", nvlink, _DEVICE_KEYS["nvlink"][1])
    return DeviceSpec(
        tensor_accumulate=accumulate, nvlink=nvlink,
        name=_named(path, data["name"]),
        memory_bytes=memory,
        peak_fp16_flops=TERA * _number(path, "peak_fp16_TFLOPS", data["peak_fp16_TFLOPS"]),
        peak_fp32_flops=TERA * _number(path, "peak_fp32_TFLOPS", data["peak_fp32_TFLOPS"]),
        hbm_bandwidth_bytes_per_s=GB * _number(path, "hbm_bandwidth_GBps",
                                               data["hbm_bandwidth_GBps"]),
        achieved_fraction=float(fraction),
        description=_string(path, "description", data.get("description", "")),
        gemm_half_efficiency_size=_number(path, "gemm_half_efficiency_size",
                                          data.get("gemm_half_efficiency_size", 0.0), positive=False),
        peak_fp8_flops=TERA * _number(path, "peak_fp8_TFLOPS", data["peak_fp8_TFLOPS"])
        if "peak_fp8_TFLOPS" in data else 0.0,
        compute_capability=_number(path, "compute_capability", data["compute_capability"])
        if "compute_capability" in data else None,
    )


# --------------------------------------------------------------------------- #
# clusters


def _link(where: Path, data: dict, key: str) -> Link:
    """The ``[key]`` table as a :class:`Link` (GBps -> bytes/s, us -> s)."""
    table = _table(where, key, _get(where, data, key))
    between_nodes = key != "intra_node"
    _check_keys(where, table, _NODE_LINK_KEYS if between_nodes else _INTRA_LINK_KEYS, prefix=f"{key}.")
    prefix = f"{key}."
    bandwidth = _number(where, prefix + "bandwidth_GBps",
                        _get(where, table, "bandwidth_GBps", prefix))
    latency = _number(where, prefix + "latency_us", _get(where, table, "latency_us", prefix),
                      positive=False)
    nics = table.get("nics_per_node")
    if nics is not None and (isinstance(nics, bool) or not isinstance(nics, int) or not 1 <= nics <= limits.MAX_DEVICES):
        raise InputError(f"{where}: key '{prefix}nics_per_node' = {nics!r}: expected an integer from 1 to "
                         f"{limits.MAX_DEVICES} (the transfers a node sends at once; omit it for one NIC per device)")
    nvswitch = table.get("nvswitch", False)
    if not isinstance(nvswitch, bool):
        raise _fail(where, prefix + "nvswitch", nvswitch, "true or false (every pair of a node's devices linked "
                    "through NVSwitch at bandwidth_GBps)")
    return Link(bandwidth_bytes_per_s=bandwidth * GB, latency_s=latency / MICROS_PER_S, nics_per_node=nics,
                nvswitch=nvswitch)


#: PCIe per-lane data rate per direction, GB/s, after line coding (PCI-SIG:
#: Gen3 8 GT/s and Gen4 16 GT/s, Gen5 32 GT/s, all 128b/130b)
PCIE_LANE_GBPS = {3: 8 * 128 / 130 / 8, 4: 16 * 128 / 130 / 8, 5: 32 * 128 / 130 / 8}

#: lanes of the widest switch uplink (x16: the widest link of PCIe switches
#: and root ports in practice; PCI Express Base Specification link widths)
PCIE_MAX_UPLINK_LANES = 16


def _host(where: Path, data: dict, groups: tuple[DeviceGroup, ...]) -> HostSpec:
    """The ``[host]`` table as a :class:`HostSpec` (GB -> bytes, GBps ->
    bytes/s); ``pcie_switches`` must partition the GPUs of every node."""
    table = _table(where, "host", data["host"])
    _check_keys(where, table, _HOST_KEYS, prefix="host.")
    for key, expected in _HOST_KEYS.items():
        if key not in table:
            raise InputError(f"{where}: missing key 'host.{key}' (expected {expected})")
    gen, lanes = table["pcie_generation"], table["pcie_lanes_per_gpu"]
    if isinstance(gen, bool) or gen not in (3, 4, 5) or not isinstance(gen, int):
        raise _fail(where, "host.pcie_generation", gen, _HOST_KEYS["pcie_generation"])
    if isinstance(lanes, bool) or lanes not in (1, 2, 4, 8, 16) or not isinstance(lanes, int):
        raise _fail(where, "host.pcie_lanes_per_gpu", lanes, _HOST_KEYS["pcie_lanes_per_gpu"])
    switches = table["pcie_switches"]
    per_node = {g.devices_per_node for g in groups}
    ok = (isinstance(switches, list) and switches and len(per_node) == 1
          and all(isinstance(sw, list) and sw and all(isinstance(x, int) and not isinstance(x, bool)
                                                      for x in sw) for sw in switches))
    if ok:
        flat = sorted(x for sw in switches for x in sw)
        ok = flat == list(range(per_node.pop()))
    if not ok:
        sizes = "/".join(str(g.devices_per_node) for g in groups)
        raise _fail(where, "host.pcie_switches", switches,
                    f"{_HOST_KEYS['pcie_switches']} (devices_per_node = {sizes}; every [[groups]] entry "
                    f"must have the same devices_per_node), each GPU under exactly one switch (switches may "
                    f"hold different numbers of GPUs)")
    h2d = _number(where, "host.host_to_device_GBps", table["host_to_device_GBps"])
    link_GBps = PCIE_LANE_GBPS[gen] * lanes
    if h2d > link_GBps:
        raise _fail(where, "host.host_to_device_GBps", table["host_to_device_GBps"],
                    f"at most the PCIe Gen{gen} x{lanes} link's {link_GBps:.1f} GB/s per direction (pinned copies "
                    f"reach about 80% of it)")
    uplink_GBps = PCIE_LANE_GBPS[gen] * PCIE_MAX_UPLINK_LANES
    if _number(where, "host.switch_uplink_GBps", table["switch_uplink_GBps"]) > uplink_GBps:
        raise _fail(where, "host.switch_uplink_GBps", table["switch_uplink_GBps"],
                    f"at most a PCIe Gen{gen} x{PCIE_MAX_UPLINK_LANES} uplink's {uplink_GBps:.1f} GB/s per direction "
                    f"(pcie_generation = {gen}; a switch's uplink is at most x{PCIE_MAX_UPLINK_LANES})")
    return HostSpec(
        memory_bytes=GB * _number(where, "host.memory_GB", table["memory_GB"]),
        pcie_generation=gen, pcie_lanes_per_gpu=lanes,
        host_to_device_bytes_per_s=GB * _number(where, "host.host_to_device_GBps",
                                                table["host_to_device_GBps"]),
        switch_uplink_bytes_per_s=GB * _number(where, "host.switch_uplink_GBps",
                                               table["switch_uplink_GBps"]),
        pcie_switches=tuple(tuple(sw) for sw in switches),
        cpu_adam_params_per_s=_number(where, "host.cpu_adam_params_per_s",
                                      table["cpu_adam_params_per_s"]),
    )


def device_files(cluster_path: str | Path) -> list[tuple[str, Path]]:
    """The device TOMLs a cluster file names (``device = "x.toml"``, top level
    or in ``[[groups]]``), as ``(what, path)`` pairs, so that a command can
    refuse to write over them; empty for a catalog name or a file that does
    not parse (loading it reports why)."""
    path = Path(cluster_path)
    try:
        if not path.is_file():
            return []
        table = _read_toml(path)
    except (OSError, InputError):  # loading it says what is wrong
        return []
    groups = table.get("groups")
    refs = [table.get("device")] + [g.get("device") for g in (groups if isinstance(groups, list) else [])
                                    if isinstance(g, dict)]
    files = [device_file(path, ref) for ref in refs if isinstance(ref, str)]
    return [(f"the device file of --cluster {path.name}", f) for f in files if f is not None]


def device_file(where: Path, ref: str) -> Path | None:
    """The device TOML that ``ref`` in the file ``where`` (a cluster file,
    a profile's ``# device:`` header) names: a value with a path separator
    or ending in ``.toml``, relative to the file's directory; None for a
    catalog name."""
    if "/" in ref or "\\" in ref or ref.endswith(".toml"):
        return where.parent / Path(ref).expanduser()
    return None


def device_reference(where: Path, key: str, value: Any) -> DeviceSpec:
    """A device named under ``key`` in the file ``where`` (a cluster file, a
    profile's header).

    A value containing a path separator or ending in ``.toml`` is a path
    relative to that file's directory; anything else is a catalog name.

    Raises:
        InputError: naming ``where``, ``key`` and the value: no such file,
            not a regular file, a device file that does not read as one, an
            unknown catalog name.
    """
    ref = _string(where, key, value)
    path = device_file(where, ref)
    if path is not None:
        kind = non_regular_kind(path)
        if kind is not None:
            raise _fail(where, key, ref, f"a device file, but {path} is {kind}")
        if not path.is_file():
            raise _fail(where, key, ref, f"an existing device file (no such file: {path})")
        try:
            return load_device(path)
        except InputError as e:  # say which cluster key read it as a device
            raise InputError(f"{where}: key '{key}' = {ref!r} names a device file that does not read as one: "
                             f"{e}") from None
    try:
        return load_device(catalog.resolve("device", ref))
    except CatalogError as e:
        raise CatalogError(f"{where}: key '{key}' = {ref!r}: {e}") from None



def _check_device_names(path, groups) -> None:
    """A device name is a device type: plans, tables and exports name the
    devices by it. Two groups whose devices share a name but differ (memory,
    peak rates, ...) would be told apart nowhere, so they are refused.

    Raises:
        InputError: naming the file, the groups and the name."""
    seen: dict[str, int] = {}
    for k, g in enumerate(groups):
        first = seen.setdefault(g.device.name, k)
        if first != k and groups[first].device != g.device:
            raise InputError(f"{path}: groups[{first}] and groups[{k}] both name their device {g.device.name!r} but "
                             f"describe different devices; give each device type its own name")


def _group(where: Path, table: dict, prefix: str) -> DeviceGroup:
    _check_keys(where, table, _GROUP_KEYS, prefix=prefix)
    return DeviceGroup(
        device=device_reference(where, f"{prefix}device", _get(where, table, "device", prefix)),
        nodes=_count(where, f"{prefix}nodes", _get(where, table, "nodes", prefix)),
        devices_per_node=_count(where, f"{prefix}devices_per_node",
                                _get(where, table, "devices_per_node", prefix)),
    )


def load_cluster(name_or_path: str | Path, nodes: int | None = None) -> Cluster:
    """Load a cluster spec.

    Args:
        name_or_path: catalog name (``"2x8-a100-80gb"``) or path of a cluster TOML.
        nodes: optional node count replacing the file's ``nodes`` (homogeneous
            clusters only); the cluster's name then gets ``@<nodes>nodes``
            appended when it differs from the file.

    Returns:
        A :class:`Cluster`: one :class:`DeviceGroup` for the homogeneous form,
        one per ``[[groups]]`` entry for the heterogeneous form; links in
        bytes/s and seconds.

    Raises:
        CatalogError: unknown cluster name, or unknown device name in the file.
        InputError: syntax error, missing/unknown key, wrong type, value out of
            range, both or neither of the two forms, or ``nodes`` given for a
            heterogeneous cluster.
    """
    path = catalog.resolve("cluster", str(name_or_path))
    data = _read_toml(path)
    if "memory_GiB" in data or "memory_GB" in data or "peak_fp16_TFLOPS" in data:  # keys of a device file
        raise InputError(f"{path}: a device description (memory and peak keys), not a cluster: a cluster file "
                         f"names it as device = \"{data.get('name', path.stem)}\" with nodes and devices_per_node "
                         "(hardware/README.md)")
    _check_keys(path, data, _CLUSTER_KEYS)
    name = _named(path, _get(path, data, "name"))
    trio = [k for k in ("nodes", "devices_per_node", "device") if k in data]

    if "groups" in data:
        if trio:
            raise InputError(
                f"{path}: key '{trio[0]}' is not allowed next to [[groups]]: give either "
                f"top-level nodes/devices_per_node/device or [[groups]], not both"
            )
        if nodes is not None:
            raise InputError(
                f"{path}: a node-count override (nodes={nodes!r}) is not supported for a cluster given "
                f"as [[groups]] (which group would grow?); edit the groups' nodes instead, or write a "
                f"cluster of one device type with top-level nodes, devices_per_node and device"
            )
        raw = data["groups"]
        if not isinstance(raw, list) or not raw or not all(isinstance(g, dict) for g in raw):
            raise _fail(path, "groups", raw, "a non-empty array of tables [[groups]]")
        groups = tuple(_group(path, g, f"groups[{i}].") for i, g in enumerate(raw))
        _check_device_names(path, groups)
        if "inter_group" in data and len(groups) == 1:
            raise InputError(f"{path}: key 'inter_group' with one [[groups]] entry: there is no link between groups "
                             "(its nodes talk over inter_node); drop [inter_group] or add a group")
        inter_group = _link(path, data, "inter_group") if "inter_group" in data else None
    else:
        if not trio:
            raise InputError(
                f"{path}: missing keys 'nodes', 'devices_per_node', 'device' (homogeneous "
                f"cluster) or a [[groups]] array (heterogeneous cluster)"
            )
        if "inter_group" in data:
            raise InputError(
                f"{path}: key 'inter_group' is only allowed with [[groups]] "
                f"(a heterogeneous cluster)"
            )
        group = _group(path, {k: data[k] for k in trio}, "")
        if nodes is not None:
            if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes <= 0:
                raise InputError(
                    f"{path}: node-count override nodes={nodes!r}: expected a positive integer"
                )
            if nodes != group.nodes:
                name = f"{name}@{nodes}nodes"
                resized = f"resized to {nodes} node{'s' if nodes > 1 else ''} of this kind (--nodes {nodes})"
                data = {**data, "description": f"{data['description']}; {resized}" if isinstance(
                    data.get("description"), str) and data["description"] else resized}
            group = DeviceGroup(group.device, nodes, group.devices_per_node)
        groups = (group,)
        inter_group = None

    total = sum(g.num_devices for g in groups)
    if total > limits.MAX_DEVICES:
        shape = " + ".join(f"{g.nodes} nodes x {g.devices_per_node}" for g in groups)
        raise InputError(f"{path}: {shape} = {total} devices is more than the {limits.MAX_DEVICES} a cluster "
                         f"may hold; check 'nodes' and 'devices_per_node'"
                         + (f" (node-count override nodes={nodes})" if nodes is not None else ""))
    return Cluster(
        name=name,
        groups=groups,
        intra_node=_link(path, data, "intra_node"),
        inter_node=_link(path, data, "inter_node"),
        inter_group=inter_group,
        description=_string(path, "description", data.get("description", "")),
        host=_host(path, data, groups) if "host" in data else None,
    )


def input_name_warnings(model: str, cluster: str) -> list[str]:
    """The warnings of a command's ``--model`` and ``--cluster`` names: a
    file here read in place of a catalog entry of the same name
    (:func:`pipesearch.catalog.shadowing_note`), a cluster file named as a
    catalog cluster it differs from (:func:`catalog_name_clash`)."""
    shadowed = [(f"--{kind} {name}", catalog.shadowing_note(kind, name))
                for kind, name in (("model", model), ("cluster", cluster))]
    return [f"{option}: {note}" for option, note in shadowed if note] + [
        clash for clash in (catalog_name_clash(cluster),) if clash]


def catalog_name_clash(name_or_path: str | Path) -> str | None:
    """A warning when ``name_or_path`` is a cluster file (not the catalog's
    own) whose ``name`` is that of a catalog cluster it differs from (an
    edited copy that kept the name): its plans would carry a name, and a
    description, that another cluster has. None otherwise (a catalog name,
    the catalog's file itself, an exact copy, or a name of its own)."""
    path = catalog.resolve("cluster", str(name_or_path))
    data = _read_toml(path)
    own = catalog.list_entries("cluster").get(data.get("name"))  # the catalog's file (not one named so here)
    if own is None:
        return None
    name = data["name"]
    if own.resolve() == path.resolve() or _read_toml(own) == data:
        return None
    return (f"{short_path(path)} names itself {name!r}, the catalog cluster it differs from: its plans record "
            f"that name and description; give the file a name of its own")


# --------------------------------------------------------------------------- #
# listing and description


def list_devices() -> list[str]:
    """Catalog device names, sorted."""
    return list(catalog.list_entries("device"))


def list_clusters() -> list[str]:
    """Catalog cluster names, sorted."""
    return list(catalog.list_entries("cluster"))


def _link_dict(link: Link) -> dict[str, float]:
    out = {"bandwidth_bytes_per_s": link.bandwidth_bytes_per_s, "latency_s": link.latency_s}
    if link.nics_per_node is not None:
        out["nics_per_node"] = link.nics_per_node
    if link.nvswitch:
        out["nvswitch"] = True
    return out


def described_place(cluster: dict, device: int) -> tuple[int, int] | None:
    """``(node, index within its node)`` of a global device id from a plan
    file's ``inputs.cluster`` (:func:`describe_cluster`'s ``groups``: nodes
    numbered over the groups in order); None when the groups do not say."""
    node = 0
    for g in cluster.get("groups") or ():
        if not isinstance(g, dict):
            return None
        first, last, per, nodes = (g.get(k) for k in ("first_device", "last_device", "devices_per_node", "nodes"))
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (first, last, per, nodes)) or per < 1:
            return None
        if first <= device <= last:
            return node + (device - first) // per, (device - first) % per
        node += nodes
    return None


def describe_cluster(cluster: Cluster) -> dict[str, Any]:
    """Key figures of a cluster as plain (JSON-serialisable) data, SI units.

    Returns:
        ``name``, ``description``, ``devices`` (count), ``nodes`` (count),
        ``homogeneous``, ``device_types`` (names, in group order),
        ``memory_bytes_per_device`` (device name -> bytes), ``total_memory_bytes``,
        ``groups`` (per group: device, nodes, devices_per_node, first and last
        device id, memory_bytes, peak_fp16_flops, hbm_bandwidth_bytes_per_s
        (the optimizer step's memory), ``tensor_accumulate`` when
        it is not fp32, achieved_fraction and, when the device states it,
        compute_capability) and
        ``links`` (``intra_node``, ``inter_node`` and, for more than one
        group, ``inter_group``; each bandwidth_bytes_per_s and latency_s)
        and, when the file has a ``[host]`` table, ``host`` (its
        :class:`HostSpec` fields, SI units).
    """
    groups, first = [], 0
    for g in cluster.groups:
        groups.append({
            "device": g.device.name,
            "nodes": g.nodes,
            "devices_per_node": g.devices_per_node,
            "first_device": first,
            "last_device": first + g.num_devices - 1,
            "memory_bytes": g.device.memory_bytes,
            "peak_fp16_flops": g.device.peak_fp16_flops,
            "hbm_bandwidth_bytes_per_s": g.device.hbm_bandwidth_bytes_per_s,
            **({} if g.device.tensor_accumulate == "fp32" else {"tensor_accumulate": g.device.tensor_accumulate}),
            "achieved_fraction": g.device.achieved_fraction,
            **({} if g.device.compute_capability is None else {"compute_capability": g.device.compute_capability}),
        })
        first += g.num_devices
    links = {"intra_node": _link_dict(cluster.intra_node),
             "inter_node": _link_dict(cluster.inter_node)}
    if len(cluster.groups) > 1:
        links["inter_group"] = _link_dict(cluster.inter_group or cluster.inter_node)
    types = list(dict.fromkeys(g.device.name for g in cluster.groups))
    return {
        "name": cluster.name,
        "description": cluster.description,
        "devices": cluster.num_devices,
        "nodes": cluster.num_nodes,
        "homogeneous": cluster.is_homogeneous,
        "device_types": types,
        "memory_bytes_per_device": {g.device.name: g.device.memory_bytes for g in cluster.groups},
        "total_memory_bytes": sum(g.device.memory_bytes * g.num_devices for g in cluster.groups),
        "groups": groups,
        "links": links,
        **({"host": _host_dict(cluster.host)} if cluster.host is not None else {}),
    }


def _host_dict(host: HostSpec) -> dict[str, Any]:
    return {"memory_bytes": host.memory_bytes, "pcie_generation": host.pcie_generation,
            "pcie_lanes_per_gpu": host.pcie_lanes_per_gpu,
            "host_to_device_bytes_per_s": host.host_to_device_bytes_per_s,
            "switch_uplink_bytes_per_s": host.switch_uplink_bytes_per_s,
            "pcie_switches": [list(sw) for sw in host.pcie_switches],
            "cpu_adam_params_per_s": host.cpu_adam_params_per_s}
