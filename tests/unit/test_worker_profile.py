"""Worker profiles on the monitor side: stage classification, the summary
document and its verdict (table-tested), the hint that quotes one, the
client's refusals, and the worker-side sampler on a real thread."""

from __future__ import annotations

import threading
import time

import pytest

from dlwatch import wire
from dlwatch.collect.control import ProfileError, request_worker_profile
from dlwatch.diagnose import evaluate
from dlwatch.diagnose.worker_profile import analyse, classify, package_of, summary, summary_lines
from tests.unit.test_diagnose_rules import cpu_bound_loader, one
from tests.unit.test_profile import FakeJob, server_hello

SP = "/venv/lib/python3.11/site-packages"
FETCH = ("_MapDatasetFetcher.fetch", f"{SP}/torch/utils/data/_utils/fetch.py", 46)
GETITEM = ("ImageFolder.__getitem__", "/home/me/train.py", 30)
V1 = f"{SP}/torchvision/transforms/transforms.py"
V2 = f"{SP}/torchvision/transforms/v2/_geometry.py"
CALL = ("Module._call_impl", f"{SP}/torch/nn/modules/module.py", 1520)
PIL_IF = f"{SP}/PIL/ImageFile.py"
V2T = f"{SP}/torchvision/transforms/v2/_transform.py"
AL = f"{SP}/albumentations"
COLLATE = f"{SP}/torch/utils/data/_utils/collate.py"


@pytest.mark.parametrize(
    "frames, leaf, expected",
    [
        # PIL decoding, whoever triggers it
        ([GETITEM, ("pil_loader", "/home/me/train.py", 10), ("ImageFile.load", PIL_IF, 200)],
         "n, err_code = decoder.decode(b)", ("decode", "image decode")),
        # ... but its chunk reads are the file system's
        ([GETITEM, ("ImageFile.load", PIL_IF, 200)], "s = read(self.decodermaxblock)",
         ("read", "file read")),
        ([GETITEM], "data = open(path, 'rb').read()", ("read", "file read")),
        ([GETITEM, ("load", f"{SP}/numpy/lib/npyio.py", 300)], "magic = fid.read(N)", ("read", "file read")),
        ([GETITEM], "img = cv2.imread(path)", ("decode", "image decode")),
        ([GETITEM, ("decode_jpeg", f"{SP}/torchvision/io/image.py", 150)],
         "return torch.ops.image.decode_jpeg(x)", ("decode", "image decode")),
        # torchvision v1: the class under Compose and nn.Module's call
        ([GETITEM, ("Compose.__call__", V1, 90), CALL, ("RandomResizedCrop.forward", V1, 950),
          ("resized_crop", f"{SP}/torchvision/transforms/functional.py", 600),
          ("Image.resize", f"{SP}/PIL/Image.py", 2100)], "return self._new(self.im.resize(size))",
         ("transform", "transform RandomResizedCrop")),
        # torchvision v2: the base Transform.forward is a container
        ([GETITEM, ("Compose.forward", V2, 50), CALL, ("Transform.forward", V2T, 40),
          ("ColorJitter.transform", V2, 200)], "x = F.adjust_hue(x)", ("transform", "transform ColorJitter")),
        ([GETITEM, ("Compose.__call__", f"{AL}/core/composition.py", 200),
          ("BasicTransform.__call__", f"{AL}/core/transforms_interface.py", 100),
          ("HorizontalFlip.apply", f"{AL}/augmentations/transforms.py", 50)], "return hflip(img)",
         ("transform", "transform HorizontalFlip")),
        ([GETITEM, ("PreTrainedTokenizerBase.__call__", f"{SP}/transformers/tokenization_utils.py", 2800)],
         "return self._call_one(text)", ("tokenize", "tokenization")),
        ([FETCH, ("default_collate", COLLATE, 340), ("collate_tensor_fn", COLLATE, 246)],
         "return torch.stack(batch, 0)",
         ("collate", "collate")),
        ([GETITEM, ("Image.rotate", f"{SP}/PIL/Image.py", 2300)], "return self.transform(...)",
         ("image-ops", "PIL Image.rotate")),
        # the user's own steps: what __getitem__ calls, not the helper below it
        ([FETCH, GETITEM, ("decode_like_stage", "/home/me/train.py", 40), ("_spin", "/home/me/train.py", 20)],
         "while time.thread_time() < end:", ("code", "decode_like_stage")),
        ([GETITEM], "return torch.full((4,), float(i))", ("code", "ImageFolder.__getitem__")),
        ([("Thread.start", "/usr/lib/python3.11/threading.py", 945)], "self._started.wait()",
         ("other", "stdlib")),
    ],
)  # fmt: skip
def test_classify(frames, leaf, expected):
    assert classify(frames, leaf) == expected


def test_package_of():
    assert package_of(f"{SP}/PIL/ImageFile.py") == "PIL"
    assert package_of("/usr/lib/python3/dist-packages/cv2.py") == "cv2"
    assert package_of("/usr/lib/python3.12/json/decoder.py") == "stdlib"
    assert package_of("/home/me/project/data.py") == ""


def result(stacks, frames, src=None, workers=None, other=0):
    return {
        "loader": {"id": 0, "name": "loader 0 (ImageFolder)"},
        "seconds": 5.0,
        "hz": 100,
        "frames": frames,
        "stacks": stacks,
        "src": src or {},
        "other": other,
        "workers": workers
        or [{"pid": 11, "id": 0, "reported": True, "samples": 500, "in_fetch": 400, "wall_s": 5.0}],
    }


PIL_FRAMES = [
    list(FETCH),
    list(GETITEM),
    ["pil_loader", "/home/me/train.py", 10],
    ["ImageFile.load", f"{SP}/PIL/ImageFile.py", 200],
    ["Compose.__call__", V1, 90],
    ["RandomResizedCrop.forward", V1, 950],
    ["ToTensor.__call__", V1, 130],
]


def test_summary_shares_functions_and_verdict():
    stacks = [
        [60, [0, 1, 2, 3], 250],  # decode
        [10, [0, 1, 2, 3], 240],  # read inside load()
        [20, [0, 1, 4, 5], 960],
        [10, [0, 1, 4, 6], 135],
    ]
    src = {"3:250": "n, err_code = decoder.decode(b)", "3:240": "s = read(self.decodermaxblock)"}
    workers = [
        {"pid": 11, "id": 0, "reported": True, "samples": 60, "in_fetch": 50, "wall_s": 5.0}
        | {"sampler_cpu_s": 0.05},
        {"pid": 12, "id": 1, "reported": False, "note": "killed or exited before it could report"},
    ]
    doc = summary(42, result(stacks, PIL_FRAMES, src, workers), None)
    stages = {s["stage"]: s["share"] for s in doc["stages"]}
    assert stages == {
        "image decode": 0.6,
        "transform RandomResizedCrop": 0.2,
        "file read": 0.1,
        "transform ToTensor": 0.1,
    }
    fns = {f["function"]: (f["share"], f["self_share"]) for f in doc["worker_functions"]}
    assert fns["ImageFolder.__getitem__"] == (1.0, 0.0)
    assert fns["ImageFile.load"] == (0.7, 0.7) and fns["pil_loader"] == (0.7, 0.0)
    assert "_MapDatasetFetcher.fetch" not in fns  # torch's fetch is always 100 %: left out
    top = doc["worker_functions"][0]
    assert top["file"] == "/home/me/train.py" and top["line"] == 30
    assert doc["verdict"] == "decode-bound" and "60%" in doc["reason"] and "draft()" in doc["suggestion"]
    assert doc["samples"] == 100 and doc["workers_lost"] == 1 and doc["sampler_cpu_percent_max"] == 1.0
    text = "\n".join(summary_lines(doc))
    assert "verdict: decode-bound" in text and "killed or exited" in text and "60.0%  image decode" in text


@pytest.mark.parametrize(
    "stacks, verdict, words",
    [
        ([[40, [0, 1, 4, 5], 960], [30, [0, 1, 4, 6], 135], [30, [0, 1, 2, 3], 250]], "transform-bound",
         ("transforms (2; the largest transform RandomResizedCrop at 40%): 70%", "crop before resiz")),
        ([[80, [0, 1, 2, 3], 240], [20, [0, 1, 4, 5], 960]], "read-bound", ("file read: 80%", "local disk")),
        ([[25, [0, 1, 2, 3], 250], [25, [0, 1, 2, 3], 240], [25, [0, 1, 4, 5], 960], [25, [0, 1], 31]],
         "spread", ("no stage holds 30%",)),
    ],
)  # fmt: skip
def test_verdicts(stacks, verdict, words):
    src = {"3:250": "decoder.decode(b)", "3:240": "s = read(self.decodermaxblock)"}
    doc = summary(1, result(stacks, PIL_FRAMES, src), None)
    assert doc["verdict"] == verdict, doc
    for w in words:
        assert w in doc["reason"] + " " + doc["suggestion"], (w, doc["reason"])


def test_collate_and_tokenization_verdicts():
    frames = [
        list(FETCH),
        ["default_collate", f"{SP}/torch/utils/data/_utils/collate.py", 340],
        list(GETITEM),
        ["PreTrainedTokenizerFast._batch_encode_plus", f"{SP}/transformers/tokenization_utils_fast.py", 500],
    ]
    collate = summary(1, result([[70, [0, 1], 350], [30, [0, 2, 3], 510]], frames), None)
    assert collate["verdict"] == "collate-bound" and "__getitems__" in collate["suggestion"]
    tok = summary(1, result([[30, [0, 1], 350], [70, [0, 2, 3], 510]], frames), None)
    assert tok["verdict"] == "tokenization-bound" and "tokenize once" in tok["suggestion"]


@pytest.mark.parametrize(
    "res",
    [
        {"stacks": "x"},
        {"stacks": [[1, [7], 3]], "frames": []},
        {"stacks": [["a", None]], "frames": [None]},
        {"frames": [None], "stacks": [[5, [0], 1]], "workers": [{"pid": "x"}]},
    ],
)
def test_malformed_results_never_raise(res):
    doc = summary(1, res, None)
    assert doc["verdict"] is None or doc["verdict"] == "spread"
    summary_lines(doc)


def test_an_error_is_the_whole_answer():
    doc = summary(5, None, "no worker fetched a batch")
    assert (
        doc["error"]
        and doc["stages"] == []
        and summary_lines(doc) == ["PID 5: worker profile failed: no worker fetched a batch"]
    )


def test_analyse_counts_unresolved_and_overflow_as_other():
    a = analyse({"frames": [list(GETITEM)], "stacks": [[30, [0], 31], [10, [9], 1]], "other": 10})
    assert a["samples"] == 50 and {s["stage"]: s["share"] for s in a["stages"]}["other"] == 0.4


def test_cpu_bound_preprocessing_suggests_a_worker_profile_then_quotes_it():
    from tests.unit.test_diagnose_rules import ids

    s = one(cpu_bound_loader(), usable=3.0)
    before = next(h for h in evaluate(s) if h["id"] == "cpu-bound-preprocessing")
    assert "dlwatch profile --workers" in before["suggestion"]
    assert before["evidence"]["worker_profile"] is None
    doc = summary(1, result([[70, [0, 1, 2, 3], 250], [30, [0, 1, 4, 5], 960]], PIL_FRAMES), None)
    from dlwatch.diagnose.worker_profile import brief

    job = s["jobs"][0]
    job["worker_profile"] = brief(doc, 0.0) | {"loader_id": job["loaders"][0]["id"]}
    after = next(h for h in evaluate(s) if h["id"] == "cpu-bound-preprocessing")
    assert "70 % of the workers' time in image decode (decode-bound)" in after["message"]
    assert "draft()" in after["suggestion"] and after["evidence"]["worker_profile"]["top_share"] == 0.7
    # A profile of another loader is not quoted.
    job["worker_profile"]["loader_id"] = 99
    other = next(h for h in evaluate(s) if h["id"] == "cpu-bound-preprocessing")
    assert "worker profile" not in other["message"] and "cpu-bound-preprocessing" in ids(evaluate(s))


def test_a_job_whose_probe_predates_worker_profiles_is_not_supported():
    job = FakeJob(server_hello(features=["profile"]))
    try:
        with pytest.raises(ProfileError, match="not supported") as e:
            request_worker_profile(job.pid, 2.0, directory=job.dir)
        assert e.value.kind == "unsupported" and "predates worker profiles" in str(e.value)
    finally:
        job.close()


@pytest.mark.parametrize("seconds, hz", [(0, None), (61, None), (5, 0), (5, 1001)])
def test_request_bounds(seconds, hz):
    with pytest.raises(ProfileError) as e:
        request_worker_profile(1, seconds, hz, directory="/nonexistent")
    assert e.value.kind == "usage"
    with pytest.raises(wire.WireError):
        wire.validate({"type": "worker_profile", "seconds": seconds, "hz": hz if hz is not None else 0})


def _user_stage(n):
    end = time.thread_time() + n
    while time.thread_time() < end:
        pass


def test_sampler_counts_only_inside_the_fetch_and_writes_a_private_file(tmp_path, monkeypatch):
    import json
    import os
    import stat

    from dlwatch.probe import worker, worker_sampler

    monkeypatch.setenv("DLWATCH_DIR", str(tmp_path))
    slots = worker.make_slots(1)
    row, frow = worker.as_int64_view(slots), worker.as_float64_view(slots)
    fetch = worker._timed(lambda self, idx: _user_stage(0.01), row, frow, 0)
    row[worker.BURST_HZ] = 200
    frow[worker.BURST_END_S] = time.perf_counter() + 0.6
    row[worker.BURST_GEN] = 77
    t_end = time.perf_counter() + 0.7
    while time.perf_counter() < t_end:
        fetch(None, [0])
        time.sleep(0.01)  # idle between fetches: not counted
    path = worker_sampler.result_path(str(tmp_path), 77, os.getpid())
    for _ in range(100):
        if os.path.exists(path):
            break
        time.sleep(0.02)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and row[worker.BURST_ACK] == 77
    doc = json.load(open(path))
    assert 0.25 < doc["in_fetch"] / doc["samples"] < 0.75, doc  # half the time inside fetches
    names = {doc["frames"][i][0] for _n, idx, _l in doc["stacks"] for i in idx}
    assert "_user_stage" in names and "fetch" not in names
    assert not [t for t in threading.enumerate() if t.name == "dlwatch-worker-sampler"]


def test_w_key_shows_the_worker_profile_and_help_lists_it():
    import asyncio

    from dlwatch.tui.keys import help_rows
    from dlwatch.tui.profile import ProfileScreen
    from dlwatch.tui.sources import StaticSource
    from tests import tui_fixtures as F
    from tests.tui_fixtures import make_app
    from tests.unit.test_tui import FAST, open_profile, wait_until

    rows = dict(help_rows(False)[0])
    assert rows["W"] == "profile the DataLoader workers for 5 s: which stage of __getitem__ costs what"
    go = threading.Event()
    doc = summary(4242, result([[70, [0, 1, 2, 3], 250], [30, [0, 1, 4, 5], 960]], PIL_FRAMES), None)

    def runner(pid, on_status, cancelled):
        on_status({"type": "profile_status", "state": "running", "message": "2 workers sampling, 3 s left"})
        go.wait(5)
        return doc

    async def main():
        app = make_app(StaticSource([F.data_bound()]), interval=FAST, worker_profiler=runner)
        async with app.run_test(size=(100, 30)) as pilot:
            text = await open_profile(pilot, app, "W")
            await wait_until(pilot, lambda: "2 workers sampling" in text())
            go.set()
            await wait_until(pilot, lambda: "decode-bound" in text())
            assert "worker profile of PID 4242" in text() and "70.0%  image decode" in text()
            await pilot.press("escape")
            await wait_until(pilot, lambda: not isinstance(app.screen, ProfileScreen))

    asyncio.run(main())


def _burst_the_worker_outlives_not(gen: int) -> None:
    """A burst started in this process by a fetch, with a deadline 30 s off
    (the worker exits long before); returns once the sampler runs."""
    from dlwatch.probe import worker

    slots = worker.make_slots(1)
    row, frow = worker.as_int64_view(slots), worker.as_float64_view(slots)
    fetch = worker._timed(lambda self, idx: _user_stage(0.005), row, frow, 0)
    row[worker.BURST_HZ] = 50
    frow[worker.BURST_END_S] = time.perf_counter() + 30
    row[worker.BURST_GEN] = gen
    fetch(None, [0])
    for _ in range(200):
        if row[worker.BURST_ACK] == gen:
            break
        time.sleep(0.01)


def test_a_worker_exiting_mid_burst_reports_the_samplers_cpu_not_the_fetch_threads(tmp_path, monkeypatch):
    """A non-persistent worker exits before the deadline: the multiprocessing
    finalizer writes the result from the worker's main thread, which ran the
    fetches. The cost it reports must be the sampler thread's own CPU (a
    verifier saw "at most 96.37 % of a core": the fetch thread's)."""
    import json
    import os
    from multiprocessing import util

    from dlwatch.probe import worker_sampler

    monkeypatch.setenv("DLWATCH_DIR", str(tmp_path))
    _burst_the_worker_outlives_not(78)
    burned0 = time.thread_time()
    _user_stage(0.4)  # this (the "fetch") thread's CPU, not the sampler's
    burned = time.thread_time() - burned0
    util._run_finalizers(100)  # what the worker's exit runs: the sampler's exit hook
    path = worker_sampler.result_path(str(tmp_path), 78, os.getpid())
    doc = json.load(open(path))
    cost = doc["sampler_cpu_s"]
    assert cost is not None and cost < burned / 4, (cost, burned)
    for _ in range(100):
        if not [t for t in threading.enumerate() if t.name == "dlwatch-worker-sampler"]:
            break
        time.sleep(0.02)
    assert not [t for t in threading.enumerate() if t.name == "dlwatch-worker-sampler"]


def test_the_exit_hook_returns_only_once_the_result_is_written(tmp_path, monkeypatch):
    """The sampler thread and the exit finalizer race to write; the finalizer
    must not return while the sampler thread is still writing, or the worker
    exits with no file (CI: FileNotFoundError right after _run_finalizers)."""
    import os
    from multiprocessing import util

    from dlwatch.probe import worker_sampler

    monkeypatch.setenv("DLWATCH_DIR", str(tmp_path))
    slow_document = worker_sampler._Sampler.document

    def document(self):
        if threading.current_thread().name == "dlwatch-worker-sampler":
            time.sleep(0.5)  # the sampler thread got the write first, and is slow at it
        return slow_document(self)

    monkeypatch.setattr(worker_sampler._Sampler, "document", document)
    _burst_the_worker_outlives_not(79)
    util._run_finalizers(100)
    assert os.path.exists(worker_sampler.result_path(str(tmp_path), 79, os.getpid()))


@pytest.mark.parametrize(
    ("file", "says"),
    [
        ("/home/me/train.py", "it is your own code"),
        # `dlwatch demo`: a new user was told to optimise dlwatch's synthetic dataset.
        ("/home/me/dlwatch/dlwatch/demo/train.py", "dlwatch's demo dataset"),  # README: `pip install -e .`
    ],
)
def test_code_bound_names_whose_code_it_is(file, says):
    frames = [list(FETCH), ["_SyntheticImageSource.sample", file, 40]]
    doc = summary(1, result([[100, [0, 1], 41]], frames), None)
    assert doc["verdict"] == "code-bound" and says in doc["suggestion"], doc
