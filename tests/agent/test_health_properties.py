"""Properties of the health tracker over arbitrary, well-typed observation sequences:

(a) once a GPU's verdict turns FAIL it reads PASS again only after `clean_checks_to_recover`
    samples of that GPU (reference/nvml.md §2.4: never flap back to healthy);
(b) the same observations give the same verdicts, changes and job faults, whatever order the
    devices were listed in;
(c) no observe_* call raises, whatever the readings (huge, negative, unsupported, failed);
and every verdict is well formed: sorted by UUID, the status its worst incident's, the reason
within the store's limit.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from hypothesis import given, settings, target
from hypothesis import strategies as st

from agent.gpu import (
    UNSUPPORTED,
    WHOLE_DEVICE,
    DeviceInfo,
    DeviceSample,
    EventKind,
    Fabric,
    Failed,
    GpuEvent,
    NvLinkSample,
    NvmlCode,
)
from agent.health import HealthTracker
from agent.health_model import SEVERITY
from agent.health_policy import HealthPolicy
from statemachine.commands import HealthStatus
from statemachine.limits import REASON_LENGTH_MAX
from tests.agent.samples import GPU, OTHER_GPU, clean_sample, device_info, nvlink

UUIDS = (GPU, OTHER_GPU)
DEVICES = (device_info(GPU), device_info(OTHER_GPU, index=1))
READING_FIELDS = tuple(field.name for field in fields(DeviceSample)
                       if field.name not in ("uuid", "fabric", "nvlinks"))
INTERESTING_XIDS = (13, 31, 43, 48, 63, 64, 74, 79, 92, 94, 119, 150)

readings = st.one_of(
    st.sampled_from([0, 0, 0, 1]),
    st.integers(min_value=-5, max_value=200),
    st.integers(min_value=-(1 << 64), max_value=1 << 64),
    st.just(UNSUPPORTED),
    st.builds(Failed, st.sampled_from(list(NvmlCode)), st.text(max_size=12)),
)
links = st.builds(NvLinkSample, link=st.one_of(st.integers(0, 3), st.integers()),
                  up=st.booleans(), replay_errors=readings, recovery_errors=readings,
                  crc_flit_errors=readings, crc_data_errors=readings)


@st.composite
def samples(draw: st.DrawFn) -> DeviceSample:
    """Mostly clean samples (so that incidents close), some with a few odd readings, and some
    wholly random; now and then for a GPU the tracker does not know."""
    uuid = draw(st.sampled_from((*UUIDS, *UUIDS, *UUIDS, "GPU-stranger")))
    energy_mj = draw(st.sampled_from((1_000_000, 2_000_000, 3_000_000)))  # a drop is a reset
    base = clean_sample(uuid, nvlinks=(nvlink(0), nvlink(1)), energy_mj=energy_mj)
    shape = draw(st.sampled_from(("clean", "clean", "clean", "some", "random")))
    if shape == "clean":
        return base
    if shape == "some":
        chosen = draw(st.lists(st.sampled_from(READING_FIELDS), max_size=3, unique=True))
        changes: dict[str, Any] = {name: draw(readings) for name in chosen}
        if draw(st.booleans()):
            changes["nvlinks"] = (nvlink(0, up=draw(st.booleans())), nvlink(1))
        return clean_sample(uuid, **{"nvlinks": base.nvlinks, "energy_mj": energy_mj, **changes})
    return clean_sample(uuid, fabric=draw(st.sampled_from(Fabric)),
                        nvlinks=tuple(draw(st.lists(links, max_size=4))),
                        **{name: draw(readings) for name in READING_FIELDS})


events = st.builds(
    GpuEvent, uuid=st.sampled_from((*UUIDS, "GPU-stranger")), kind=st.sampled_from(EventKind),
    xid=st.one_of(st.none(), st.sampled_from(INTERESTING_XIDS), st.integers(0, 1 << 32)),
    data=st.one_of(st.integers(0, 8), st.integers()),
    gpu_instance=st.sampled_from((WHOLE_DEVICE, 0, 1)),
    compute_instance=st.sampled_from((WHOLE_DEVICE, 0)))
device_lists = st.one_of(st.just(DEVICES), st.lists(
    st.builds(device_info, st.sampled_from(UUIDS), mig_enabled=st.booleans(),
              mig_pending=st.sampled_from((False, False, True))), max_size=2).map(tuple))
sample_operations = st.tuples(st.just("sample"), samples())
operations = st.lists(st.tuples(st.one_of(
    sample_operations, sample_operations, sample_operations, sample_operations,
    sample_operations, sample_operations, sample_operations, sample_operations,
    st.tuples(st.just("event"), events), st.tuples(st.just("event"), events),
    st.tuples(st.just("gone"), st.sampled_from((*UUIDS, "GPU-stranger")),
              st.sampled_from(list(NvmlCode)), st.text(max_size=12)),
    st.tuples(st.just("unavailable"), st.text(max_size=12)),
    st.tuples(st.just("wait_failed"), st.text(max_size=12)),
    st.tuples(st.just("wait_ok")),
    st.tuples(st.just("devices"), device_lists),
    st.tuples(st.just("clear"), st.sampled_from(UUIDS)),
), st.integers(0, 20_000)), min_size=10, max_size=80)
policies = st.builds(HealthPolicy, clean_checks_to_recover=st.integers(1, 4),
                     failed_reads_to_unknown=st.integers(1, 3),
                     xid_warn_quiet_ms=st.integers(0, 30_000),
                     job_fault_window_ms=st.integers(1, 30_000),
                     job_fault_repeats_to_warn=st.integers(1, 3))


def observe(tracker: HealthTracker, operation: tuple[Any, ...], now_ms: int) -> None:
    kind, *arguments = operation
    if kind == "sample":
        tracker.observe_sample(arguments[0], now_ms)
    elif kind == "event":
        tracker.observe_event(arguments[0], now_ms)
    elif kind == "gone":
        tracker.observe_gone(arguments[0], arguments[1], arguments[2], now_ms)
    elif kind == "unavailable":
        tracker.observe_unavailable(arguments[0], now_ms)
    elif kind == "wait_failed":
        tracker.observe_event_wait_failed(arguments[0], now_ms)
    elif kind == "wait_ok":
        tracker.observe_event_wait_ok(now_ms)
    elif kind == "devices":
        tracker.observe_devices(arguments[0], now_ms)
    else:
        tracker.clear(arguments[0])


def run(policy: HealthPolicy, devices: tuple[DeviceInfo, ...],
        script: list[tuple[tuple[Any, ...], int]]) -> list[Any]:
    tracker = HealthTracker(policy, devices)
    now_ms = 0
    history: list[Any] = []
    for operation, advance_ms in script:
        now_ms += advance_ms
        observe(tracker, operation, now_ms)
        history.append((tracker.verdicts(), tracker.take_changes(), tracker.take_job_faults()))
    return history


@settings(max_examples=100)
@given(policy=policies, script=operations)
def test_a_fail_passes_only_after_clean_checks(policy: HealthPolicy,
                                               script: list[tuple[tuple[Any, ...], int]]) -> None:
    tracker = HealthTracker(policy, DEVICES)
    previous = dict.fromkeys(UUIDS, HealthStatus.UNKNOWN)
    samples_since_fail: dict[str, int] = {}
    recoveries = 0
    now_ms = 0
    for operation, advance_ms in script:
        now_ms += advance_ms
        observe(tracker, operation, now_ms)
        if operation[0] == "clear":
            samples_since_fail.pop(operation[1], None)  # the operator's word, not evidence
        if operation[0] == "sample" and operation[1].uuid in samples_since_fail:
            samples_since_fail[operation[1].uuid] += 1
        for verdict in tracker.verdicts():
            if verdict.status is HealthStatus.FAIL and previous[verdict.uuid] is not \
                    HealthStatus.FAIL:
                samples_since_fail[verdict.uuid] = 0
            elif verdict.status is HealthStatus.PASS and verdict.uuid in samples_since_fail:
                assert samples_since_fail.pop(verdict.uuid) >= policy.clean_checks_to_recover
                recoveries += 1
            previous[verdict.uuid] = verdict.status
    target(recoveries, label="recoveries from FAIL")  # steer towards the interesting runs


@settings(max_examples=100)
@given(policy=policies, script=operations)
def test_same_observations_same_verdicts(policy: HealthPolicy,
                                         script: list[tuple[tuple[Any, ...], int]]) -> None:
    first = run(policy, DEVICES, script)
    assert run(policy, DEVICES[::-1], script) == first
    for verdicts, changes, _ in first:
        assert [verdict.uuid for verdict in verdicts] == sorted(UUIDS)
        assert set(changes) <= set(verdicts)
        for verdict in verdicts:
            assert len(verdict.reason) <= REASON_LENGTH_MAX
            worst = max((incident.status for incident in verdict.incidents),
                        key=SEVERITY.__getitem__, default=HealthStatus.PASS)
            assert verdict.status is worst
            assert (verdict.reason == "") == (verdict.status is HealthStatus.PASS)


@settings(max_examples=100)
@given(sample=samples(), event=events, code=st.integers(), message=st.text())
def test_observations_never_raise(sample: DeviceSample, event: GpuEvent, code: int,
                                  message: str) -> None:
    tracker = HealthTracker(HealthPolicy(), DEVICES)
    for now_ms in (0, 5_000, 5_000, 1_000):  # time may stand still or step back
        tracker.observe_sample(sample, now_ms)
        tracker.observe_event(event, now_ms)
    tracker.observe_gone(event.uuid, code, message, 2_000)
    tracker.observe_sample(sample, 3_000)
    assert len(tracker.verdicts()) == len(DEVICES)
