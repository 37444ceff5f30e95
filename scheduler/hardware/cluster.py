"""Cluster specs: the YAML document that says which GPUs a cluster has.

The format is DESIGN.md's "Cluster spec" (an example in :func:`parse_cluster`).
Every error names the offending field (``nodes[1].devices[0].type``) and what is
allowed; nothing here raises anything but :class:`SpecError`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped, unused-ignore]

from scheduler.errors import SpecError
from scheduler.hardware.catalogue import GIB, known_types, lookup
from scheduler.hardware.fast_yaml import cyclic_gc_paused, load_yaml
from scheduler.hardware.faults import Fault, fault_from_dict
from scheduler.hardware.gpu_names import resolve_type

DEFAULT_INTRA_NODE_GBPS = 600.0
DEFAULT_INTER_NODE_GBPS = 100.0
DEFAULT_MEMORY_SCALE = 0.001


@dataclass(frozen=True, kw_only=True, slots=True)
class Device:
    """One GPU of the spec, with the memory and speed the spec or the catalogue gives it."""

    id: str
    """``NODE/INDEX``."""
    node: str
    index: int
    """Position among the node's devices."""
    type: str
    """Canonical catalogue key."""
    memory_gb: float
    peak_tflops: float
    ray_node: str | None = None
    """The Ray node that runs this simulated device when the service simulates the
    spec on an external Ray cluster (``hetsched serve --ray-address ADDR --cluster
    SPEC``): a Ray node id, IP address, node name, or a custom resource the operator
    gave that node (``ray start --resources='{"node-a": 1}'``). None: not placed by
    name (:func:`with_ray_nodes` then uses the node's own name). The embedded local
    Ray ignores it; :mod:`workers.cluster.placement` matches it against live nodes."""

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * GIB)


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeLinks:
    """One node's own links where they differ from the cluster's."""

    intra_node_gbps: float | None = None
    """Between its devices (its NVLink or PCIe), in Gbit/s; None: the cluster's."""
    inter_node_gbps: float | None = None
    """Its network card, in Gbit/s; None: the cluster's."""

    def to_dict(self) -> dict[str, float]:
        out = {"intra_node_gbps": self.intra_node_gbps, "inter_node_gbps": self.inter_node_gbps}
        return {k: v for k, v in out.items() if v is not None}


NO_OWN_LINKS = NodeLinks()


@dataclass(frozen=True, kw_only=True, slots=True)
class Links:
    intra_node_gbps: float = DEFAULT_INTRA_NODE_GBPS
    """Bandwidth between devices of one node, in Gbit/s."""
    inter_node_gbps: float = DEFAULT_INTER_NODE_GBPS
    """Bandwidth between nodes, in Gbit/s."""
    nodes: tuple[tuple[str, NodeLinks], ...] = ()
    """Nodes whose links differ (an NVLink box beside PCIe ones, a node on a slower
    network card), by name; the figures above hold for every other node."""
    _by_node: dict[str, NodeLinks] = field(init=False, repr=False, compare=False)
    slowest_within: float = field(init=False, repr=False, compare=False)
    """The slowest link inside any node: for costs that know only that two devices share
    a node, not which."""
    slowest_card: float = field(init=False, repr=False, compare=False)
    """The slowest network card: for costs that know only that devices span nodes."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_node", dict(self.nodes))
        own = [o.intra_node_gbps for _, o in self.nodes if o.intra_node_gbps is not None]
        object.__setattr__(self, "slowest_within", min(own, default=self.intra_node_gbps))
        cards = [o.inter_node_gbps for _, o in self.nodes if o.inter_node_gbps is not None]
        object.__setattr__(self, "slowest_card", min(cards, default=self.inter_node_gbps))

    def own(self, node: str) -> NodeLinks:
        """``node``'s own links (both None where it has none)."""
        return self._by_node.get(node, NO_OWN_LINKS)

    def within(self, node: str) -> float:
        """Between two devices of ``node``."""
        gbps = self.own(node).intra_node_gbps
        return self.intra_node_gbps if gbps is None else gbps

    def card(self, node: str) -> float:
        """``node``'s network card."""
        gbps = self.own(node).inter_node_gbps
        return self.inter_node_gbps if gbps is None else gbps

    def between(self, nodes: Iterable[str]) -> float:
        """The slowest hop of a ring over devices on ``nodes``: the node's own links when
        they are all on one, else the slowest network card among them."""
        distinct = set(nodes)
        if not self._by_node:
            return self.inter_node_gbps if len(distinct) > 1 else self.intra_node_gbps
        if len(distinct) == 1:
            return self.within(next(iter(distinct)))
        return min((self.card(n) for n in distinct), default=self.inter_node_gbps)

    def cluster_wide(self) -> dict[str, float]:
        """The figures for every node without its own."""
        return {"intra_node_gbps": self.intra_node_gbps, "inter_node_gbps": self.inter_node_gbps}

    def to_dict(self) -> dict[str, Any]:
        """The profile document's ``links``: ``nodes`` only where some node has its own."""
        out: dict[str, Any] = self.cluster_wide()
        if self.nodes:
            out["nodes"] = {name: own.to_dict() for name, own in self.nodes}
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class Simulation:
    memory_scale: float = DEFAULT_MEMORY_SCALE
    """Simulated capacity = memory_gb × memory_scale (GPU-sized memory on a laptop)."""
    faults: tuple[Fault, ...] = ()
    """Injected crashes, losses and slow-downs (:mod:`scheduler.hardware.faults`), in spec order."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Cluster:
    """A parsed cluster spec: its devices (``NODE/INDEX`` ids, in spec order), the
    links between them and the settings of its local simulation."""

    name: str
    devices: tuple[Device, ...]
    links: Links = field(default_factory=Links)
    simulation: Simulation = field(default_factory=Simulation)
    _by_id: dict[str, Device] = field(init=False, repr=False, compare=False)
    """``devices`` by id: callers look devices up one id at a time, thousands of them."""

    def __post_init__(self) -> None:
        # reversed: were an id given twice, the first device keeps it, as in a scan
        object.__setattr__(self, "_by_id", {d.id: d for d in reversed(self.devices)})

    @property
    def nodes(self) -> list[str]:
        return list(dict.fromkeys(d.node for d in self.devices))

    def device(self, device_id: str) -> Device:
        device = self._by_id.get(device_id)
        if device is None:
            raise SpecError(f"device: unknown id {device_id!r}; known: {', '.join(self.ids)}")
        return device

    @property
    def ids(self) -> list[str]:
        return [d.id for d in self.devices]

    def subset(self, device_ids: list[str]) -> Cluster:
        """The same cluster restricted to ``device_ids`` (ids keep their names)."""
        wanted = set(device_ids)
        for device_id in device_ids:
            self.device(device_id)
        faults = tuple(f for f in self.simulation.faults if f.device in wanted)
        return Cluster(
            name=self.name,
            devices=tuple(d for d in self.devices if d.id in wanted),
            links=self.links,
            simulation=replace(self.simulation, faults=faults),
        )


_EntryCache = dict[tuple[tuple[Any, type, Any], ...], tuple[str, int, float, float]]
"""Device entries already validated, by :func:`_entry_key`: a 16,384-device spec
repeats a few distinct entries thousands of times."""


def _check_keys(where: str, data: dict[str, Any], allowed: set[str]) -> None:
    for key in data:
        if key not in allowed:
            listed = ", ".join(sorted(allowed))
            raise SpecError(f"{where}{key}: unknown key; allowed: {listed}")


def _number(where: str, value: Any, *, minimum: float, integer: bool = False) -> float:
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(f"{where}: must be {kind} >= {minimum:g}, got {value!r}")
    if integer and not isinstance(value, int):
        raise SpecError(f"{where}: must be {kind} >= {minimum:g}, got {value!r}")
    if value < minimum or value != value:
        raise SpecError(f"{where}: must be {kind} >= {minimum:g}, got {value!r}")
    return float(value)


def _mapping(where: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        got = "nothing (an empty file or key)" if value is None else type(value).__name__
        raise SpecError(f"{where}: must be a mapping, got {got}")
    return value


def parse_cluster(data: Any) -> Cluster:
    """Validate a parsed YAML document and build the cluster it describes.

    Format (DESIGN.md, "Cluster spec")::

        name: mixed-lab
        nodes:
          - name: node-a
            ray_node: 10.0.0.5       # optional: the Ray node its devices run on (see below)
            devices:
              - type: A100-80GB      # a catalogue key, any case
                count: 2
                memory_gb: 75        # optional override of the catalogue
            links: {intra_node_gbps: 2400}   # optional: this node's own (NVLink here)
        links: {intra_node_gbps: 600, inter_node_gbps: 100}   # optional
        simulation:                                            # optional
          memory_scale: 0.001
          faults: [{device: node-a/0, at_step: 10, kind: slow, factor: 3}]

    Device ids are ``NODE/INDEX``, the index counting a node's devices in order.
    """
    top = _mapping("cluster", data)
    _check_keys("", top, {"name", "nodes", "links", "simulation"})
    name = top.get("name", "cluster")
    if not isinstance(name, str) or not name.strip():
        raise SpecError(f"name: must be a non-empty string, got {name!r}")
    nodes = top.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise SpecError("nodes: must be a non-empty list of nodes")
    devices: list[Device] = []
    seen_nodes: set[str] = set()
    entries: _EntryCache = {}
    own_links: list[tuple[str, NodeLinks]] = []
    for i, raw_node in enumerate(nodes):
        devices += _node_devices(f"nodes[{i}]", raw_node, seen_nodes, entries)
        if "links" in raw_node:
            own_links.append((raw_node["name"], _node_links(f"nodes[{i}]", raw_node["links"])))
    links = _links(_mapping("links", top["links"])) if "links" in top else Links()
    if own_links:
        links = replace(links, nodes=tuple(own_links))
    simulation = Simulation()
    if "simulation" in top:
        ids = dict.fromkeys(d.id for d in devices)  # spec order, and a set's membership test
        simulation = _simulation(_mapping("simulation", top["simulation"]), ids)
    return Cluster(name=name, devices=tuple(devices), links=links, simulation=simulation)


def _node_devices(
    where: str, raw_node: Any, seen_nodes: set[str], entries: _EntryCache
) -> list[Device]:
    """The devices of one ``nodes[i]`` entry, numbered in order; adds its name to
    ``seen_nodes``, and each device entry it validates to ``entries``."""
    node = _mapping(where, raw_node)
    _check_keys(f"{where}.", node, {"name", "devices", "ray_node", "links"})
    node_name = node.get("name")
    if not isinstance(node_name, str) or not node_name.strip() or "/" in node_name:
        raise SpecError(f"{where}.name: must be a non-empty string without '/'")
    if node_name in seen_nodes:
        raise SpecError(f"{where}.name: duplicate node name {node_name!r}")
    seen_nodes.add(node_name)
    ray_node = node.get("ray_node")
    if ray_node is not None and (not isinstance(ray_node, str) or not ray_node.strip()):
        raise SpecError(
            f"{where}.ray_node: must be a Ray node id, IP address, node name or "
            f"custom resource name, got {ray_node!r}"
        )
    raw_entries = node.get("devices")
    if not isinstance(raw_entries, list) or not raw_entries:
        raise SpecError(f"{where}.devices: must be a non-empty list")
    ray_node = ray_node.strip() if ray_node is not None else None
    devices: list[Device] = []
    for j, raw_entry in enumerate(raw_entries):
        key = _entry_key(raw_entry)
        checked = entries.get(key) if key is not None else None
        if checked is None:
            checked = _device_entry(f"{where}.devices[{j}]", raw_entry)
            if key is not None:
                entries[key] = checked
        gpu_key, count, memory_gb, tflops = checked
        for _ in range(count):
            index = len(devices)
            devices.append(
                Device(
                    id=f"{node_name}/{index}",
                    node=node_name,
                    index=index,
                    type=gpu_key,
                    memory_gb=memory_gb,
                    peak_tflops=tflops,
                    ray_node=ray_node,
                )
            )
    return devices


def _entry_key(raw_entry: Any) -> tuple[tuple[Any, type, Any], ...] | None:
    """What makes a ``devices[j]`` entry valid or not, as a dictionary key: its keys,
    values and their types (``count: true`` is no ``count: 1``, though the two are
    equal); None for an entry that cannot be a key (not a mapping, a list value), which
    is then validated on its own. Only valid entries are stored, so each error still
    names the entry it is about."""
    if type(raw_entry) is not dict:
        return None
    key = tuple((k, type(v), v) for k, v in raw_entry.items())
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _device_entry(where: str, raw_entry: Any) -> tuple[str, int, float, float]:
    """``(catalogue key, count, memory_gb, peak TFLOP/s)`` of one ``devices[j]`` entry."""
    entry = _mapping(where, raw_entry)
    _check_keys(f"{where}.", entry, {"type", "count", "memory_gb", "tflops"})
    gpu_type = entry.get("type")
    if not isinstance(gpu_type, str):
        raise SpecError(f"{where}.type: required; known: {', '.join(known_types())}")
    memory = entry.get("memory_gb")
    if isinstance(memory, bool) or not isinstance(memory, int | float) or memory <= 0:
        memory = None  # checked below, with the other numbers
    try:
        gpu = resolve_type(gpu_type, memory_gb=memory)
    except SpecError as exc:
        raise SpecError(f"{where}.type: {exc}") from None
    count = int(_number(f"{where}.count", entry.get("count", 1), minimum=1, integer=True))
    memory_gb = gpu.memory_gb
    if "memory_gb" in entry:
        memory_gb = _number(f"{where}.memory_gb", entry["memory_gb"], minimum=0.001)
    tflops = gpu.peak_tflops
    if "tflops" in entry:
        tflops = _number(f"{where}.tflops", entry["tflops"], minimum=0.001)
    return gpu.key, count, memory_gb, tflops


def _links(raw: dict[str, Any]) -> Links:
    _check_keys("links.", raw, {"intra_node_gbps", "inter_node_gbps"})
    default = Links()
    return Links(
        intra_node_gbps=_number(
            "links.intra_node_gbps",
            raw.get("intra_node_gbps", default.intra_node_gbps),
            minimum=0.001,
        ),
        inter_node_gbps=_number(
            "links.inter_node_gbps",
            raw.get("inter_node_gbps", default.inter_node_gbps),
            minimum=0.001,
        ),
    )


def _node_links(where: str, raw: Any) -> NodeLinks:
    """A node's own ``links``: either figure, or both."""
    own = _mapping(f"{where}.links", raw)
    _check_keys(f"{where}.links.", own, {"intra_node_gbps", "inter_node_gbps"})
    if not own:
        raise SpecError(f"{where}.links: give intra_node_gbps, inter_node_gbps or both")
    figures = {
        k: _number(f"{where}.links.{k}", own[k], minimum=0.001)
        for k in ("intra_node_gbps", "inter_node_gbps")
        if k in own
    }
    return NodeLinks(**figures)


def _simulation(raw: dict[str, Any], ids: Collection[str]) -> Simulation:
    _check_keys("simulation.", raw, {"memory_scale", "faults"})
    raw_faults = raw.get("faults", [])
    if raw_faults is None:
        raw_faults = []
    if not isinstance(raw_faults, list):
        raise SpecError(f"simulation.faults: must be a list, got {type(raw_faults).__name__}")
    return Simulation(
        memory_scale=_number(
            "simulation.memory_scale",
            raw.get("memory_scale", DEFAULT_MEMORY_SCALE),
            minimum=1e-9,
        ),
        faults=tuple(
            fault_from_dict(f"simulation.faults[{i}]", f, ids) for i, f in enumerate(raw_faults)
        ),
    )


def with_faults(cluster: Cluster, faults: list[Fault] | tuple[Fault, ...]) -> Cluster:
    """``cluster`` with ``faults`` appended to its spec's (``--fault`` on the command line)."""
    ids = cluster.ids
    known = set(ids)
    for fault in faults:
        if fault.device not in known:
            raise SpecError(
                f"--fault {str(fault)!r}: unknown device {fault.device!r}; known: {', '.join(ids)}"
            )
    simulation = replace(cluster.simulation, faults=(*cluster.simulation.faults, *faults))
    return replace(cluster, simulation=simulation)


def with_ray_nodes(cluster: Cluster) -> Cluster:
    """``cluster`` with every node that names no ``ray_node`` placed by its own name.

    For an external Ray cluster: a spec node ``node-a`` then runs on the Ray node
    whose id, address, node name or custom resource is ``node-a``.
    """
    devices = tuple(
        d if d.ray_node is not None else replace(d, ray_node=d.node) for d in cluster.devices
    )
    return replace(cluster, devices=devices)


def load_cluster(path: str | Path) -> Cluster:
    """Read and validate a cluster spec file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"cluster: cannot read {path}: {exc.strerror or exc}") from exc
    with cyclic_gc_paused():
        try:
            data = load_yaml(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            raise SpecError(f"cluster: {path} is not valid YAML{where}") from exc
        return parse_cluster(data)


def cluster_to_dict(cluster: Cluster) -> dict[str, Any]:
    """The YAML document for ``cluster`` (one device entry per device)."""
    nodes: dict[str, list[dict[str, Any]]] = {}
    ray_nodes = {d.node: d.ray_node for d in cluster.devices if d.ray_node is not None}
    for d in cluster.devices:
        gpu = lookup(d.type)
        entry: dict[str, Any] = {"type": d.type, "count": 1}
        if d.memory_gb != gpu.memory_gb:
            entry["memory_gb"] = d.memory_gb
        if d.peak_tflops != gpu.peak_tflops:
            entry["tflops"] = d.peak_tflops
        nodes.setdefault(d.node, []).append(entry)
    simulation: dict[str, Any] = {"memory_scale": cluster.simulation.memory_scale}
    if cluster.simulation.faults:
        simulation["faults"] = [f.to_dict() for f in cluster.simulation.faults]
    return {
        "name": cluster.name,
        "nodes": [
            {
                "name": n,
                **({"ray_node": ray_nodes[n]} if n in ray_nodes else {}),
                "devices": devs,
                # each node's own links sit on the node
                **({"links": own} if (own := cluster.links.own(n).to_dict()) else {}),
            }
            for n, devs in nodes.items()
        ],
        "links": cluster.links.cluster_wide(),
        "simulation": simulation,
    }
