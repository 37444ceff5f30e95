"""What routes and the executor share: the cluster connection, spec checks, profiling."""

from __future__ import annotations

import hashlib
import json
import logging
import socket
import tarfile
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from api.core.local_ray import LocalRaySession
from api.core.settings import Settings
from api.schemas.plans import ModelDims
from api.store import JobStore, ProfileRecord
from scheduler.cost.profile import Profile, analytic_profile, profile_from_dict
from scheduler.errors import HetschedError, PlanError
from scheduler.hardware.capacity import usable_capacity_bytes
from scheduler.hardware.cluster import Cluster, load_cluster, with_ray_nodes
from scheduler.hardware.precision import JobPrecision
from scheduler.models.hf_config import is_path_ref, load_hf_config
from scheduler.models.presets import ModelPreset, get_preset, preset_to_dict
from scheduler.planning.plan import Plan
from scheduler.planning.planner import make_plan
from scheduler.units import format_bytes
from workers.data.datafile import DEFAULT_CORPUS, inspect_dataset

if TYPE_CHECKING:  # torch loads with the workers, not with the routes
    from workers.checkpoint import OpenCheckpoint

log = logging.getLogger("hetsched.api")
DATASET_SUFFIXES = (".txt", ".bin")


class ClusterUnavailable(HetschedError):
    """The request needs the cluster, which cannot be reached (HTTP 409)."""


class NotOnServer(HetschedError):
    """A well-formed request names what this server does not have now: a device id its
    cluster lacks, a dataset file missing from its data directory (HTTP 409)."""


@dataclass(kw_only=True, slots=True)
class ClusterHandle:
    """Owns the service's connection to its devices, built once in the app's lifespan.

    A local Ray running a simulated cluster spec (the embedded default), or an
    existing Ray cluster (``--ray-address``) whose GPUs become the cluster, or which
    runs a simulated spec's devices on the Ray nodes the spec names (``--ray-address``
    with ``--cluster``). When Ray cannot be reached the service still starts and
    reports the cluster unavailable; ``hetsched serve`` checks first
    (:func:`check_external_ray`) and refuses to start with one line instead.
    """

    cluster: Cluster | None
    available: bool
    message: str = ""
    simulated: bool = True
    ray_address: str | None = None
    pool: Any = None
    """The warm workers (:class:`workers.cluster.pool.WorkerPool`) when the cluster is available."""
    local_ray: LocalRaySession | None = None
    """Set when this service started the local Ray: it stops it when it stops."""
    closing: bool = False
    """Set by :meth:`close`: workers lost from then on were stopped, not broken."""

    def warm(self) -> None:
        """Start every device's worker now, so the first job starts warm (errors logged)."""
        if self.pool is None:
            return
        try:
            self.pool.warm()
        except Exception as exc:  # a job will report the device; the service goes on
            if self.closing:  # stopped mid-warm-up (SIGTERM during startup): not a fault
                log.info("warm-up cut short: the service is stopping")
                return
            log.warning("could not warm the device workers: %s", _one_line(exc))

    def close(self) -> None:
        """Stop the warm workers, then the local Ray this service started, if any."""
        self.closing = True
        if self.pool is not None:
            self.pool.shutdown()
        if self.local_ray is not None:
            self.local_ray.stop()


def connect_cluster(settings: Settings) -> ClusterHandle:
    """Attach to Ray as ``settings`` say; never raises for an unreachable cluster."""
    if settings.ray_address:
        return _connect_external(settings, settings.ray_address)
    try:
        cluster = load_cluster(settings.cluster_file)
    except HetschedError as exc:
        return ClusterHandle(cluster=None, available=False, message=str(exc))
    if not settings.start_ray:
        return ClusterHandle(
            cluster=cluster,
            available=False,
            message="local Ray not started (HETSCHED_START_RAY=false)",
        )
    session = LocalRaySession(settings.data_dir)
    session.reap_predecessor()
    try:
        from workers.session import WorkerPool, start_local_ray

        started = start_local_ray(cluster, num_cpus=settings.ray_num_cpus)
    except Exception as exc:
        return ClusterHandle(
            cluster=cluster, available=False, message=f"cannot start local Ray: {_one_line(exc)}"
        )
    pool = WorkerPool(cluster, simulated=True)
    if not started:  # Ray was already up in this process (a test's): not ours to stop
        return ClusterHandle(cluster=cluster, available=True, pool=pool)
    session.record()
    return ClusterHandle(cluster=cluster, available=True, local_ray=session, pool=pool)


def _connect_external(settings: Settings, address: str) -> ClusterHandle:
    """An external Ray cluster: its GPUs, or with a cluster spec, simulated devices
    placed on the Ray nodes the spec names (``workers.cluster.placement``)."""
    simulated = settings.cluster is not None

    def unavailable(message: str) -> ClusterHandle:
        return ClusterHandle(
            cluster=None,
            available=False,
            simulated=simulated,
            ray_address=address,
            message=message,
        )

    unreachable = _probe(address)
    if unreachable:
        return unavailable(f"cannot connect to Ray at {address}: {unreachable}")
    try:
        from workers.cluster.placement import check_placement, live_nodes
        from workers.cluster.ray_connect import connect
        from workers.session import WorkerPool, connect_ray

        if settings.cluster is not None:
            connect(address)
            cluster = with_ray_nodes(load_cluster(settings.cluster))
            check_placement(cluster, live_nodes(), simulated=True)
        else:
            cluster = connect_ray(address)
        pool = WorkerPool(cluster, simulated=simulated)
    except HetschedError as exc:  # already one line: a token, a spec, a missing node
        return unavailable(str(exc))
    except Exception as exc:  # Ray raises many types for an unreachable head
        return unavailable(f"cannot connect to Ray at {address}: {_one_line(exc)}")
    return ClusterHandle(
        cluster=cluster, available=True, simulated=simulated, ray_address=address, pool=pool
    )


def check_external_ray(settings: Settings) -> None:
    """Before ``hetsched serve`` starts: the Ray cluster at ``--ray-address`` can be
    reached, accepts this process's token and, with ``--cluster``, has every Ray node
    the spec names; else one line saying what is missing (:class:`HetschedError`)."""
    address = settings.ray_address
    if not address:
        return
    unreachable = _probe(address)
    if unreachable:
        raise HetschedError(f"--ray-address: cannot connect to Ray at {address}: {unreachable}")
    cluster = None
    if settings.cluster is not None:
        cluster = with_ray_nodes(load_cluster(settings.cluster))
    from workers.cluster.placement import check_placement, nodes_from_gcs
    from workers.cluster.ray_connect import check_auth, gcs_address

    check_auth(address)
    gcs = gcs_address(address)
    if cluster is not None and gcs is not None:
        check_placement(cluster, nodes_from_gcs(gcs), simulated=True)


def _probe(address: str, timeout_s: float = 5.0) -> str | None:
    """Why a ``host:port`` Ray address is unreachable, or None (``ray.init`` would retry
    an unreachable head for minutes before failing)."""
    rest = address.split("://", 1)[-1]
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        return None  # "auto" and other forms: let Ray resolve them
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return None
    except OSError as exc:
        return exc.strerror or type(exc).__name__


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


# --- checking a spec against this server ---------------------------------------


def model_from_ref(
    ref: str | ModelDims | dict[str, Any], *, data_dir: Path | None = None
) -> ModelPreset:
    """A preset name, explicit dimensions, or a Hugging Face ``config.json`` / model
    directory inside the server's data directory (never outside it)."""
    if isinstance(ref, dict):
        ref = ModelDims.model_validate(ref)
    if isinstance(ref, str):
        if not is_path_ref(ref):
            return get_preset(ref)
        if data_dir is None:
            raise HetschedError(
                f"model: {ref!r} is a path; this server reads model configs only from "
                "its data directory"
            )
        name = ref.removeprefix("hf:")
        try:
            return load_hf_config(inside_data_dir(data_dir, name, what="model"))
        except HetschedError:
            raise
        except (OSError, ValueError) as exc:  # a NUL byte, a name the file system refuses
            raise HetschedError(f"model: {name[:60]!r} is not a usable file name") from exc
    return ModelPreset(**ref.model_dump())


def inside_data_dir(data_dir: Path, name: str, *, what: str) -> Path:
    """``name`` resolved inside the data directory; anything reaching outside is refused."""
    root = data_dir.resolve()
    path = (root / name).resolve()
    if not path.is_relative_to(root) or path == root:
        raise HetschedError(
            f"{what}: {name!r} is outside the server's data directory; give a name inside it"
        )
    return path


def model_key(model: ModelPreset) -> str:
    """Names a model uniquely (every field of its description) for cache keys."""
    digest = hashlib.sha256(json.dumps(preset_to_dict(model), sort_keys=True).encode())
    return f"{model.name}:{model.family}:{digest.hexdigest()[:16]}"


def check_devices(handle: ClusterHandle, device_ids: list[str] | None) -> list[str]:
    """The devices a job asks for (all when ``None``); unknown ids name the known ones."""
    if handle.cluster is None:
        if device_ids:
            raise ClusterUnavailable(f"devices: the cluster is unavailable ({handle.message})")
        return []
    known = handle.cluster.ids
    if device_ids is None:
        return known
    if not device_ids:
        raise HetschedError("devices: must list at least one device id, or be omitted for all")
    if len(set(device_ids)) != len(device_ids):
        raise HetschedError("devices: lists a device twice")
    for device_id in device_ids:
        if device_id not in known:
            raise NotOnServer(f"devices: unknown id {device_id!r}; known: {', '.join(known)}")
    return [d for d in known if d in set(device_ids)]


def resolve_dataset(
    data_dir: Path,
    name: str,
    *,
    seq_len: int,
    vocab_size: int | None = None,
    global_batch: int | None = None,
) -> Path | None:
    """``default`` (the bundled corpus, ``None``) or a dataset file inside the data
    directory, nowhere else, checked against the model and the global batch when given
    (workers/data/datafile.py: sidecar, size, vocabulary, one global batch) before any worker
    starts."""
    path = DEFAULT_CORPUS if name == "default" else inside_data_dir(data_dir, name, what="dataset")
    if not path.is_file() or not is_dataset_name(path.name):
        known = ", ".join(list_datasets(data_dir))
        raise NotOnServer(
            f"dataset: no file {name!r} in the server's data directory {data_dir.resolve()}; "
            f"give one of: {known}"
        )
    try:
        inspect_dataset(path, seq_len=seq_len, vocab_size=vocab_size, global_batch=global_batch)
    except HetschedError as exc:  # the request is well formed; the server's file does not fit it
        raise NotOnServer(str(exc)) from exc
    return None if name == "default" else path


def is_dataset_name(name: str) -> bool:
    """Text files and token files are datasets; sidecars and tokenizers go with them."""
    return name.endswith(DATASET_SUFFIXES)


def list_datasets(data_dir: Path) -> list[str]:
    """``default`` and every dataset file under the data directory, by relative name."""
    root = data_dir.resolve()
    names = ["default"]
    if root.is_dir():
        names += sorted(
            str(p.relative_to(root))
            for p in root.rglob("*")
            if p.is_file() and is_dataset_name(p.name) and not p.name.startswith(".")
        )
    return names


def check_simulated_fit(cluster: Cluster, model: ModelPreset, device_ids: list[str]) -> None:
    """Refuse, before any actor builds it, a model whose states fit no simulated device.

    Simulated capacity is :func:`scheduler.hardware.capacity.usable_capacity_bytes`; the
    model states are 16 bytes per parameter (weights, gradients, AdamW moments).
    """
    reasons = []
    for device_id in device_ids:
        device = cluster.device(device_id)
        capacity = usable_capacity_bytes(
            device.memory_bytes, simulated=True, memory_scale=cluster.simulation.memory_scale
        )
        if model.model_state_bytes <= capacity:
            return
        reasons.append(
            f"{device_id}: model states {format_bytes(model.model_state_bytes)} "
            f"exceed simulated capacity {format_bytes(capacity)}"
        )
    more = f" (and {len(reasons) - 3} more)" if len(reasons) > 3 else ""
    raise PlanError(f"no device can hold the model: {'; '.join(reasons[:3])}{more}")


# --- profiling ------------------------------------------------------------------


class Profiler:
    """Measures profiles one at a time (two measurements would disturb each other).

    ``workers.session.profile_cluster`` measures (cached on disk per device type and
    model); every measurement is also recorded in the job store, so ``GET /profiles``
    and the dashboard show it.
    """

    def __init__(self, *, store: JobStore, handle: ClusterHandle, cache_dir: Path) -> None:
        self.store = store
        self.handle = handle
        self.cache_dir = cache_dir
        self._lock = threading.Lock()
        self._background: threading.Thread | None = None
        self._background_lock = threading.Lock()  # not _lock: a measurement holds that

    def measure_soon(self, model: ModelPreset, device_ids: list[str]) -> None:
        """Measure in a background thread, unless one is measuring already: what a dry
        run asks for, so that it answers at once and the next one is measured."""
        with self._background_lock:
            if self._background is not None and self._background.is_alive():
                return
            self._background = threading.Thread(
                target=self._measure_logged, args=(model, device_ids), daemon=True
            )
            self._background.start()

    def _measure_logged(self, model: ModelPreset, device_ids: list[str]) -> None:
        try:
            self.measure(model, device_ids)
        except Exception as exc:  # a background thread has no caller to tell
            log.warning("measuring %s on %d devices failed: %s", model.name, len(device_ids), exc)

    def measure(
        self, model: ModelPreset, device_ids: list[str], *, refresh: bool = False
    ) -> Profile:
        return self.measure_record(model, device_ids, refresh=refresh)[0]

    def measure_record(
        self, model: ModelPreset, device_ids: list[str], *, refresh: bool = False
    ) -> tuple[Profile, ProfileRecord]:
        """Measure (or read the workers' cache) and record the result in the store."""
        cluster = self.handle.cluster
        if cluster is None or not self.handle.available:
            raise ClusterUnavailable(f"cluster: unavailable ({self.handle.message})")
        if self.handle.simulated:
            check_simulated_fit(cluster, model, device_ids)
        from workers.session import profile_cluster

        self.cache_dir.mkdir(parents=True, exist_ok=True)
        with self._lock:
            profile = profile_cluster(
                cluster,
                model,
                device_ids=device_ids,
                cache_dir=self.cache_dir,
                refresh=refresh,
                simulated=self.handle.simulated,
                pool=self.handle.pool,
            )
        record = self.store.save_profile(
            key=self._key(model, device_ids),
            model=model.name,
            cluster=cluster.name,
            source=profile.source,
            profile=profile.to_dict(),
        )
        return profile, record

    def _key(self, model: ModelPreset, device_ids: list[str]) -> str:
        name = self.handle.cluster.name if self.handle.cluster else "?"
        return f"{name}|{model_key(model)}|{','.join(sorted(device_ids))}"[:400]

    def stored(self, model: ModelPreset, device_ids: list[str]) -> Profile | None:
        """A stored measurement of this model covering ``device_ids``, if any."""
        cluster = self.handle.cluster
        if cluster is None:
            return None
        wanted = set(device_ids)
        for record in self.store.profiles():
            if record.cluster != cluster.name or record.model != model.name:
                continue
            try:
                profile = profile_from_dict(record.profile)
            except HetschedError:
                continue
            if wanted <= {d.id for d in profile.devices} and record.source != "analytic":
                return profile.subset(device_ids)
        return None


def dry_run(
    *,
    handle: ClusterHandle,
    profiler: Profiler,
    model: ModelPreset,
    device_ids: list[str],
    global_batch: int,
    strategy: str,
    busy: set[str],
    precision: JobPrecision = "fp32",
) -> tuple[Plan, str]:
    """Plan without training, at once: from a stored measurement, else from the catalogue,
    for a job computing in ``precision``.

    A first dry run never waits for a measurement (tens of seconds for a new model): it
    answers from the catalogue with a note and, when the devices are idle, measures them
    in the background, so asking again gives the measured plan.
    """
    cluster = handle.cluster
    if cluster is None:
        raise ClusterUnavailable(f"cluster: unavailable ({handle.message})")
    if handle.simulated:
        check_simulated_fit(cluster, model, device_ids)
    profile = profiler.stored(model, device_ids)
    if profile is not None:
        return make_plan(profile.at_precision(precision), global_batch, strategy), "measured"
    note = "predicted from the GPU catalogue: these devices have no measurement of this model"
    if handle.available and not busy & set(device_ids):
        profiler.measure_soon(model, device_ids)
        note += "; they are being measured now, ask again in a minute for a measured plan"
    profile = analytic_profile(
        cluster.subset(device_ids),
        model,
        simulated=handle.simulated,
        precision=precision,
    )
    plan = make_plan(profile, global_batch, strategy)
    return replace(plan, notes=(*plan.notes, note)), "analytic"


def stream_checkpoint(
    opened: OpenCheckpoint, name: str, chunk_bytes: int = 1 << 20
) -> Iterator[bytes]:
    """A checkpoint's files, already opened and pinned (:meth:`CheckpointStore.open_step`),
    as a .tar.gz under the folder ``name``, in pieces: a file is read ``chunk_bytes`` at a
    time, so a checkpoint of many gigabytes never sits in the service's memory. The pin
    is dropped when the stream ends or is abandoned. A file that ends early raises, so the
    connection breaks instead of passing a short archive off as whole."""
    gzip = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # 16+: a gzip header
    try:
        for path, size, source in opened.files:
            info = tarfile.TarInfo(f"{name}/{path}")
            info.size, info.mtime = size, int(time.time())
            yield gzip.compress(info.tobuf())
            sent = 0
            while block := source.read(min(chunk_bytes, size - sent)):
                sent += len(block)
                yield gzip.compress(block)
                opened.refresh()
            if sent != size:
                raise OSError(f"checkpoint file {path} ended at {sent} of {size} bytes")
            yield gzip.compress(b"\0" * (-info.size % tarfile.BLOCKSIZE))  # to a whole block
        yield gzip.compress(b"\0" * (2 * tarfile.BLOCKSIZE))  # the end-of-archive marker
        yield gzip.flush()
    finally:
        opened.close()


def plan_summary(plan: Plan) -> str:
    shares = ", ".join(f"{d.id}={d.samples}" for d in plan.devices)
    return (
        f"plan {plan.strategy}: {shares}; predicted {plan.predicted_step_s * 1e3:.1f} ms/step "
        f"({plan.predicted_samples_per_s:.1f} samples/s)"
    )
