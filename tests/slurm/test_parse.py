"""The Slurm parsers, table-driven, on output captured from a real Slurm 22.05 (fixtures/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from providers.slurm.parse import (
    Gres,
    Outcome,
    SlurmParseError,
    exit_status,
    expand_hostlist,
    gpus_in,
    outcome,
    parse_exit_code,
    parse_gres,
    parse_job_line,
    parse_jobcomp,
    parse_sacct,
    parse_sinfo,
    parse_squeue,
)

FIX = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("text, want", [
    ("gpu:a100:4", [Gres("gpu", "a100", 4)]),
    ("gpu:4", [Gres("gpu", None, 4)]),
    ("gpu", [Gres("gpu", None, 1)]),
    ("gpu:a100:4(S:0-1)", [Gres("gpu", "a100", 4)]),
    ("gpu:a100:3(IDX:0-2)", [Gres("gpu", "a100", 3)]),
    ("gpu:a100:2(IDX:0,2)", [Gres("gpu", "a100", 2)]),
    ("gpu:a100:0(IDX:N/A)", [Gres("gpu", "a100", 0)]),
    ("gres:gpu:a100:2", [Gres("gpu", "a100", 2)]),  # squeue tres-per-node
    ("gres/gpu:a100=2", [Gres("gpu", "a100", 2)]),  # TRES form
    ("gres/gpu=2", [Gres("gpu", None, 2)]),
    ("gpu:a100:4,gpu:v100:2(S:1),mps:100", [Gres("gpu", "a100", 4), Gres("gpu", "v100", 2),
                                            Gres("mps", None, 100)]),
    ("gpu:a100_80g:8", [Gres("gpu", "a100_80g", 8)]),
    ("shard:1K", [Gres("shard", None, 1024)]),
    ("(null)", []), ("N/A", []), ("", []),
])
def test_gres_strings(text, want):
    assert parse_gres(text) == want


@pytest.mark.parametrize("bad", ["gpu:a100:4:extra", "gpu:a100:x(IDX", ":4"])
def test_bad_gres_names_the_text(bad):
    with pytest.raises(SlurmParseError, match="GRES"):
        parse_gres(bad)


@pytest.mark.parametrize("text, typ, n", [
    ("gpu:a100:4,gpu:v100:2", "a100", 4), ("gpu:a100:4,gpu:v100:2", "A100", 4),
    ("gpu:a100:4,gpu:v100:2", None, 6), ("gpu:4", "a100", 0), ("gpu:4", None, 4),
    ("mps:100", None, 0),
])
def test_gpus_of_a_type(text, typ, n):
    assert gpus_in(parse_gres(text), typ) == n


@pytest.mark.parametrize("text, want", [
    ("vm", ["vm"]),
    ("n[01-03,07]", ["n01", "n02", "n03", "n07"]),
    ("n[8-10]", ["n8", "n9", "n10"]),
    ("gpu5,n[1-2]", ["gpu5", "n1", "n2"]),
    ("r[1-2]-n[1-2]", ["r1-n1", "r1-n2", "r2-n1", "r2-n2"]),
    ("", []), ("(null)", []), ("None assigned", []),
])
def test_host_lists(text, want):
    assert expand_hostlist(text) == want


@pytest.mark.parametrize("bad", ["n[1-3", "n1-3]", "n[3-1]", "n[a-b]"])
def test_bad_host_lists(bad):
    with pytest.raises(SlurmParseError, match="host list"):
        expand_hostlist(bad)


def test_sinfo_captured_states_usable_and_gpus():
    lines = (FIX / "sinfo.txt").read_text().splitlines()
    want = [  # state, usable, GPUs, in use
        ("idle", True, 4, 0), ("mixed", True, 4, 3), ("draining", False, 4, 1), ("drained", False, 4, 0)]
    for line, (state, usable, gpus, used) in zip(lines, want, strict=True):
        (n,) = parse_sinfo(line)
        assert (n.name, n.state, n.usable, n.gpus("a100"), n.gpus_used("a100")) == ("vm", state, usable,
                                                                                     gpus, used)


@pytest.mark.parametrize("state, usable", [
    ("idle", True), ("mixed", True), ("allocated", True), ("completing", True),
    ("idle*", False), ("down*", False), ("down", False), ("drained*", False), ("fail", False),
    ("maint", False), ("idle~", False), ("mixed@", False), ("reserved", False), ("inval", False),
])
def test_node_states(state, usable):
    (n,) = parse_sinfo(f"n1|{state}|gpu:a100:4|gpu:a100:0(IDX:N/A)|")
    assert n.usable is usable


def test_sinfo_expands_node_ranges_and_keeps_one_line_per_node():
    nodes = parse_sinfo("n[1-2]|mixed|gpu:h100:8(S:0-1)|gpu:h100:3(IDX:0-2)|\n"
                        "n1|mixed|gpu:h100:8|gpu:h100:3|\n")
    assert [(n.name, n.gpus("h100"), n.gpus_used("h100")) for n in nodes] == [("n1", 8, 3), ("n2", 8, 3)]


def test_squeue_captured_jobs():
    jobs = {j.job_id: j for j in parse_squeue((FIX / "squeue.txt").read_text())}
    j = jobs["32"]
    assert (j.name, j.state, j.nodes, j.gres_per_node, j.restarts) == (
        "onepool-op-abc-a7", "RUNNING", ("vm",), (Gres("gpu", "a100", 3),), 0)
    assert j.comment == "onepool:broker=op-abc,job=3,attempt=7,number=1,pool=slurm-a100"
    assert jobs["33"].nodes == () and jobs["33"].reason.startswith("ReqNodeNotAvail")
    assert jobs["8"].restarts == 1 and jobs["8"].state == "PENDING"
    assert jobs["20"].comment == ""
    assert jobs["2"].comment.endswith("long enough to check")  # spaces kept, nothing truncated
    assert len(jobs["2"].name) == 59


@pytest.mark.parametrize("job, want", [  # captured squeue states -> onepool's reading
    ("32", Outcome.RUNNING), ("33", Outcome.QUEUED), ("8", Outcome.REQUEUED),
    ("7", Outcome.NODE_FAILURE), ("5", Outcome.CANCELLED), ("4", Outcome.FAILED),
    ("10", Outcome.FAILED), ("18", Outcome.DONE), ("19", Outcome.PREEMPTED),
])
def test_squeue_states_map_to_outcomes(job, want):
    j = {j.job_id: j for j in parse_squeue((FIX / "squeue.txt").read_text())}[job]
    assert outcome(j.state, j.restarts) == want


@pytest.mark.parametrize("state, restarts, code, want", [
    ("COMPLETED", 0, 0, Outcome.DONE), ("COMPLETED", 0, 3, Outcome.FAILED),
    ("COMPLETING", 0, None, Outcome.RUNNING), ("SUSPENDED", 0, None, Outcome.RUNNING),
    ("CONFIGURING", 0, None, Outcome.RUNNING), ("PENDING", 0, None, Outcome.QUEUED),
    ("RUNNING", 1, None, Outcome.REQUEUED), ("REQUEUED", 0, None, Outcome.REQUEUED),
    ("REQUEUE_HOLD", 0, None, Outcome.REQUEUED), ("OUT_OF_MEMORY", 0, 0, Outcome.FAILED),
    ("BOOT_FAIL", 0, 0, Outcome.FAILED), ("DEADLINE", 0, 0, Outcome.FAILED),
    ("TIMEOUT", 0, 0, Outcome.TIME_LIMIT), ("CANCELLED by 0", 0, 0, Outcome.CANCELLED),
    ("CANCELLED+", 0, 0, Outcome.CANCELLED), ("PREEMPTED", 0, 143, Outcome.PREEMPTED),
    ("NODE_FAIL", 0, 0, Outcome.NODE_FAILURE),
])
def test_states_map_to_outcomes(state, restarts, code, want):
    assert outcome(state, restarts, code) == want


def test_unknown_state_is_an_error_naming_it():
    with pytest.raises(SlurmParseError, match="WIBBLE"):
        outcome("WIBBLE")


def test_scontrol_show_job_captured_lines():
    recs = [parse_job_line(line) for line in (FIX / "scontrol_job.txt").read_text().splitlines()]
    got = [(r.state, r.exit_code, r.signal, r.restarts, exit_status(r.exit_code, r.signal)) for r in recs]
    assert got == [("COMPLETED", 0, 0, 0, 0), ("PREEMPTED", 143, 0, 0, 143),
                   ("FAILED", 0, 53, 0, 181), ("RUNNING", 0, 0, 0, 0)]
    assert recs[0].name.startswith("onepool-op-")


def test_jobcomp_log_keeps_the_newest_record_of_a_requeued_job():
    text = (FIX / "jobcomp.log").read_text()
    rq = parse_jobcomp(text, "8")  # requeued once (a PENDING line), then cancelled
    assert rq is not None and rq.state == "CANCELLED"
    want = {"1": ("PREEMPTED", 0), "4": ("FAILED", 143), "6": ("FAILED", 7), "5": ("CANCELLED", 0),
            "7": ("NODE_FAIL", 0), "9": ("COMPLETED", 0)}
    for jid, (state, code) in want.items():
        r = parse_jobcomp(text, jid)
        assert r is not None and (r.state, r.exit_code) == (state, code), jid
    assert parse_jobcomp(text, "999") is None
    assert parse_jobcomp(text, "1").name == "onepool-test-a1"


def test_sacct_parsable_lines_with_requeues():
    # sacct -n -P -X -D -o JobIDRaw,JobName,State,ExitCode,NodeList (the documented format;
    # accounting is off on the test cluster, so these lines are written after Slurm's docs)
    text = ("41|onepool-op-x-a3|PREEMPTED|0:15|n01\n41|onepool-op-x-a3|RUNNING|0:0|n02\n"
            "42|other|CANCELLED by 1000|0:15|n01\n43|x|COMPLETED|0:0|n[01-02]\n")
    recs = parse_sacct(text)
    assert [(r.job_id, r.state, r.restarts, exit_status(r.exit_code, r.signal)) for r in recs] == [
        ("41", "PREEMPTED", 0, 143), ("41", "RUNNING", 1, 0), ("42", "CANCELLED", 0, 143),
        ("43", "COMPLETED", 0, 0)]
    assert outcome(recs[1].state, recs[1].restarts) == Outcome.REQUEUED


@pytest.mark.parametrize("text, want", [("0:0", (0, 0)), ("143:0", (143, 0)), ("0:15", (0, 15)),
                                        ("", (None, None))])
def test_exit_codes(text, want):
    assert parse_exit_code(text) == want


def test_bad_lines_are_errors_that_show_the_line():
    with pytest.raises(SlurmParseError, match="expected 4"):
        parse_sinfo("vm|idle\n")
    with pytest.raises(SlurmParseError, match="expected 8"):
        parse_squeue("1|x|RUNNING\n")
    with pytest.raises(SlurmParseError, match="JobId"):
        parse_job_line("slurm_load_jobs error: Invalid job id specified")
    with pytest.raises(SlurmParseError, match="CODE:SIGNAL"):
        parse_exit_code("143")
