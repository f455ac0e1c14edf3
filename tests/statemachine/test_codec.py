"""The command, spec, query and reply codecs: every command round-trips, and every malformed
body is refused with the right code and a message naming the field; random input, and input
near a valid encoding, never raises anything but the decode error."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consensus.codec import pack, unpack
from statemachine import limits
from statemachine.codec import POD_FAILURE_POLICY_ABSENT, decode_command, encode_command
from statemachine.commands import (
    AckPodStarted,
    ApplyConfig,
    BindPod,
    ClearBad,
    Command,
    Cordon,
    Deregister,
    Drain,
    GpuLink,
    HealthReport,
    HealthStatus,
    Heartbeat,
    MarkBad,
    RegisterNode,
    ReleaseGroup,
    ReportHealth,
    ReportPodExit,
    SubmitGroup,
    Tick,
    Uncordon,
)
from statemachine.errors import Code, Rejection
from statemachine.query_codec import decode_answer, decode_query, encode_answer, encode_query
from statemachine.record_codec import DecodeError
from statemachine.result_codec import decode_result, encode_result
from statemachine.results import (
    ConfigApplied,
    Done,
    GroupPhase,
    GroupStatus,
    NodeRegistered,
    PodAssignment,
    PodBound,
    PodPhase,
    PodView,
    Result,
)
from statemachine.spec import FailurePolicy, PolicySpec
from tests.decoding import FUZZ, near, raises_only
from tests.statemachine.builders import gang, inventory, rack_spec, vc

EXAMPLES: list[Command] = [
    ApplyConfig(expected_version=3, spec=rack_spec(policy=PolicySpec(lease_ms=5))),
    RegisterNode(node="n0", boot_id="boot", gpus=inventory("n0")),
    RegisterNode(node="n0", boot_id="boot", gpus=tuple(
        replace(gpu, numa_node=1, mig_enabled=True) for gpu in inventory("n0")),
        links=(GpuLink(a=0, b=1, level=0, nvlinks=12),)),
    RegisterNode(node="n0", boot_id="boot", gpus=inventory("n0"), health=(
        HealthReport(uuid="GPU-n0-3", status=HealthStatus.FAIL, reason="missing"),
        HealthReport(uuid="GPU-n0-0", status=HealthStatus.PASS, reason=""))),
    Heartbeat(node="n0", incarnation=2),
    ReportHealth(node="n0", incarnation=2, reports=(
        HealthReport(uuid="GPU-1", status=HealthStatus.FAIL, reason="xid 79"),
        HealthReport(uuid="GPU-2", status=HealthStatus.UNKNOWN, reason=""))),
    AckPodStarted(node="n0", incarnation=1, group="g", pod_uid="p", gpu_uuids=("GPU-1",)),
    ReportPodExit(node="n0", incarnation=1, group="g", pod_uid="p", exit_code=-9),
    ReportPodExit(node="n0", incarnation=1, group="g", pod_uid="p", exit_code=255,
                  reason="lost: the agent restarted and the job was gone"),
    MarkBad(node="n0", gpu="GPU-1", reason="fan"),
    ClearBad(node="n0", gpu=""),
    Cordon(node="n0"),
    Uncordon(node="n0"),
    Drain(node="n0"),
    Deregister(node="n0", force=True),
    gang("g", "a", -1, (2, 4), (1, 1), model="A100", lazy=True),
    gang("g", "a", 3, (1, 8), on_pod_failure=FailurePolicy.KEEP),
    BindPod(group="g", member=1, pod_uid="p"),
    BindPod(group="g", member=1, pod_uid="p", command=("python3", "-c", "", "train.py")),
    ReleaseGroup(group="g", reason="done"),
    Tick(),
]


@pytest.mark.parametrize("command", EXAMPLES, ids=[type(c).__name__ for c in EXAMPLES])
def test_every_command_round_trips(command: Command) -> None:
    assert decode_command(encode_command(command)) == command


def body(**fields: Any) -> bytes:
    return pack({"v": 1, **fields})


SUBMIT = {"type": "submit_group", "group": "g", "vc": "a", "priority": 0,
          "members": [{"pods": 1, "gpus": 1}], "gpu_model": "", "lazy_preemption": False}


@pytest.mark.parametrize(
    ("data", "code", "message"),
    [
        (b"\xc1", Code.MALFORMED, "command: not valid msgpack"),
        (pack([1, 2]), Code.MALFORMED, "command: expected a map, got list"),
        (pack({"type": "tick"}), Code.UNSUPPORTED_VERSION, "command.v: None"),
        (pack({"v": 2, "type": "tick"}), Code.UNSUPPORTED_VERSION, "command.v: 2"),
        (body(), Code.MALFORMED, "command.type: missing or not a string"),
        (body(type="launch_missiles"), Code.UNKNOWN_COMMAND, "command.type: unknown command"),
        (body(type="tick", extra=1), Code.MALFORMED, "tick: unknown field 'extra'"),
        (body(type="cordon"), Code.MALFORMED, "cordon.node: missing"),
        (body(type="cordon", node=7), Code.MALFORMED, "cordon.node: expected a string, got int"),
        (body(type="cordon", node=""), Code.MALFORMED, "cordon.node: must not be empty"),
        (body(type="cordon", node="x" * 129), Code.MALFORMED,
         "cordon.node: 129 characters, more than 128"),
        (body(type="heartbeat", node="n", incarnation=-1), Code.MALFORMED,
         "heartbeat.incarnation: -1 is outside"),
        (body(type="heartbeat", node="n", incarnation=True), Code.MALFORMED,
         "heartbeat.incarnation: expected an integer, got bool"),
        (body(**{**SUBMIT, "priority": -2}), Code.MALFORMED,
         "submit_group.priority: -2 is outside [-1, 1000]"),
        (body(**{**SUBMIT, "members": [{"pods": 1, "gpus": 65}]}), Code.MALFORMED,
         "submit_group.members[0].gpus: 65 is outside [1, 64]"),
        (body(**{**SUBMIT, "members": [{"pods": 1}]}), Code.MALFORMED,
         "submit_group.members[0].gpus: missing"),
        (body(**{**SUBMIT, "members": [{}] * 17}), Code.MALFORMED,
         "submit_group.members: 17 items, more than 16"),
        (body(**{**SUBMIT, "on_pod_failure": "restart"}), Code.MALFORMED,
         "submit_group.on_pod_failure: 'restart' is not one of keep, release"),
        (body(**{**SUBMIT, "on_pod_failure": 1}), Code.MALFORMED,
         "submit_group.on_pod_failure: expected a string, got int"),
        (body(type="report_health", node="n", incarnation=1, reports=[
            {"uuid": "u", "status": "sick", "reason": ""}]), Code.MALFORMED,
         "report_health.reports[0].status: 'sick' is not one of pass, warn, fail, unknown"),
        (body(type="register_node", node="n", boot_id="b", gpus=[], health=[
            {"uuid": "u", "status": "fail", "reason": ""}] * 65), Code.MALFORMED,
         "register_node.health: 65 items, more than 64"),
        (body(type="register_node", node="n", boot_id="b", gpus=[], health=[
            {"uuid": "u", "status": "fail"}]), Code.MALFORMED,
         "register_node.health[0].reason: missing"),
        (body(type="mark_bad", node="n", gpu="", reason="r" * 257), Code.MALFORMED,
         "mark_bad.reason: 257 characters, more than 256"),
        (body(type="cordon", node="n", pad="x" * limits.COMMAND_BYTES_MAX), Code.TOO_LARGE,
         "command: 1048"),
        (body(type="bind_pod", group="g", member=0, pod_uid="p", command=[""]),
         Code.MALFORMED, "bind_pod.command[0]: must not be empty"),
        (body(type="bind_pod", group="g", member=0, pod_uid="p", command=["a", 3]),
         Code.MALFORMED, "bind_pod.command[1]: expected a string, got int"),
        (body(type="bind_pod", group="g", member=0, pod_uid="p", command=["a"] * 257),
         Code.MALFORMED, "bind_pod.command: 257 items, more than 256"),
        (body(type="bind_pod", group="g", member=0, pod_uid="p",
              command=["a", "é" * 5000, "b" * 7000]),
         Code.TOO_LARGE, "bind_pod.command: 17001 bytes, at most 16384"),
        (body(type="report_pod_exit", node="n", incarnation=1, group="g", pod_uid="p",
              exit_code=1, reason="r" * 257), Code.MALFORMED,
         "report_pod_exit.reason: 257 characters, more than 256"),
    ],
)
def test_malformed_bodies_are_refused_with_the_field_named(data: bytes, code: Code,
                                                           message: str) -> None:
    with pytest.raises(DecodeError) as caught:
        decode_command(data)
    assert caught.value.rejection.code is code
    assert caught.value.rejection.message.startswith(message), caught.value.rejection.message


def test_config_errors_name_the_nested_path() -> None:
    raw = encode_command(EXAMPLES[0])
    decoded = unpack(raw, bytes_max=1 << 20, what="test")
    decoded["spec"]["virtual_clusters"] = [{"name": "a", "on_failure": "keep", "quota": [
        {"chain": "A100-RACK", "cell_type": "A100-NODE", "count": "two"}]}]
    with pytest.raises(DecodeError, match=r"apply_config\.spec\.virtual_clusters\[0\]"
                                          r"\.quota\[0\]\.count: expected an integer"):
        decode_command(pack(decoded))


msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=12,
)


@given(st.binary(max_size=200))
def test_random_bytes_only_ever_give_a_decode_error(data: bytes) -> None:
    try:
        decode_command(data)
    except DecodeError as error:
        assert error.rejection.message


@given(st.sampled_from(sorted({
    "apply_config", "register_node", "heartbeat", "report_health", "ack_pod_started",
    "report_pod_exit", "mark_bad", "clear_bad", "cordon", "uncordon", "drain", "deregister",
    "submit_group", "bind_pod", "release_group", "tick"})),
    st.dictionaries(st.sampled_from(["node", "group", "incarnation", "gpus", "members", "spec",
                                     "reports", "reason", "gpu", "force", "priority", "vc",
                                     "pod_uid", "member", "boot_id", "expected_version",
                                     "gpu_model", "lazy_preemption", "exit_code",
                                     "gpu_uuids", "command", "links", "health"]),
                    msgpack_values, max_size=8))
def test_random_fields_only_ever_give_a_decode_error(kind: str, fields: dict[str, Any]) -> None:
    try:
        decode_command(body(type=kind, **fields))
    except DecodeError as error:
        assert error.rejection.code in (Code.MALFORMED, Code.TOO_LARGE)


RESULTS: list[Result] = [
    Rejection(code=Code.NO_FREE_SLOT, message="none left"),
    Done(note="ok"),
    ConfigApplied(version=2, downgraded=("a",), requeued=()),
    NodeRegistered(node="n0", incarnation=3, pods=(PodAssignment(
        group="g", pod_uid="p", gpu_uuids=("GPU-1",), env=(("A", "b"),),
        command=("run.sh", "--fast"), evicting=True),)),
    PodBound(group="g", member=0, index=1, pod_uid="p", node="n0", gpu_uuids=("GPU-1",),
             env=(("CUDA_VISIBLE_DEVICES", "GPU-1"),)),
    GroupStatus(group="g", vc="a", phase=GroupPhase.PREEMPTING, priority=3,
                effective_priority=3, chain="A100-RACK", pods=(PodView(
                    member=0, index=0, node="n0", gpu_indices=(0, 1), pod_uid="",
                    phase=PodPhase.UNBOUND), PodView(
                    member=0, index=1, node="n0", gpu_indices=(2,), pod_uid="p1",
                    phase=PodPhase.EXITED, exit_code=255, exit_reason="lost")),
                victims=("v",), evicting="",
                why_pending="", failures=("GPU-1: failed: x",)),
]


@pytest.mark.parametrize("result", RESULTS, ids=[type(r).__name__ for r in RESULTS])
def test_replies_round_trip(result: Result) -> None:
    assert decode_result(encode_result(result)) == result


def test_the_spec_keeps_its_tenants_in_order() -> None:
    spec = rack_spec(quota=(vc("z", ("A100-RACK", "A100-NODE", 1)), vc("a")))
    decoded = decode_command(encode_command(ApplyConfig(expected_version=0, spec=spec)))
    assert isinstance(decoded, ApplyConfig) and decoded.spec == spec


@pytest.mark.parametrize("reply", [
    {"ok": True, "type": "config_applied", "version": 2, "downgraded": None, "requeued": []},
    {"ok": True, "type": "pod_bound", "group": "g", "member": 0, "index": 1, "pod_uid": "p",
     "node": "n0", "gpu_uuids": ["GPU-1"], "env": None},
    {"ok": True, "type": "pod_bound", "group": "g", "member": 0, "index": 1, "pod_uid": "p",
     "node": "n0", "gpu_uuids": ["GPU-1"], "env": [["A"]]},
    {"ok": True, "type": "node_registered", "node": "n0", "incarnation": 1, "pods": [7]},
    {"ok": True, "type": "group_status", "group": "g", "vc": "a", "phase": "nope",
     "priority": 0, "effective_priority": 0, "chain": "", "pods": [], "victims": [],
     "evicting": "", "why_pending": "", "failures": [], "failures_omitted": 0},
    {"ok": True, "type": "no_such_result"},
    {"ok": True, "type": ["not", "a", "name"]},
], ids=["downgraded_none", "env_none", "env_pair_short", "pods_int", "phase_unknown",
        "type_unknown", "type_not_text"])
def test_a_malformed_reply_is_a_decode_error(reply: dict[str, Any]) -> None:
    """A client (the agent, a scheduler, the CLI) decodes every reply its store hands back
    (statemachine/store.py): a reply of another shape, from a replica of another version or
    corrupted, had raised TypeError or KeyError out of the nested fields."""
    with pytest.raises(DecodeError) as refused:
        decode_result(pack(reply))
    assert refused.value.rejection.code is Code.MALFORMED


# --- fuzzing: inputs near valid encodings give only the decode error ---------------------------

QUERIES = [encode_query("group", group="g"),
           encode_query("groups", vc="", phase="", after="", limit=5),
           encode_query("nodes", after="", limit=5), encode_query("node", node="n0"),
           encode_query("effects", after=0, node="n0", limit=5),
           encode_query("effects", after=0, node=None, limit=5),
           encode_query("cluster"), encode_query("stats")]


@FUZZ
@given(near(st.sampled_from(EXAMPLES).map(encode_command)))
def test_inputs_near_a_command_only_ever_give_a_decode_error(data: bytes) -> None:
    raises_only(decode_command, data, DecodeError)


@FUZZ
@given(near(st.sampled_from(QUERIES)))
def test_inputs_near_a_query_only_ever_give_a_decode_error(data: bytes) -> None:
    raises_only(decode_query, data, DecodeError)


@FUZZ
@given(near(st.sampled_from(RESULTS).map(encode_result)))
def test_inputs_near_a_reply_only_ever_give_a_decode_error(data: bytes) -> None:
    raises_only(decode_result, data, DecodeError)


@FUZZ
@given(near(st.sampled_from([
    encode_answer({"type": "node", "node": {"node": "n0"}}),
    encode_answer(Rejection(code=Code.MALFORMED, message="m"))])))
def test_inputs_near_an_answer_only_ever_give_its_refusals(data: bytes) -> None:
    """decode_answer refuses with DecodeError, or ValueError for a map without `ok`."""
    raises_only(decode_answer, data, DecodeError, ValueError)


def test_a_registration_without_health_encodes_as_before() -> None:
    """The health field is optional: left out when empty, so the bytes of a registration that
    carries none are those of one from before the field existed."""
    plain = RegisterNode(node="n0", boot_id="boot", gpus=inventory("n0"))
    assert "health" not in unpack(encode_command(plain), bytes_max=1 << 20, what="test")


@given(policy=st.sampled_from(tuple(FailurePolicy)), lazy=st.booleans(),
       priority=st.integers(limits.OPPORTUNISTIC_PRIORITY, limits.PRIORITY_MAX))
def test_a_submissions_pod_failure_policy_round_trips(policy: FailurePolicy, lazy: bool,
                                                      priority: int) -> None:
    command = gang("g", "a", priority, (2, 4), lazy=lazy, on_pod_failure=policy)
    data = encode_command(command)
    assert unpack(data, bytes_max=1 << 20, what="test")["on_pod_failure"] == policy.value
    assert decode_command(data) == command


def test_a_submission_without_a_pod_failure_policy_is_read_as_before_it_existed() -> None:
    """A body from before the field (an old client's, an old log entry's) keeps the
    semantics it was applied under then: a failed pod leaves the gang running (KEEP), as a
    gang restored from a snapshot of that time does; a new submission says RELEASE."""
    decoded = decode_command(body(**SUBMIT))
    assert isinstance(decoded, SubmitGroup)
    assert decoded.on_pod_failure is POD_FAILURE_POLICY_ABSENT is None  # KEEP, unannounced
    assert decode_command(encode_command(decoded)) == decoded  # and re-encoded without it
    assert gang("g", "a", 0, (1, 1)).on_pod_failure is FailurePolicy.RELEASE
